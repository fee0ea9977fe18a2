"""The metrics log of a run: ``metrics.jsonl``, TensorBoard's events, ``samples.jsonl`` and W&B.

What crosses this module: a run directory that exists (``Run.begin`` made it) and the
config as a dict (for W&B) go in; rows of metrics and samples come in one step at a time.
Its checkpoint state is the byte offsets of the two JSON-lines files and the last step, so
that restoring a checkpoint cuts the log back to it (and TensorBoard drops what came after).
It knows nothing about checkpoints, resuming or which run is active.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from omnigym.errors import OmnigymError
from omnigym.track.files import METRICS_NAME

SAMPLES_NAME = "samples.jsonl"


class MetricsLog:
    """Metrics as JSON lines, TensorBoard scalars and (optionally) W&B, one row per step.

    Its state is the byte offset of the log: a checkpoint stores it, and loading it cuts
    off the rows written after that checkpoint."""

    def __init__(self, run_dir: Path, config_dict: dict, append: bool, tensorboard: bool = True, wandb: bool = False):
        self.dir = run_dir
        self._file = open(run_dir / METRICS_NAME, "ab" if append else "wb")
        self._samples = None  # samples.jsonl, opened by the first log_samples
        self._samples_mode = "ab" if append else "wb"
        self._use_tensorboard, self._tb, self._purge_step = tensorboard, None, None
        self._last_step = 0
        self._wandb = None
        if wandb:
            try:
                import wandb as wandb_lib
            except ImportError:
                raise OmnigymError("wandb is not installed; install it with: pip install 'omnigym[wandb]'") from None
            self._wandb = wandb_lib.init(project="omnigym", name=run_dir.name, config=config_dict, dir=str(run_dir),
                                         resume="allow")

    def _board(self):
        """TensorBoard's writer, opened on first use: importing it costs a noticeable part of a
        CartPole run's start-up."""
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.dir), purge_step=self._purge_step)
        return self._tb

    def log(self, step: int, metrics: dict) -> None:
        clean = {k: (float(v) if not isinstance(v, (int, str)) else v) for k, v in metrics.items()}
        clean = {k: v for k, v in clean.items() if not (isinstance(v, float) and math.isnan(v))}
        self._file.write((json.dumps({"global_step": step, **clean}) + "\n").encode())
        self._file.flush()
        self._last_step = step
        if self._use_tensorboard:
            board = self._board()
            for k, v in clean.items():
                if isinstance(v, (int, float)):
                    board.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(clean, step=step)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        """A few prompts with their completions and rewards: a line each in samples.jsonl, and
        one table per step in TensorBoard's text tab."""
        if self._samples is None:
            self._samples = open(self.dir / SAMPLES_NAME, self._samples_mode)
        for row in rows:
            self._samples.write((json.dumps({"global_step": step, **row}) + "\n").encode())
        self._samples.flush()
        if self._use_tensorboard and rows:
            columns = list(rows[0])
            cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
            table = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            table += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
            self._board().add_text("samples", "\n".join(table), step)

    def state_dict(self) -> dict:
        self._file.flush()
        samples = self.dir / SAMPLES_NAME
        return {"offset": self._file.tell(), "step": self._last_step,
                "samples_offset": samples.stat().st_size if samples.exists() else 0}

    def load_state_dict(self, state: dict) -> None:
        self._file.truncate(state["offset"])
        samples = self.dir / SAMPLES_NAME
        if samples.exists():
            with open(samples, "r+b") as f:
                f.truncate(state.get("samples_offset", 0))
        self._last_step = state["step"]
        self._purge_step = state["step"] + 1  # TensorBoard drops the events after the checkpoint

    def close(self) -> None:
        self._file.close()
        if self._samples is not None:
            self._samples.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
