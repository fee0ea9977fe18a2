"""Threat planes for k-in-a-row boards (``--env-kwargs threats=True``): the empty cells where
either side's next piece would complete a line, appended to the observation.

A feed-forward policy trained by self-play on connect four loses most of its games against a
depth-2 search by the same mistake: it leaves the search a win in one (docs/games.md). Seeing
that needs a conjunction of four cells per line, 69 lines, which an MLP learns slowly from a
win/loss signal. AlphaGo's policy network read hand-computed tactical planes beside the stones
(liberties, captures, ladders) for the same reason; these are the k-in-a-row game's analogue.
They say nothing about which threat can be played now: with gravity, that is the cell above a
column's top piece, which the network reads from the board planes beside them.

Plane ``p`` marks the threats of the pieces in the observation's board plane ``p`` (PettingZoo:
the mover's, then the other seat's; OpenSpiel: the first seat's, then the second's), cells in
the board planes' own order, so a board symmetry moves them as it moves the board
(symmetry.py).
"""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from omnigym.envs.games.core import Game, OpenSpielGame
from omnigym.errors import OmnigymError

SIDES = 2


def lines_of(rows: int, cols: int, k: int) -> np.ndarray:
    """Every line of ``k`` cells on a ``rows`` x ``cols`` board (rows, columns, both diagonals),
    as row-major cell indices ``[lines, k]``."""
    board = np.arange(rows * cols).reshape(rows, cols)
    lines = []
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        for r in range(rows):
            for c in range(cols):
                end_r, end_c = r + dr * (k - 1), c + dc * (k - 1)
                if 0 <= end_r < rows and 0 <= end_c < cols:
                    lines.append([board[r + dr * i, c + dc * i] for i in range(k)])
    return np.asarray(lines)


def _pettingzoo_sides(obs: np.ndarray, cells: int) -> np.ndarray:
    return obs[:SIDES * cells].reshape(cells, SIDES).T  # (rows, cols, 2): the mover's plane, then the other's


def _openspiel_sides(first: int, second: int):
    """OpenSpiel's boards are 3 planes of cells, in each game's own order: connect four's are the
    first seat's pieces, the second's, empty; tic-tac-toe's are empty, noughts (the second seat), crosses."""
    def sides(obs: np.ndarray, cells: int) -> np.ndarray:
        return obs[:3 * cells].reshape(3, cells)[[first, second]]
    return sides


# env id -> (rows, columns, the line length that wins, the two sides' piece planes from an observation)
BOARDS = MappingProxyType({"pettingzoo/tictactoe_v3": (3, 3, 3, _pettingzoo_sides),
                           "openspiel/tic_tac_toe": (3, 3, 3, _openspiel_sides(2, 1)),
                           "pettingzoo/connect_four_v3": (6, 7, 4, _pettingzoo_sides),
                           "openspiel/connect_four": (6, 7, 4, _openspiel_sides(0, 1))})


def standard_obs_size(env_id: str) -> int:
    """The observation of ``env_id``'s standard board: PettingZoo's 2 planes of cells; OpenSpiel's 3 and the seat."""
    rows, cols, _, _ = BOARDS[env_id]
    return 2 * rows * cols if env_id.startswith("pettingzoo/") else 3 * rows * cols + 2


def incidence(lines: np.ndarray, cells: int) -> np.ndarray:
    """``[cells, lines]``: 1 where a cell is on a line (threat_planes counts with matrix products)."""
    matrix = np.zeros((cells, len(lines)), dtype=np.float32)
    matrix[lines, np.arange(len(lines))[:, None]] = 1.0
    return matrix


def threat_planes(sides: np.ndarray, on_line: np.ndarray, k: int) -> np.ndarray:
    """``sides [2, cells]`` (1 where a side has a piece), ``on_line`` (``incidence``) -> ``[2, cells]``:
    1 at each empty cell that completes a line for that side (the line holds k-1 of its pieces and
    this cell, empty)."""
    empty = 1.0 - sides.sum(0)
    open_lines = (sides @ on_line == k - 1) & (empty @ on_line == 1)  # [2, lines]
    return (((open_lines.astype(np.float32) @ on_line.T) > 0) & (empty > 0)).astype(np.float32)


def check_threats(env_id: str, threats) -> bool:
    if not isinstance(threats, bool):
        raise OmnigymError(f"--env-kwargs threats= takes True or False, got {threats!r}")
    if threats and env_id not in BOARDS:
        raise OmnigymError(f"--env-kwargs threats=True knows the k-in-a-row boards ({', '.join(BOARDS)}); "
                           f"{env_id} is not one: leave it out")
    return threats


def threats_of(cfg) -> bool:
    """Whether a run's envs append threat planes (its ``--env-kwargs threats=True``)."""
    from omnigym.envs.vector import parse_env_kwargs  # vector.py imports the games package lazily, as here

    return parse_env_kwargs(getattr(cfg, "env_kwargs", ())).get("threats") is True


def threat_features(env_id: str) -> int:
    """How many features ``threats=True`` appends to ``env_id``'s observation."""
    rows, cols, _, _ = BOARDS[env_id]
    return SIDES * rows * cols


class WithThreats(Game):
    """``game`` whose observations end with its threat planes; everything else is the game's."""

    def __init__(self, env_id: str, game: Game):
        rows, cols, k, self._sides = BOARDS[env_id]
        board = {"rows": rows, "columns": cols, "x_in_row": k}
        parameters = game.game.get_parameters() if isinstance(game, OpenSpielGame) else {}  # PettingZoo's are fixed
        changed = {name: value for name, value in parameters.items() if name in board and value != board[name]}
        if changed:  # OpenSpiel's x_in_row=3 keeps the board's size, and the planes would mark lines of four
            settings = " ".join(f"{name}={value}" for name, value in changed.items())
            raise OmnigymError(f"--env-kwargs threats=True knows {env_id}'s standard game ({rows}x{cols}, {k} in a row); "
                               f"this one has {settings}: leave threats out")
        if game.obs_size != standard_obs_size(env_id):  # the planes would read the wrong cells
            raise OmnigymError(f"--env-kwargs threats=True knows {env_id}'s standard {rows}x{cols} board "
                               f"({standard_obs_size(env_id)} observation features); this one has {game.obs_size} "
                               "(its other --env-kwargs): leave threats out")
        self.env_id, self.inner, self._cells = env_id, game, rows * cols
        self._on_line, self._k = incidence(lines_of(rows, cols, k), rows * cols), k
        self.name, self.num_seats, self.num_actions = game.name, game.num_seats, game.num_actions
        self.perfect_information = game.perfect_information
        self.obs_size = game.obs_size + threat_features(env_id)

    def observation(self, seat):
        obs = self.inner.observation(seat)
        return np.concatenate([obs, threat_planes(self._sides(obs, self._cells), self._on_line, self._k).reshape(-1)])

    def clone(self):
        new = object.__new__(WithThreats)
        new.__dict__.update(self.__dict__)
        new.inner = self.inner.clone()
        return new

    def reset(self, seed=None):
        self.inner.reset(seed=seed)

    def current(self):
        return self.inner.current()

    def legal_mask(self):
        return self.inner.legal_mask()

    def step(self, action):
        self.inner.step(action)

    def done(self):
        return self.inner.done()

    def truncated(self):
        return self.inner.truncated()

    def returns(self):
        return self.inner.returns()

    def key(self):
        return self.inner.key()
