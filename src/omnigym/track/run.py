"""A run directory and what a training run writes into it.

A run starts in two steps, so that a start that fails leaves the disk as it was:

- ``start_run(cfg, algo, label)`` decides the directory and checks it (a new or empty
  directory; an existing run only with ``--resume`` or ``--overwrite``; on ``--resume`` a run
  of the same algorithm, made with the settings the checkpoint needs) and loads the
  checkpoint. It writes nothing.
- ``run.begin(components)``, once the algorithm has built everything, restores the
  checkpoint into the components (when resuming), and only then creates the directory,
  writes ``config.json`` and opens the metrics log, rolled back to the checkpoint so that a
  resumed run's log equals an uninterrupted one. It returns the saved counters.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import sys
import time
from pathlib import Path

from omnigym.errors import OmnigymError
from omnigym.distributed import broadcast, is_main_process
from omnigym.track.checkpoint import CHECKPOINT_NAME, Checkpointer
from omnigym.track.files import CONFIG_NAME, METRICS_NAME, load_config_dict


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

    def log_samples(self, step: int, rows: list[dict]) -> None:
        """A few prompts with their completions and rewards: a line each in samples.jsonl, and
        one table per step in TensorBoard's text tab."""
        if self._samples is None:
            self._samples = open(self.dir / SAMPLES_NAME, self._samples_mode)
        for row in rows:
            self._samples.write((json.dumps({"global_step": step, **row}) + "\n").encode())
        self._samples.flush()
        if self._use_tensorboard and rows:
            if self._tb is None:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.dir), purge_step=self._purge_step)
            columns = list(rows[0])
            cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
            table = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            table += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
            self._tb.add_text("samples", "\n".join(table), step)

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


SAMPLES_NAME = "samples.jsonl"
MODEL_FOLDER = "model"
STAGES_FOLDER = "stages"
RUN_FILES = (CONFIG_NAME, METRICS_NAME, CHECKPOINT_NAME, CHECKPOINT_NAME + ".tmp", "curve.png", SAMPLES_NAME,
             MODEL_FOLDER, "videos")
"""What a run writes (besides TensorBoard's events files); ``--overwrite`` removes exactly these.
``videos/`` holds ``--capture-video``'s and ``omnigym eval --video``'s videos (envs/video.py).
``model/`` is the trained model as a Hugging Face folder (language runs). ``stages/`` holds the
finished runs a demo pipeline made on the way (``omnigym train rlhf`` with no flags); they are
reused by ``--overwrite`` and removed by ``abandon`` only when this process made them."""

_active: "Run | None" = None


def active_run() -> "Run | None":
    """The run this process began last (the CLI reports on it when interrupted or failing)."""
    return _active


class Run:
    def __init__(self, run_dir: Path, algo: str, cfg, saved: dict | None, replace: bool = False):
        self.dir, self.algo, self.cfg = run_dir, algo, cfg
        self.saved = saved
        """the loaded checkpoint when resuming, else None"""
        self.checkpointer = Checkpointer(run_dir)
        self.metrics: MetricsLog | None = None
        self.last_checkpoint = saved["counters"] if saved else None
        """the counters of the newest checkpoint on disk (None before the first)"""
        self._replace = replace
        self._created = [p for p in [run_dir, *run_dir.parents] if not p.exists()]
        """the directories ``begin`` will create (``abandon`` removes them again)"""
        self._saved_here = False
        self._set_aside: Path | None = None
        self._config_before: bytes | None = None
        self._events_before: set[Path] = set()
        self.made_stages = False
        """set by a demo pipeline that created ``stages/`` for this run (``abandon`` removes it)"""
        self.writer = is_main_process()
        """False in the other processes of a data-parallel run: they read the checkpoint and
        take part in gathering it, and write nothing"""

    def begin(self, components: dict) -> dict:
        """Restore the checkpoint into ``components`` when resuming, then write the run's
        config and open its log. Returns the saved counters ({} for a new run)."""
        global _active
        counters = self._restore(components) if self.saved else {}
        if not self.writer:
            return counters
        self._events_before = set(self.dir.glob("events.out.tfevents.*"))
        self._config_before = (self.dir / CONFIG_NAME).read_bytes() if self.saved else None
        _active = self
        try:
            if self._replace:
                self._set_aside = set_aside_run_files(self.dir)
            self.dir.mkdir(parents=True, exist_ok=True)
            config_dict = {"algo": self.algo, **dataclasses.asdict(self.cfg)}
            (self.dir / CONFIG_NAME).write_text(json.dumps(config_dict, indent=2, default=describe))
            self.metrics = MetricsLog(self.dir, config_dict, append=self.saved is not None,
                                      tensorboard=self.cfg.tensorboard, wandb=self.cfg.wandb)
            if self.saved:
                self.metrics.load_state_dict(self.saved["components"]["metrics"])
        except OSError as exc:
            self.abandon()
            raise OmnigymError(f"cannot write to run directory {self.dir}: {exc.strerror}; "
                               "choose another --run-dir") from None
        except BaseException:
            self.abandon()
            raise
        return counters

    def _restore(self, components: dict) -> dict:
        try:
            return self.checkpointer.restore(self.saved, components)
        except (RuntimeError, KeyError, ValueError, TypeError) as exc:
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise OmnigymError(f"the checkpoint in {self.dir} does not fit this run's settings ({detail}); "
                               "resume with the settings in its config.json, or start a new run") from None

    def log(self, step: int, metrics: dict) -> None:
        if self.writer:
            self.metrics.log(step, metrics)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        if self.writer:
            self.metrics.log_samples(step, rows)

    def export_model(self, model, tokenizer) -> Path:
        """The trained model as a Hugging Face folder, ``model/`` in the run (LoRA merged into a
        copy), so that ``--model RUN_DIR`` starts the next stage from it."""
        import copy

        folder = self.dir / MODEL_FOLDER
        if not self.writer:
            return folder
        plain = copy.deepcopy(model).merge_and_unload() if hasattr(model, "merge_and_unload") else model
        plain.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        return folder

    def save(self, components: dict, **counters) -> None:
        if not self.writer:  # its part in gathering sharded state, nothing written
            for component in components.values():
                if hasattr(component, "state_dict"):
                    component.state_dict()
            self.last_checkpoint = counters
            return
        self.checkpointer.save({**components, "metrics": self.metrics}, **counters)
        self.last_checkpoint = counters
        self._saved_here = True
        self._drop_set_aside()

    def close(self, plot: bool = True, metric: str = "charts/episodic_return") -> Path | None:
        global _active
        _active = None
        if not self.writer:
            return None
        self.metrics.close()
        self._drop_set_aside()
        if not plot:
            return None
        from omnigym.track.files import read_metrics
        from omnigym.track.plot import plot_runs

        if not any(metric in row for row in read_metrics(self.dir)):  # a short run that ended no episode
            self.say(f"no learning curve: the run logged no {metric} (no episode ended)")
            return None
        return plot_runs([self.dir], self.dir / "curve.png", metric=metric)

    def _drop_set_aside(self) -> None:
        """The replaced run (``--overwrite``) is deleted once the new one has a checkpoint."""
        if self._set_aside is not None:
            shutil.rmtree(self._set_aside, ignore_errors=True)
            self._set_aside = None

    def abandon(self) -> None:
        """After a failure or Ctrl-C before this process wrote a checkpoint, put the
        directory back as it was: a resumed run gets its config.json and its log up to the
        checkpoint back; a new run's files and the folders it made go, and a run it was
        replacing (``--overwrite``) comes back."""
        if self._saved_here or not self.writer:
            return  # the run has a checkpoint of this process; the CLI says how to continue
        if self.metrics is not None:
            self.metrics.close()
        for events in set(self.dir.glob("events.out.tfevents.*")) - self._events_before:
            events.unlink()
        if self.saved:
            (self.dir / CONFIG_NAME).write_bytes(self._config_before)
            with open(self.dir / METRICS_NAME, "r+b") as log:
                log.truncate(self.saved["components"]["metrics"]["offset"])
            return
        remove_run_files(self.dir)
        if self.made_stages:
            shutil.rmtree(self.dir / STAGES_FOLDER, ignore_errors=True)
        if self._set_aside is not None:
            for kept in self._set_aside.iterdir():
                kept.rename(self.dir / kept.name)
            self._set_aside.rmdir()
            self._set_aside = None
        for folder in self._created:
            if folder.exists() and not any(folder.iterdir()):
                folder.rmdir()

    def say(self, *lines: str) -> None:
        """The closing lines a person reads (stderr, so stdout stays the episode stream)."""
        for line in lines if self.writer else ():
            print(line, file=sys.stderr)

    def state_line(self) -> str:
        """Where the run stands, for a message about a run that stopped early."""
        if self.last_checkpoint is None:
            return (f"no checkpoint was written yet (one comes every --checkpoint-every steps), so there is nothing "
                    f"to resume; {self.dir} was put back as it was before the start")
        at = ", ".join(f"{k} {v}" for k, v in self.last_checkpoint.items() if type(v) is int and k != "update")
        return f"continue with: omnigym train {self.algo} --resume {self.dir}  (last checkpoint: {at})"


def describe(value) -> str:
    """How config.json records a Python object given as a flag (an env class or factory):
    ``module:qualname`` when it can be imported again by that name."""
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if module and qualname and "<" not in qualname and module != "__main__":
        return f"{module}:{qualname}"
    return repr(value)


def is_run_dir(path: Path) -> bool:
    return any((path / name).exists() for name in (CONFIG_NAME, METRICS_NAME, CHECKPOINT_NAME))


def set_aside_run_files(path: Path) -> Path:
    """Move a run's files into a hidden folder of its directory (``--overwrite``), from which
    ``Run.abandon`` can bring them back."""
    aside = path / ".replaced-run"
    aside.mkdir(exist_ok=True)
    for name in [*RUN_FILES, "wandb", *(p.name for p in path.glob("events.out.tfevents.*"))]:
        if (path / name).exists():
            (path / name).rename(aside / name)
    return aside


def forget_active_run() -> None:
    """A new command starts with no run (the CLI calls this; tests call main() many times)."""
    global _active
    _active = None


def remove_run_files(path: Path) -> None:
    for name in RUN_FILES:
        if (path / name).is_dir():
            shutil.rmtree(path / name)
        else:
            (path / name).unlink(missing_ok=True)
    for events in path.glob("events.out.tfevents.*"):
        events.unlink()
    shutil.rmtree(path / "wandb", ignore_errors=True)


def default_run_dir(algo: str, label, seed: int) -> str:
    label = re.sub(r"[^\w.\-]+", "-", label if isinstance(label, str) else describe(label).split(":")[-1])
    base = os.path.join("runs", f"{algo}__{label}__{seed}__{int(time.time())}")
    name, n = base, 1
    while os.path.exists(name):  # two runs started in the same second
        n += 1
        name = f"{base}-{n}"
    return name


def check_writable(path: Path) -> None:
    """``path`` can be created: its nearest existing ancestor is a writable directory."""
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        why = "is not a directory" if not parent.is_dir() else "is not writable"
        raise OmnigymError(f"cannot write to run directory {path}: {parent} {why}; choose another --run-dir")


def start_run(cfg, algo: str, label: str) -> Run:
    """The run directory of ``cfg`` (``--resume`` or ``--run-dir``, else a new name from
    ``label``), checked, and its checkpoint when resuming. Nothing is written until ``begin``.
    In a data-parallel run the first process decides and checks, and tells the others its
    directory, or its refusal (which they raise too, silently: the first one says it)."""
    if not is_main_process():
        told = broadcast(None)
        if "refused" in told:
            raise OmnigymError(told["refused"])
        cfg.run_dir = told["run_dir"]
        return Run(Path(cfg.run_dir), algo, cfg, Checkpointer(cfg.run_dir).load() if cfg.resume else None)
    try:
        run_dir, saved = checked_run_dir(cfg, algo, label)
    except OmnigymError as refusal:
        broadcast({"refused": str(refusal)})
        raise
    cfg.run_dir = broadcast({"run_dir": str(run_dir)})["run_dir"]
    if getattr(cfg, "preset_line", None):  # the control preset applied (config.py's with_preset)
        print(cfg.preset_line, flush=True)
    return Run(run_dir, algo, cfg, saved, replace=cfg.overwrite and is_run_dir(run_dir))


def checked_run_dir(cfg, algo: str, label: str) -> tuple[Path, dict | None]:
    """The directory the run may use, and its checkpoint when resuming; refuses in one line."""
    if cfg.resume:
        run_dir = Path(cfg.resume)
        if cfg.run_dir and Path(cfg.run_dir).resolve() != run_dir.resolve():
            raise OmnigymError("give either --resume RUN_DIR or --run-dir, not two different directories")
        check_resumable(cfg, algo, load_config_dict(run_dir))
        saved = Checkpointer(run_dir).load()
        check_saved_state(cfg, run_dir, saved)
    else:
        run_dir, saved = Path(cfg.run_dir or default_run_dir(algo, label, cfg.seed)), None
        if run_dir.exists() and not run_dir.is_dir():
            raise OmnigymError(f"--run-dir {run_dir} is a file; choose a directory")
        if run_dir.is_dir() and is_run_dir(run_dir) and not cfg.overwrite:
            raise OmnigymError(f"{run_dir} already holds a run; continue it with --resume {run_dir}, "
                               "or replace it with --overwrite")
        if run_dir.is_dir() and not is_run_dir(run_dir) and any(run_dir.iterdir()):
            raise OmnigymError(f"{run_dir} is not empty and holds no omnigym run; choose a new or empty --run-dir")
        check_writable(run_dir)
    return run_dir, saved


def check_saved_state(cfg, run_dir: Path, saved: dict) -> None:
    """The run has steps left, and its log still reaches the checkpoint (it is cut back to it)."""
    if cfg.BUDGET:
        flag_name, counter = cfg.BUDGET
        done, goal = saved["counters"].get(counter, 0), getattr(cfg, flag_name)
        if done >= goal:
            raise OmnigymError(f"{run_dir} is already at {counter} {done} of --{flag_name.replace('_', '-')} {goal}; "
                               f"give a larger --{flag_name.replace('_', '-')} to continue it")
    log, offset = run_dir / METRICS_NAME, saved["components"]["metrics"]["offset"]
    if not log.is_file() or log.stat().st_size < offset:
        raise OmnigymError(f"{log} is missing or shorter than when the checkpoint was written; put it back "
                           "(a resumed run's log continues it), or start a new run")


def check_resumable(cfg, algo: str, saved_config: dict) -> None:
    """A run continues with the algorithm and the settings its checkpoint was made with;
    ``cfg.RESUME_FIXED`` names the settings that cannot change (shapes, envs, data)."""
    made_by = saved_config.get("algo")
    if made_by != algo:
        raise OmnigymError(f"{cfg.resume} is a {made_by} run; continue it with: "
                           f"omnigym train {made_by} --resume {cfg.resume}")
    for name in getattr(cfg, "RESUME_FIXED", ()):
        now, then = getattr(cfg, name, None), saved_config.get(name)
        now = json.loads(json.dumps(now, default=describe))
        if then is not None and now != then:
            def shown(value):
                return " ".join(map(str, value)) if isinstance(value, list) else str(value)

            raise OmnigymError(f"{cfg.resume} was made with --{name.replace('_', '-')} {shown(then)}, not "
                               f"{shown(now)}; its checkpoint only fits its own setting (leave the flag out to keep it)")
