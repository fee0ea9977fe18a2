"""A run directory and what a training run writes into it.

``start_run`` checks everything it can before it writes anything, then gives the
algorithm a ``Run``: the metrics log (``metrics.jsonl``, TensorBoard, W&B) and, separately,
the checkpointer. On ``--resume`` the saved checkpoint is loaded up front; the algorithm
builds its components and calls ``run.restore(components)``, which also rolls the metrics
log back to the checkpoint, so a resumed run's log equals an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

from omnigym.errors import OmnigymError
from omnigym.track.checkpoint import Checkpointer
from omnigym.track.files import CONFIG_NAME, METRICS_NAME


class MetricsLog:
    """Metrics as JSON lines, TensorBoard scalars and (optionally) W&B, one row per step.

    Its state is the byte offset of the log: a checkpoint stores it, and loading it cuts
    off the rows written after that checkpoint."""

    def __init__(self, run_dir: Path, config_dict: dict, append: bool, tensorboard: bool = True, wandb: bool = False):
        self.dir = run_dir
        self._file = open(run_dir / METRICS_NAME, "ab" if append else "wb")
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

    def log(self, step: int, metrics: dict) -> None:
        clean = {k: (float(v) if not isinstance(v, (int, str)) else v) for k, v in metrics.items()}
        clean = {k: v for k, v in clean.items() if not (isinstance(v, float) and math.isnan(v))}
        self._file.write((json.dumps({"global_step": step, **clean}) + "\n").encode())
        self._file.flush()
        self._last_step = step
        if self._use_tensorboard:
            if self._tb is None:
                # Imported on first use: it costs a noticeable part of a CartPole run's start-up.
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.dir), purge_step=self._purge_step)
            for k, v in clean.items():
                if isinstance(v, (int, float)):
                    self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(clean, step=step)

    def state_dict(self) -> dict:
        self._file.flush()
        return {"offset": self._file.tell(), "step": self._last_step}

    def load_state_dict(self, state: dict) -> None:
        self._file.truncate(state["offset"])
        self._last_step = state["step"]
        self._purge_step = state["step"] + 1  # TensorBoard drops the events after the checkpoint

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


class Run:
    def __init__(self, run_dir: Path, algo: str, metrics: MetricsLog, checkpointer: Checkpointer, saved: dict | None):
        self.dir, self.algo, self.metrics, self.checkpointer = run_dir, algo, metrics, checkpointer
        self.saved = saved
        """the loaded checkpoint when resuming, else None"""

    def log(self, step: int, metrics: dict) -> None:
        self.metrics.log(step, metrics)

    def restore(self, components: dict) -> dict:
        """Load the saved state into ``components`` and the metrics log; returns the counters."""
        return self.checkpointer.restore(self.saved, {**components, "metrics": self.metrics})

    def save(self, components: dict, **counters) -> None:
        self.checkpointer.save({**components, "metrics": self.metrics}, **counters)

    def close(self, plot: bool = True, metric: str = "charts/episodic_return") -> Path | None:
        self.metrics.close()
        if not plot:
            return None
        from omnigym.track.plot import plot_runs

        return plot_runs([self.dir], self.dir / "curve.png", metric=metric)

    def say(self, *lines: str) -> None:
        """The closing lines a person reads (stderr, so stdout stays the episode stream)."""
        for line in lines:
            print(line, file=sys.stderr)


def default_run_dir(algo: str, label: str, seed: int) -> str:
    return os.path.join("runs", f"{algo}__{label.replace('/', '-')}__{seed}__{int(time.time())}")


def start_run(cfg, algo: str, label: str) -> Run:
    """The run directory of ``cfg`` (``--resume`` or ``--run-dir``, else a new name from
    ``label``), its config written, its log open and, when resuming, its checkpoint loaded."""
    if cfg.resume and cfg.run_dir and Path(cfg.run_dir).resolve() != Path(cfg.resume).resolve():
        raise OmnigymError("give either --resume RUN_DIR or --run-dir, not two different directories")
    cfg.run_dir = cfg.resume or cfg.run_dir or default_run_dir(algo, label, cfg.seed)
    run_dir = Path(cfg.run_dir)
    checkpointer = Checkpointer(run_dir)
    saved = checkpointer.load() if cfg.resume else None
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise OmnigymError(f"cannot write to run directory {run_dir}: {exc.strerror}; choose another --run-dir") from None
    config_dict = {"algo": algo, **dataclasses.asdict(cfg)}
    (run_dir / CONFIG_NAME).write_text(json.dumps(config_dict, indent=2, default=str))
    metrics = MetricsLog(run_dir, config_dict, append=saved is not None, tensorboard=cfg.tensorboard, wandb=cfg.wandb)
    return Run(run_dir, algo, metrics, checkpointer, saved)
