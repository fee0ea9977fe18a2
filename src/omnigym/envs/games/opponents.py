"""Fixed opponents for two-seat games: an opponent is ``move(game, rng) -> action``.

- ``random_move``: uniform over the legal moves.
- ``Search(depth)``: depth-limited minimax with alpha-beta pruning and a transposition
  table; a position the depth does not reach the end of scores 0 (a draw), a won end scores
  ``1 + 0.01 * plies left`` (sooner wins first), and among the moves with the best score one is
  drawn at random, so the opponent is not one fixed line a learner can memorise. At full depth
  (9 on tic-tac-toe) it is a perfect player; at depth 2 it takes a win in one and never leaves
  a loss in one (the "depth-2 search" of docs/games.md).

Each ply multiplies a move's time, so a depth asked for is tried before a run starts
(``check_search_depth``): one that cannot finish a move of a random game within two seconds is
refused in one line rather than hanging the run's first evaluation (the game's default
depth is not tried: it is known to be quick).
"""

from __future__ import annotations

import time

import numpy as np

from omnigym.envs.games.core import Game
from omnigym.errors import OmnigymError, require

EXACT, LOWER, UPPER = 0, 1, 2
TABLE_LIMIT = 200_000
"""transposition-table entries kept (~60 MB on connect four): the table is emptied when it holds more, since a
league's search member grew it by ~100 MB every 1,000 games. The values are exact minimax values, so emptying
it changes no move, only the time to the next one."""
MOVE_SECONDS = 2.0
"""``check_search_depth``: the longest one move of the probe game may search"""
PROBE_MOVES = 20
"""``check_search_depth``: the positions of the probe game searched (its opening and middle)"""


class _OutOfTime(Exception):
    """A probe's move ran past its deadline."""


def random_move(game: Game, rng: np.random.Generator) -> int:
    return int(rng.choice(np.flatnonzero(game.legal_mask())))


class Search:
    """``depth``-ply alpha-beta minimax from the mover's side (docstring above)."""

    def __init__(self, depth: int):
        require(depth >= 1, f"the search opponent's depth must be at least 1, got {depth}")
        self.depth = depth
        self.table = {}  # (position, seat, plies left) -> (value, bound); positions recur across moves and games
        self.deadline = None  # check_search_depth's: time.perf_counter() past which a move gives up

    def __call__(self, game: Game, rng: np.random.Generator) -> int:
        if not game.perfect_information:
            raise OmnigymError(f"the search opponent plays games with nothing hidden and no chance; {game.name} is not "
                               "one: use the random opponent")
        if len(self.table) > TABLE_LIMIT:
            self.table.clear()
        seat = game.current()
        moves = np.flatnonzero(game.legal_mask())
        values = []
        for move in moves:  # each root move on a full window: exact values, so ties are real ties
            child = game.clone()
            child.step(move)
            values.append(self.value(child, seat, self.depth - 1, -np.inf, np.inf))
        best = np.flatnonzero(np.isclose(values, max(values)))
        return int(moves[rng.choice(best)])

    def value(self, game: Game, seat: int, depth: int, alpha: float, beta: float) -> float:
        """The position's minimax value for ``seat``, searched ``depth`` more plies."""
        if game.done():
            outcome = float(np.sign(game.returns()[seat]))
            return outcome * (1 + 0.01 * depth)
        if depth == 0:
            return 0.0
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise _OutOfTime
        key = (game.key(), seat, depth)
        stored = self.table.get(key)
        if stored is not None:
            value, bound = stored
            if bound == EXACT or (bound == LOWER and value >= beta) or (bound == UPPER and value <= alpha):
                return value
        start_alpha, start_beta = alpha, beta
        maximizing = game.current() == seat
        best = -np.inf if maximizing else np.inf
        for move in np.flatnonzero(game.legal_mask()):
            child = game.clone()
            child.step(move)
            value = self.value(child, seat, depth - 1, alpha, beta)
            if maximizing:
                best, alpha = max(best, value), max(alpha, value)
            else:
                best, beta = min(best, value), min(beta, value)
            if alpha >= beta:
                break
        bound = UPPER if best <= start_alpha else LOWER if best >= start_beta else EXACT
        self.table[key] = (best, bound)
        return best


def check_search_depth(game: Game, depth: int, flag: str) -> None:
    """One line for a search ``depth`` (given as ``flag``) too deep to play ``game``: a move of a
    seeded random game's first ``PROBE_MOVES`` positions that searches for more than
    ``MOVE_SECONDS``. Plays on a clone; ``game`` is left as it was."""
    if not game.perfect_information:
        return  # refused where the search is asked to move, with its own line
    probe, search, rng = game.clone(), Search(depth), np.random.default_rng(0)
    probe.reset(seed=0)
    for _ in range(PROBE_MOVES):
        if probe.done():
            break
        began = time.perf_counter()
        search.deadline = began + MOVE_SECONDS
        try:
            search(probe, rng)
        except _OutOfTime:
            raise OmnigymError(f"{flag}{depth} is too deep for {game.name}: one move searched for more than "
                               f"{MOVE_SECONDS:g} s (each ply multiplies it, and an evaluation plays hundreds of "
                               "moves); give a smaller depth (docs/games.md has the time a move at each)") from None
        probe.step(random_move(probe, rng))


def fixed_opponent(name: str, depth: int):
    """``random`` or ``search`` (of ``depth`` plies) as an opponent."""
    if name == "random":
        return random_move
    if name == "search":
        return Search(depth)
    raise OmnigymError(f"unknown opponent {name!r}; choose random or search")
