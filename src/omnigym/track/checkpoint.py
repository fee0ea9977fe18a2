"""Checkpoints: what a run saves to continue exactly, written atomically.

``Checkpointer.save(components, **counters)`` stores each component's ``state_dict()``
(models, optimizers, env cursors, episode statistics, the metrics log: anything with
``state_dict``/``load_state_dict``), the counters (step numbers) and the RNG states.
``restore(components)`` loads them back into freshly built components and sets the RNGs
last, because building networks draws from them. A crash mid-write leaves the previous
checkpoint loadable.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

from omnigym.errors import OmnigymError
from omnigym.track.files import write_fault

CHECKPOINT_NAME = "checkpoint.pt"


class _SeenWrites:
    """The file torch.save writes to, keeping the OSError of a failed write, or the Ctrl-C that
    landed in it: torch reports either as a RuntimeError ("unexpected pos") that no longer says
    the disk was full, or that the user stopped the run."""

    def __init__(self, file):
        self._file, self.error = file, None

    @property
    def name(self) -> str:
        """the file's own name, as a file object has one (what a reader of the write sees)"""
        return self._file.name

    def write(self, data) -> int:
        try:
            return self._file.write(data)
        except (OSError, KeyboardInterrupt) as exc:  # a Ctrl-C's handler runs here too, inside torch's writer
            self.error = exc
            raise

    def flush(self) -> None:
        try:
            self._file.flush()
        except OSError as exc:
            self.error = exc
            raise


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    """Write to a temporary file beside ``path``, fsync it, then rename over ``path``.

    ``os.replace`` is atomic on POSIX, so a reader sees the old file or the new one, never
    half of one. A write that fails (a full disk) raises a ``DiskFault`` naming ``path`` and
    removes the temporary file; the previous checkpoint is untouched.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with write_fault(path):
            with open(tmp, "wb") as f:
                seen = _SeenWrites(f)
                try:
                    torch.save(state, seen)
                except RuntimeError as exc:
                    stopped = exc.__context__ if isinstance(exc.__context__, KeyboardInterrupt) else None
                    raise (seen.error or stopped or exc) from None
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException:  # whatever stopped the write (a full disk, Ctrl-C): no half file is left
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(path: str | os.PathLike) -> dict:
    path = Path(path)
    if path.is_dir() and path.name != CHECKPOINT_NAME:  # a run directory
        path = path / CHECKPOINT_NAME
    if not path.is_file():
        raise OmnigymError(f"no checkpoint at {path}; a run writes one every --checkpoint-every steps")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # any unpickling failure means the file is not a usable checkpoint
        # eval, export and collect read a finished run's checkpoint too: deleting it loses the policy
        raise OmnigymError(f"checkpoint {path} is corrupt or not an omnigym checkpoint ({type(exc).__name__}); "
                           "restore it from a copy if you have one (the run's policy is in it), or start the run "
                           "again") from None


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


class Checkpointer:
    """The checkpoint file of one run directory."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / CHECKPOINT_NAME

    def exists(self) -> bool:
        return self.path.exists()

    def save(self, components: dict, **counters) -> None:
        state = {name: c.state_dict() if hasattr(c, "state_dict") else c for name, c in components.items()}
        save_checkpoint(self.path, {"components": state, "counters": counters, "rng": rng_state()})

    def load(self) -> dict:
        saved = load_checkpoint(self.path)
        if not isinstance(saved, dict) or "components" not in saved:
            raise OmnigymError(f"checkpoint {self.path} was written by an older omnigym; start a new run")
        return saved

    @staticmethod
    def restore(saved: dict, components: dict) -> dict:
        """Load ``saved`` into ``components`` (by name), then the RNGs; returns the counters."""
        for name, component in components.items():
            component.load_state_dict(saved["components"][name])
        set_rng_state(saved["rng"])
        return saved["counters"]
