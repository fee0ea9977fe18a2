"""The files of a run directory that other tools read (``config.json`` and ``metrics.jsonl``),
and what a failed write says.

A write that fails because the disk is full (or the quota is used up, or the device fails)
is not a bug: ``write_fault`` turns it into one ``DiskFault`` line naming the file, and
``write_atomically`` writes a small file whole or not at all.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from omnigym.errors import OmnigymError
from omnigym.track.disk import WRITE_FAULTS, DiskFault, as_disk_fault, write_fault  # noqa: F401 (its callers')

CONFIG_NAME = "config.json"
METRICS_NAME = "metrics.jsonl"

def write_all(file, data: bytes) -> None:
    """``data`` to an unbuffered file (``open(..., buffering=0)``), looping over short writes.
    Unbuffered, so that bytes a failed write could not place are not kept in a buffer that a
    later close or garbage collection would write after the run resumed."""
    view = memoryview(data)
    while view:
        view = view[file.write(view):]


def write_atomically(path, data: bytes) -> None:
    """``data`` in ``path``, whole or not at all: written beside it, then renamed over it, so a
    full disk leaves the old file (a resumed run's config.json) as it was, and no temporary."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with write_fault(path):
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def describe(value) -> str:
    """How config.json records a Python object given as a flag (an env class or factory):
    ``module:qualname`` when it can be imported again by that name."""
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if module and qualname and "<" not in qualname and module != "__main__":
        return f"{module}:{qualname}"
    return repr(value)


NAME_MAX = 255
"""the longest file name, in bytes, of the file systems runs are written to (ext4, xfs, btrfs, tmpfs)"""


def name_too_long(path) -> str:
    """What is said of a path with a name longer than a file system allows (the path shortened)."""
    shown = str(path) if len(str(path)) <= 60 else str(path)[:60] + "..."
    return f"{shown}: a name in this path is longer than the {NAME_MAX} bytes a file system allows; give a shorter one"


def load_config_dict(run_dir: str | os.PathLike) -> dict:
    if isinstance(run_dir, str) and not run_dir.strip():  # "" is Path("."): a run there was read
        raise OmnigymError("the run directory given is empty (\"\"); give a run directory")
    path = Path(run_dir) / CONFIG_NAME
    try:
        found = path.exists()
    except OSError as exc:  # a folder this user may not read (chmod 000): a PermissionError traceback
        if exc.errno == errno.ENAMETOOLONG:
            raise OmnigymError(name_too_long(run_dir)) from None
        raise OmnigymError(f"{run_dir} cannot be read ({exc.strerror or type(exc).__name__}); check its "
                           "permissions, or run as the user who made it") from None
    if not found:
        if (Path(run_dir) / "stages").is_dir():  # run_dir.STAGES_FOLDER, which imports this module
            from omnigym.track.lock import RunLock

            # a run still making its stages: "start that run again" was advice its lock then refused
            probe = RunLock(Path(run_dir))
            try:
                probe.acquire()  # raises, naming the holder, where a process holds it
            finally:
                probe.release()
            raise OmnigymError(f"{run_dir} is not a run directory (no {CONFIG_NAME}): it holds only the finished "
                               "stages of a run stopped before its first checkpoint; start that run again with "
                               f"--run-dir {run_dir} (not --resume), which reuses them")
        raise OmnigymError(f"{run_dir} is not a run directory (no {CONFIG_NAME})")
    try:
        values = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
        raise OmnigymError(f"{path} cannot be read ({type(exc).__name__}); the run's settings are lost, "
                           "so it can be neither resumed nor evaluated") from None
    if not isinstance(values, dict) or "algo" not in values:
        raise OmnigymError(f"{path} is not an omnigym run config (no 'algo')")
    return values


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    path = Path(run_dir) / METRICS_NAME
    if not path.exists():
        raise OmnigymError(f"{run_dir} has no {METRICS_NAME}")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise OmnigymError(f"{path} is damaged (bytes that are not UTF-8 text)") from None
    lines = text.split("\n")
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # no newline after it: a write cut short (a killed run); the rows before stand
                break
            raise OmnigymError(f"{path} is damaged at line {number}") from None
        step = row.get("global_step") if isinstance(row, dict) else None
        # every row omnigym writes is an object with its step: anything else was written by another hand (a
        # list was an AttributeError in plot, a row without its step a KeyError)
        if isinstance(step, bool) or not isinstance(step, (int, float)):
            raise OmnigymError(f"{path} is damaged at line {number} (not a row of metrics with its global_step)")
        rows.append(row)
    return rows
