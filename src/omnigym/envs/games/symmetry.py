"""A board's symmetries, for a policy that treats symmetric positions alike (``--symmetric``).

Tic-tac-toe looks the same under its 8 rotations and reflections (the dihedral group of the
square): a move learnt in one corner is the same move in the other three. Connect four has
one symmetry besides the identity, its left-right mirror (gravity rules out the others): a
threat built on the left is the same threat on the right. A symmetry here is a permutation
of the board's cells, ``cells[i]`` = the original cell that the transformed board holds at
cell ``i``, and one of the actions, ``actions[i]`` = the original action that the transformed
board's action ``i`` stands for (tic-tac-toe: the cells themselves; connect four: its columns
reversed). ``board_symmetries`` gives them as index arrays in each library's own layout:

- PettingZoo ``tictactoe_v3`` / ``connect_four_v3``: observation ``(rows, cols, 2)`` flattened,
  feature ``2 * cell + plane`` (cells row-major); action ``k`` marks cell ``k``
  (``board.squares[k]``, the observation's order) / drops a piece in column ``k``.
- OpenSpiel ``tic_tac_toe`` / ``connect_four``: observation ``(3 planes, cells)`` flattened,
  feature ``cells * plane + cell``, then the seat's one-hot (core.py), which no symmetry moves;
  action ``k`` marks cell ``k`` (row-major) / drops in column ``k``.

The network reads each of the 8 transformed boards (models/control.py, ``BoardSymmetries``)
and averages its logits, each mapped back to the original cells, and its values.
"""

from __future__ import annotations

import difflib
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


def mirror_symmetries(rows: int = 6, cols: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Connect four's identity and left-right mirror: ``(cells [2, rows * cols], columns [2, cols])``."""
    board = np.arange(rows * cols).reshape(rows, cols)
    columns = np.arange(cols)
    return np.stack([board.reshape(-1), board[:, ::-1].reshape(-1)]), np.stack([columns, columns[::-1]])


def _square() -> tuple[np.ndarray, np.ndarray]:
    cells = square_symmetries()
    return cells, cells  # a tic-tac-toe move marks a cell: the actions move as the cells do


def _pettingzoo_planes(cells: np.ndarray) -> np.ndarray:
    planes = 2
    return (planes * cells[:, :, None] + np.arange(planes)).reshape(len(cells), -1)


def _openspiel_planes(cells: np.ndarray) -> np.ndarray:
    planes, seats, n = 3, 2, cells.shape[1]
    board = (n * np.arange(planes)[None, :, None] + cells[:, None, :]).reshape(len(cells), -1)
    seat = np.broadcast_to(planes * n + np.arange(seats), (len(cells), seats))  # the seat's one-hot stays put
    return np.concatenate([board, seat], axis=1)


# env id -> (its symmetries' cell and action permutations, the observation's feature indices from the cells')
LAYOUTS = MappingProxyType({"pettingzoo/tictactoe_v3": (_square, _pettingzoo_planes),
                            "openspiel/tic_tac_toe": (_square, _openspiel_planes),
                            "pettingzoo/connect_four_v3": (mirror_symmetries, _pettingzoo_planes),
                            "openspiel/connect_four": (mirror_symmetries, _openspiel_planes)})  # read-only


def has_symmetries(env_id: str) -> bool:
    """Whether ``--symmetric`` knows this game's board symmetries."""
    return env_id in LAYOUTS


def no_symmetries(env_id: str) -> str:
    """What to say of ``--symmetric`` on a game whose symmetries it does not know."""
    close = difflib.get_close_matches(str(env_id), LAYOUTS, n=1, cutoff=0.8)  # a misspelt id is caught here first
    return (f"--symmetric knows the board symmetries of tic-tac-toe and connect four ({', '.join(LAYOUTS)}); "
            f"{env_id} is not one: " + (f"did you mean {close[0]}?" if close else "leave --symmetric out"))


def board_symmetries(env_id: str, threats: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(features [G, obs_size], actions [G, num_actions])``: transformed view ``g`` of an
    observation ``obs`` is ``obs[features[g]]``, and its action ``i`` is the original action
    ``actions[g, i]``. ``threats``: the observation ends with threats.py's planes, which move as
    the cells do."""
    if env_id not in LAYOUTS:
        raise OmnigymError(no_symmetries(env_id))
    permutations, features_of = LAYOUTS[env_id]
    cells, actions = permutations()
    features = features_of(cells)
    if threats:
        planes, n = 2, cells.shape[1]
        threat_cells = features.shape[1] + n * np.arange(planes)[None, :, None] + cells[:, None, :]
        features = np.concatenate([features, threat_cells.reshape(len(cells), -1)], axis=1)
    return features, actions


def check_board_size(env_id: str, envs, threats: bool = False) -> None:
    """Before a run directory exists: the envs' board is the one the layout is written for (OpenSpiel's
    ``--env-kwargs rows=5`` or ``columns=5`` makes another connect four, whose views would index past it)."""
    features, actions = board_symmetries(env_id, threats)
    size, moves = envs.single_observation_space.shape, getattr(envs.single_action_space, "n", None)
    if size != (features.shape[1],) or moves != actions.shape[1]:
        envs.close()
        raise OmnigymError(f"--symmetric knows {env_id}'s standard board ({features.shape[1]} observation features, "
                           f"{actions.shape[1]} moves); this one has {size[0] if len(size) == 1 else size} and {moves} "
                           "(--env-kwargs): leave --symmetric out")


def symmetries_of(cfg) -> tuple[np.ndarray, np.ndarray] | None:
    """A run's: the board's symmetries when its config asks for them (PPO's ``--symmetric``), else None."""
    from omnigym.envs.games.threats import threats_of

    return board_symmetries(cfg.env_id, threats_of(cfg)) if getattr(cfg, "symmetric", False) else None
