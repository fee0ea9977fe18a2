"""Atomic checkpoints: a crash mid-write leaves the previous checkpoint loadable."""

from __future__ import annotations

import os
import pickle
import random
from pathlib import Path

import numpy as np
import torch

from omnigym.errors import OmnigymError

CHECKPOINT_NAME = "checkpoint.pt"


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    """Write to a temporary file beside ``path``, fsync it, then rename over ``path``.

    ``os.replace`` is atomic on POSIX, so a reader sees the old file or the new one, never
    half of one.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(path: str | os.PathLike) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    if not path.exists():
        raise OmnigymError(f"no checkpoint at {path}; a run writes one every --checkpoint-every steps")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # any unpickling failure means the file is not a usable checkpoint
        raise OmnigymError(f"checkpoint {path} is corrupt or not an omnigym checkpoint ({type(exc).__name__}); "
                           "delete it to start over") from None


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def snapshot_env(envs) -> bytes | None:
    """Pickle a vector env so a resumed run continues mid-episode exactly; None if it cannot be
    pickled (subprocess or emulator backends), in which case resume starts fresh episodes."""
    try:
        return pickle.dumps(envs)
    except Exception:
        return None
