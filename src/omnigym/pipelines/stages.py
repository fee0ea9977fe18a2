"""What every pipeline stage shares: when a stage is finished, and its model folder written whole.

A stage is a folder in ``RUN_DIR/stages/`` holding ``config.json`` (the settings it was made
with) and ``model/`` (a Hugging Face folder). The model folder is written under a temporary
name and renamed, and ``config.json`` is written after it, so a stage that was interrupted
is never mistaken for a finished one.
"""

from __future__ import annotations

import json
from pathlib import Path

from omnigym.track.model_folder import save_model_folder


def finished_stage(stage: Path, settings: dict) -> bool:
    """``stage`` holds a whole model made with exactly ``settings``."""
    try:
        made_with = json.loads((stage / "config.json").read_text())
    except (OSError, ValueError):  # absent or unreadable: the stage runs again
        return False
    return made_with == json.loads(json.dumps(settings)) and (stage / "model" / "config.json").is_file()


def export_model_folder(model, tokenizer, folder: Path) -> Path:
    """``model`` (LoRA merged into a copy) and ``tokenizer`` as a Hugging Face folder, whole or
    absent: the same writer as a run's own ``model/`` (``Run.export_model``)."""
    return save_model_folder(model, tokenizer, folder)
