"""A run directory: config.json, metrics.jsonl, TensorBoard events, checkpoints, plot."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path

from omnigym.errors import OmnigymError
from omnigym.track.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint

CONFIG_NAME = "config.json"
METRICS_NAME = "metrics.jsonl"


def default_run_dir(algo: str, env_id: str, seed: int) -> str:
    return os.path.join("runs", f"{algo}__{env_id.replace('/', '-')}__{seed}__{int(time.time())}")


def load_config_dict(run_dir: str | os.PathLike) -> dict:
    path = Path(run_dir) / CONFIG_NAME
    if not path.exists():
        raise OmnigymError(f"{run_dir} is not a run directory (no {CONFIG_NAME})")
    return json.loads(path.read_text())


class Run:
    """Everything a training run writes. ``resume=True`` reopens an existing run and rolls its
    metrics back to the last checkpoint, so a resumed run's log equals an uninterrupted one."""

    def __init__(self, run_dir: str, algo: str, config, resume: bool = False, tensorboard: bool = True,
                 wandb: bool = False):
        self.dir = Path(run_dir)
        self.algo = algo
        self.checkpoint_path = self.dir / CHECKPOINT_NAME
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            probe = self.dir / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise OmnigymError(f"cannot write to run directory {run_dir}: {exc.strerror}; choose another --run-dir") from None
        self.checkpoint = load_checkpoint(self.checkpoint_path) if resume else None
        config_dict = {"algo": algo, **dataclasses.asdict(config)}
        (self.dir / CONFIG_NAME).write_text(json.dumps(config_dict, indent=2, default=str))
        metrics_path = self.dir / METRICS_NAME
        if self.checkpoint is not None:
            with open(metrics_path, "r+b") as f:
                f.truncate(self.checkpoint["metrics_offset"])
        self._metrics = open(metrics_path, "ab" if resume else "wb")
        self._use_tensorboard = tensorboard
        self._tb = None
        self._wandb = None
        if wandb:
            try:
                import wandb as wandb_lib
            except ImportError:
                raise OmnigymError("wandb is not installed; install it with: pip install 'omnigym[wandb]'") from None
            self._wandb = wandb_lib.init(project="omnigym", name=self.dir.name, config=config_dict, dir=str(self.dir),
                                         resume="allow")

    def log(self, step: int, metrics: dict) -> None:
        clean = {k: (float(v) if not isinstance(v, (int, str)) else v) for k, v in metrics.items()}
        clean = {k: v for k, v in clean.items() if not (isinstance(v, float) and math.isnan(v))}
        self._metrics.write((json.dumps({"global_step": step, **clean}) + "\n").encode())
        self._metrics.flush()
        if self._use_tensorboard:
            if self._tb is None:
                # Imported on first use: it costs a noticeable part of a CartPole run's start-up.
                from torch.utils.tensorboard import SummaryWriter

                purge = self.checkpoint["global_step"] + 1 if self.checkpoint is not None else None
                self._tb = SummaryWriter(str(self.dir), purge_step=purge)
            for k, v in clean.items():
                if isinstance(v, (int, float)):
                    self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(clean, step=step)

    def save(self, state: dict) -> None:
        """Checkpoint ``state`` with the metrics offset that belongs to it."""
        self._metrics.flush()
        state["metrics_offset"] = self._metrics.tell()
        save_checkpoint(self.checkpoint_path, state)

    def close(self, plot: bool = True, metric: str = "charts/episodic_return") -> Path | None:
        self._metrics.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if not plot:
            return None
        from omnigym.track.plot import plot_runs

        return plot_runs([self.dir], self.dir / "curve.png", metric=metric)


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    path = Path(run_dir) / METRICS_NAME
    if not path.exists():
        raise OmnigymError(f"{run_dir} has no {METRICS_NAME}")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
