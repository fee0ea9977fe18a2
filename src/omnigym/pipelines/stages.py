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
import shutil
from pathlib import Path

from omnigym.distributed import is_main_process
from omnigym.track.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from omnigym.track.model_folder import save_model_folder
from omnigym.track.run import STAGES_FOLDER, Run

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


def undo_stages(run: Run, made: bool) -> None:
    """After a failure or a stop in a stage: ``stages/`` goes if this start made it and none of
    its stages is finished yet (the run directory then goes with the lock, if it is empty);
    finished stages stay, for the next start with ``--run-dir`` to reuse (``Run.kept_stages_line``),
    and so does the unfinished one beside them, which that start makes again."""
    if made and not run.finished_stages and is_main_process():
        shutil.rmtree(run.dir / STAGES_FOLDER, ignore_errors=True)


def run_again(run: Run) -> str:
    """What a full disk in a stage says to do once there is space (a stage's own "--resume"
    advice is void: its folder belongs to this run)."""
    return run.kept_stages_line() if run.finished_stages else "run the command again"
