"""The files of a run directory that other tools read: ``config.json`` and ``metrics.jsonl``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from omnigym.errors import OmnigymError

CONFIG_NAME = "config.json"
METRICS_NAME = "metrics.jsonl"


def describe(value) -> str:
    """How config.json records a Python object given as a flag (an env class or factory):
    ``module:qualname`` when it can be imported again by that name."""
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if module and qualname and "<" not in qualname and module != "__main__":
        return f"{module}:{qualname}"
    return repr(value)


def load_config_dict(run_dir: str | os.PathLike) -> dict:
    path = Path(run_dir) / CONFIG_NAME
    if not path.exists():
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
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise OmnigymError(f"{path} is damaged at line {exc.doc.count(chr(10)) + 1 if exc.doc else '?'}") from None
