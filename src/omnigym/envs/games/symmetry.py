"""A board's symmetries, for a policy that treats symmetric positions alike (``--symmetric``).

Tic-tac-toe looks the same under its 8 rotations and reflections (the dihedral group of the
square): a move learnt in one corner is the same move in the other three. A symmetry here is
a permutation of the 9 cells, ``cells[i]`` = the original cell that the transformed board
holds at cell ``i``; it moves the observation's features and the actions (one per cell) alike.
``board_symmetries`` gives them as index arrays in each library's own layout:

- PettingZoo ``tictactoe_v3``: observation ``(3, 3, 2)`` flattened, feature ``2 * cell + plane``;
  action ``k`` marks cell ``k`` (``board.squares[k]``, the same order as the observation's).
- OpenSpiel ``tic_tac_toe``: observation ``(3 planes, 9 cells)`` flattened, feature
  ``9 * plane + cell``, then the seat's one-hot (core.py), which no symmetry moves; action
  ``k`` marks cell ``k`` (row-major).

The network reads each of the 8 transformed boards (models/control.py, ``BoardSymmetries``)
and averages its logits, each mapped back to the original cells, and its values.
"""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from omnigym.errors import OmnigymError

SIDE = 3


def square_symmetries(side: int = SIDE) -> np.ndarray:
    """The 8 cell permutations of a ``side`` x ``side`` board, ``[8, side * side]``; the identity first.
    Row ``g``, cell ``i``: the original cell that transformed board ``g`` holds at ``i``."""
    board = np.arange(side * side).reshape(side, side)
    views = []
    for turns in range(4):
        rotated = np.rot90(board, turns)
        views += [rotated.reshape(-1), rotated.T.reshape(-1)]
    return np.stack(views)


def _pettingzoo_tictactoe(cells: np.ndarray) -> np.ndarray:
    planes = 2
    return (planes * cells[:, :, None] + np.arange(planes)).reshape(len(cells), -1)


def _openspiel_tictactoe(cells: np.ndarray) -> np.ndarray:
    planes, seats, n = 3, 2, cells.shape[1]
    board = (n * np.arange(planes)[None, :, None] + cells[:, None, :]).reshape(len(cells), -1)
    seat = np.broadcast_to(planes * n + np.arange(seats), (len(cells), seats))  # the seat's one-hot stays put
    return np.concatenate([board, seat], axis=1)


# env id -> the observation's feature indices of each symmetry, from its cell permutations
LAYOUTS = MappingProxyType({"pettingzoo/tictactoe_v3": _pettingzoo_tictactoe,
                            "openspiel/tic_tac_toe": _openspiel_tictactoe})  # read-only: no process state


def has_symmetries(env_id: str) -> bool:
    """Whether ``--symmetric`` knows this game's board symmetries."""
    return env_id in LAYOUTS


def no_symmetries(env_id: str) -> str:
    """What to say of ``--symmetric`` on a game whose symmetries it does not know."""
    return (f"--symmetric knows the board symmetries of tic-tac-toe ({', '.join(LAYOUTS)}); {env_id} is not one: "
            "leave --symmetric out")


def board_symmetries(env_id: str) -> tuple[np.ndarray, np.ndarray]:
    """``(features [G, obs_size], actions [G, num_actions])``: transformed view ``g`` of an
    observation ``obs`` is ``obs[features[g]]``, and its action ``i`` is the original action
    ``actions[g, i]``."""
    if env_id not in LAYOUTS:
        raise OmnigymError(no_symmetries(env_id))
    cells = square_symmetries()
    return LAYOUTS[env_id](cells), cells


def symmetries_of(cfg) -> tuple[np.ndarray, np.ndarray] | None:
    """A run's: the board's symmetries when its config asks for them (PPO's ``--symmetric``), else None."""
    return board_symmetries(cfg.env_id) if getattr(cfg, "symmetric", False) else None
