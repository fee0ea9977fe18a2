"""The files of a run directory that other tools read: ``config.json`` and ``metrics.jsonl``."""

from __future__ import annotations

import json
import os
from pathlib import Path

from omnigym.errors import OmnigymError

CONFIG_NAME = "config.json"
METRICS_NAME = "metrics.jsonl"


def load_config_dict(run_dir: str | os.PathLike) -> dict:
    path = Path(run_dir) / CONFIG_NAME
    if not path.exists():
        raise OmnigymError(f"{run_dir} is not a run directory (no {CONFIG_NAME})")
    return json.loads(path.read_text())


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    path = Path(run_dir) / METRICS_NAME
    if not path.exists():
        raise OmnigymError(f"{run_dir} has no {METRICS_NAME}")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
