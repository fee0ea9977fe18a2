"""Two-player board games as text, for a language model: tic-tac-toe (``tictactoe-v0``,
``--env tictactoe``).

The board is shown with the free cells numbered, ``X2O\\n4X6\\n789``; a reply is a move when it
holds exactly one bracketed token and that token is ``[N]``, N a cell from 1 to 9 written in
ASCII digits (``read_move``). Anything else loses the game for the seat that wrote it: no move,
several moves, ``[ 5 ]`` with words in it, ``[0]``, ``[10]``, an occupied cell, a second bracket
such as a fake ``[GAME] You win``. TextArena scores an invalid move the same way. The
outcome is read from the board the env keeps, never from the reply, so nothing a reply says
can make the env score it as a win.

Scores are from the seat's own view: win 1, draw 0.5, loss 0 (issue 42's ``score``). An
episode cut short (out of turns, out of tokens) scores 0 as a loss does, so running out the
clock is never better than losing.

The other seat (``opponent``) is ``random`` (a uniformly random free cell), ``search``
(minimax over the whole game tree: perfect, it never loses; ties broken at random) or
``self``: the policy itself, or ``snapshot``: a frozen copy of it; this env plays neither.
``generators/two_seat_episodes.py`` plays such games, both seats sampled from one engine (or the
other seat from the snapshot's), and the env lends it its rules
(``new_game``, ``opening``, ``move``, ``report``), so a self-play conversation reads like
one against a fixed opponent.

The rules are this module's own (a few lines); ``tests/test_text_games.py`` checks them move
for move against OpenSpiel's ``tic_tac_toe`` on random games where the [games] extra is there.
"""

from __future__ import annotations

import random
import re

from omnigym.envs.text import TextEnv
from omnigym.errors import OmnigymError

OPPONENTS = ("random", "search", "self", "snapshot")
FIXED_OPPONENTS = ("random", "search")
MARKS = "XO"
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
BRACKETED = re.compile(r"\[[^\[\]]*\]")
MOVE = re.compile(r"\[([1-9])\]", re.ASCII)
WIN, DRAW, LOSS = 1.0, 0.5, 0.0


class TicTacToe:
    """The board (None or the mark's seat, 0 for X, 1 for O) and whose turn it is."""

    cells, seats, name = 9, 2, "tic-tac-toe"

    def __init__(self):
        self.board: list[int | None] = [None] * 9
        self.to_move = 0

    def legal(self) -> list[int]:
        """the free cells, numbered 1..9"""
        return [i + 1 for i, v in enumerate(self.board) if v is None] if self.winner() is None else []

    def play(self, cell: int) -> None:
        self.board[cell - 1] = self.to_move
        self.to_move = 1 - self.to_move

    def winner(self) -> int | None:
        for a, b, c in LINES:
            if self.board[a] is not None and self.board[a] == self.board[b] == self.board[c]:
                return self.board[a]
        return None

    def over(self) -> bool:
        return self.winner() is not None or all(v is not None for v in self.board)

    def score(self, seat: int) -> float:
        """``seat``'s score of a finished game: win 1, draw 0.5, loss 0"""
        winner = self.winner()
        return DRAW if winner is None else WIN if winner == seat else LOSS

    def render(self) -> str:
        marks = [str(i + 1) if v is None else MARKS[v] for i, v in enumerate(self.board)]
        return "\n".join("".join(marks[r:r + 3]) for r in (0, 3, 6))


def read_move(text: str, cells: int = 9) -> int | None:
    """The one move in ``text``, or None unless it holds exactly one bracketed token, ``[N]``
    with N from 1 to ``cells``."""
    if text.count("[") != 1 or text.count("]") != 1:
        return None
    found = BRACKETED.findall(text)
    match = MOVE.fullmatch(found[0]) if len(found) == 1 else None
    return int(match.group(1)) if match and int(match.group(1)) <= cells else None


def _value(board: tuple, to_move: int, memo: dict) -> int:
    """The game's value for the seat to move under perfect play: 1 win, 0 draw, -1 loss."""
    if (board, to_move) not in memo:
        game = TicTacToe()
        game.board, game.to_move = list(board), to_move
        moves = game.legal()
        if game.winner() is not None:
            memo[board, to_move] = -1  # the previous mover made the line
        else:
            memo[board, to_move] = max((-_value(_after(board, to_move, m), 1 - to_move, memo) for m in moves),
                                       default=0)
    return memo[board, to_move]


def _after(board: tuple, seat: int, cell: int) -> tuple:
    return board[:cell - 1] + (seat,) + board[cell:]


def search_move(game: TicTacToe, rng: random.Random) -> int:
    """A perfect move (minimax over the whole tree, at most ~5,500 positions), one of the best at
    random. The table is built per call: no state outlives it."""
    board, memo = tuple(game.board), {}
    values = {m: -_value(_after(board, game.to_move, m), 1 - game.to_move, memo) for m in game.legal()}
    best = max(values.values())
    return rng.choice([m for m, v in values.items() if v == best])


def opponent_move(opponent: str, game: TicTacToe, rng: random.Random) -> int:
    return search_move(game, rng) if opponent == "search" else rng.choice(game.legal())


def check_opponent(opponent: str) -> None:
    if opponent not in OPPONENTS:
        raise OmnigymError(f"unknown --opponent {opponent!r}; choose one of {', '.join(OPPONENTS)}")


class TextGameEnv(TextEnv):
    """The policy plays seat ``example["seat"]`` (0: X, moves first; 1: O) against ``opponent``,
    whose random choices are seeded by ``example["seed"]``; the game's score is the reward
    (``example["score"]``, written by the env when the game ends)."""

    def __init__(self, examples, reward, system_prompt=None, max_turns: int = 5, opponent: str = "random"):
        super().__init__(examples, reward, system_prompt)
        if opponent not in FIXED_OPPONENTS:  # self-play is the two-seat generator's, not an env's
            raise OmnigymError(f"a text game env's opponent is one of {', '.join(FIXED_OPPONENTS)}, got {opponent!r}")
        self.max_turns, self.opponent = max_turns, opponent
        self.game, self.turns, self.rng = TicTacToe(), 0, random.Random()

    @property
    def seats(self) -> int:
        return self.new_game().seats

    def new_game(self) -> TicTacToe:
        return TicTacToe()

    def opening(self, seat: int, game: TicTacToe, last: int | None = None) -> str:
        """A seat's first message: its mark, the move played before it (O's view), the board."""
        before = f"X played [{last}].\n" if last is not None else ""
        return f"Tic-tac-toe. You are {MARKS[seat]}. Reply [N] for a free cell.\n{before}{game.render()}"

    @staticmethod
    def move(text: str, game: TicTacToe) -> int | None:
        """The reply's move if it is exactly one legal move, else None (the seat loses)."""
        cell = read_move(text, game.cells)
        return cell if cell is not None and cell in game.legal() else None

    @staticmethod
    def report(game: TicTacToe, mover: int, cell: int) -> str:
        """What the other seat is told after ``mover`` played ``cell``."""
        return f"{MARKS[mover]} played [{cell}].\n{game.render()}"

    def reset(self, seed=None, options=None):
        messages, info = super().reset(seed, options)
        self.game, self.turns = self.new_game(), 0
        self.rng = random.Random(int(self.example.get("seed", 0)))
        seat, last = int(self.example.get("seat", 0)), None
        if seat == 1:
            last = opponent_move(self.opponent, self.game, self.rng)
            self.game.play(last)
        self.messages[-1] = {"role": "user", "content": self.opening(seat, self.game, last)}
        return list(self.messages), info

    def respond(self, text: str):
        self.turns += 1
        self.messages.append({"role": "assistant", "content": text})
        seat = int(self.example.get("seat", 0))
        cell = self.move(text, self.game)
        if cell is None:
            return self._end(LOSS, "invalid move")
        self.game.play(cell)
        if not self.game.over():
            reply = opponent_move(self.opponent, self.game, self.rng)
            self.game.play(reply)
        if self.game.over():
            return self._end(self.game.score(seat), None)
        self.messages.append({"role": "user", "content": self.report(self.game, 1 - seat, reply)})
        return list(self.messages), False, self.turns >= self.max_turns, {"example": self.example}

    def _end(self, score: float, why: str | None):
        # the reward reads this copy of the example: this episode's own outcome
        self.example = {**self.example, "score": score, "invalid": why is not None}
        return list(self.messages), True, False, {"example": self.example, "invalid_move": why is not None}

    def demonstration(self, example: dict) -> list[dict]:
        """Random legal moves, seeded by the example, against this env's opponent (GRPO's
        warm-up: the format and the free cells, not how to win)."""
        env = TextGameEnv(self.examples, self.reward, self.system_prompt, self.max_turns, self.opponent)
        start = len(env.reset(options={"example": example})[0])
        chooser, done = random.Random(int(example.get("seed", 0)) + 1), False
        while not done:
            messages, done, _, _ = env.respond(f"[{chooser.choice(env.game.legal())}]")
        return messages[start:]


def game_score(completion: str, example: dict) -> float:
    """The score the env wrote when the game ended (0 for a game that did not end)."""
    return float(example.get("score", LOSS))


def game_examples(n: int, seed: int) -> list[dict]:
    """Games to play: the policy's seat alternates, the opponent's random choices are seeded."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        seat, game_seed = i % 2, rng.randrange(2**31)
        rows.append({"question": f"tic-tac-toe as {MARKS[seat]} (game {game_seed})", "answer": "", "seat": seat,
                     "seed": game_seed})
    return rows


def tictactoe_env(n: int = 5000, seed: int = 0, system_prompt: str | None = None, max_turns: int = 5,
                  opponent: str = "random") -> TextGameEnv:
    """``tictactoe-v0``: ``n`` games, the policy as X in even ones and O in odd ones."""
    from omnigym.rewards import per_sample

    return TextGameEnv(game_examples(n, seed), per_sample(game_score), system_prompt, max_turns, opponent)
