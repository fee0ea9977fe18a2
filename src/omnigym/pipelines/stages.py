"""What every pipeline stage shares: when a stage is finished, and its model folder written whole.

A stage is a folder in ``RUN_DIR/stages/`` holding ``config.json`` (the settings it was made
with) and ``model/`` (a Hugging Face folder). The model folder is written under a temporary
name and renamed, and ``config.json`` is written after it, so a stage that was interrupted
is never mistaken for a finished one.

A stage also keeps the process's random state as the stage left it (``random_state.pt``): a run
that reuses the stage (``--overwrite`` retrains only the last one) goes on from that state, so
it samples and logs what the run that made the stage did, seed for seed.
"""

from __future__ import annotations

import json
from pathlib import Path

from omnigym.track.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from omnigym.track.model_folder import save_model_folder

RANDOM_STATE = "random_state.pt"


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


def keep_random_state(path: Path) -> None:
    """The process's random state now (torch, numpy, Python), written whole to ``path``."""
    save_checkpoint(path, rng_state())


def go_on_from_random_state(path: Path) -> None:
    """The random state a stage left, where it kept one (a stage made before omnigym kept it:
    the process goes on from its own state, as it did then)."""
    if path.is_file():
        set_rng_state(load_checkpoint(path))
