"""The run an algorithm holds, and the call of ``train()`` it belongs to.

A run starts in two steps, so that a start that fails leaves the disk as it was:

- ``start_run(cfg, algo, label)`` decides the directory and checks it (``resume.py``: a new
  or empty directory; an existing run only with ``--resume`` or ``--overwrite``; on
  ``--resume`` a run of the same algorithm, made with the settings the checkpoint needs) and
  loads the checkpoint. It writes nothing but the directory's lock (``lock.py``: one process
  per run directory), which goes again, with a directory made for it, when the run does not start.
- ``run.begin(components)``, once the algorithm has built everything, restores the
  checkpoint into the components (when resuming), and only then creates the directory
  (``run_dir.py``'s transaction), writes ``config.json`` and opens the metrics log
  (``metrics.py``), rolled back to the checkpoint so that a resumed run's log equals an
  uninterrupted one. It returns the saved counters.

What crosses this module: the algorithm gives ``start_run`` its config (read, never
changed), its name and a label for a new directory's name, and then calls the ``Run``'s
methods. What is not in the config travels in a ``TrainCall``, one per call of
``train()``: the flags the user gave (from the CLI), the preset line, a directory decided
before ``start_run``, and the run once it has begun (so that whoever made the call can
undo it or say where it stands). ``process.scoped_run`` makes the call current for the
duration of ``train()``; ``start_run`` and ``decided_run_dir`` read it from there.

Why a context variable: ``train(cfg)`` and ``start_run(cfg, algo, label)`` are what every
algorithm file is written against, so the call cannot be passed through them. A
``ContextVar`` holds one value per thread (a new thread starts with none) and per asyncio
task, and ``scoped_run`` resets it when ``train()`` returns, so runs on different threads of
one process (a training server) never see each other's, and no module-level value changes.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from omnigym.distributed import broadcast, is_main_process, launched_by_torchrun
from omnigym.errors import OmnigymError, show_flag, without_dots
from omnigym.track import stopping
from omnigym.track.checkpoint import Checkpointer
from omnigym.track.files import CONFIG_NAME, DiskFault, as_disk_fault, describe, load_config_dict, write_atomically
from omnigym.track.lock import RunLock
from omnigym.track.metrics import MetricsLog
from omnigym.track.model_folder import mark_resumed, save_model_folder
from omnigym.track.resume import (DATA_FILES_KEY, PATHS_KEY, WEIGHTS_KEY, checked_run_dir, recorded_data,
                                  recorded_paths, recorded_weights, same_path)
from omnigym.track.run_dir import (MODEL_FOLDER, STAGES_FOLDER, RunDirectory, default_run_dir, is_run_dir,
                                   refuse_a_broken_link)

__all__ = ["MODEL_FOLDER", "STAGES_FOLDER", "Run", "TrainCall", "current_call", "decided_run_dir", "start_run",
           "within_call"]


@dataclass
class TrainCall:
    """One call of an algorithm's ``train(cfg)``: what its caller knows beyond the config, and
    what the run decided. Made by the caller (the CLI) or by ``scoped_run``; never shared."""

    given_flags: set[str] | None = None
    """the config fields the user named on the command line (a preset never overrides them);
    None from Python: the fields away from their defaults count as given"""
    preset_line: str | None = None
    """what the control preset filled in, printed when the run starts (set by ``scoped_run``)"""
    resume_line: str | None = None
    """the settings a resume changes (the CLI's), printed when the run starts: they passed in silence"""
    run_dir: str | None = None
    """the directory the run writes to: set by ``start_run``, or before it for a run whose user
    named none (``--capture-video``'s folder, ``--ray-trainer``'s interrupted-run message)"""
    run: Run | None = None
    """the run once it has begun writing, until it closes: ``scoped_run`` undoes it on a failure,
    the CLI says where it stands"""
    started: Run | None = None
    """the run from ``start_run`` on: before it begins, a demo's finished stages may be all it
    has written, and the CLI's line for a stop or an error names them"""
    lock: RunLock | None = None
    """the run directory's lock, from ``start_run`` until the run closes: ``scoped_run`` lets it go
    however ``train()`` ends"""
    finished: str | None = None
    """what to say of the run once it has closed (a Ctrl-C in the lines printed after it must not
    say the run never started)"""

    def release_lock(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def run_dir_for(self, cfg, algo: str, label) -> str:
        """The directory this call's run writes to, deciding (and keeping) a new name when the
        user gave neither ``--resume`` nor ``--run-dir``."""
        if cfg.resume or cfg.run_dir:
            return str(without_dots(cfg.resume or cfg.run_dir))
        if self.run_dir is None:
            self.run_dir = default_run_dir(algo, label, cfg.seed)
        return self.run_dir


_current_call: contextvars.ContextVar[TrainCall | None] = contextvars.ContextVar("omnigym_train_call", default=None)


@contextmanager
def within_call(call: TrainCall):
    """``call`` is the current one in this thread (or task) until the block ends."""
    token = _current_call.set(call)
    try:
        yield call
    finally:
        _current_call.reset(token)


def current_call() -> TrainCall:
    """The ``train()`` call running in this thread; outside one (``start_run`` called directly),
    a fresh call that nobody else holds."""
    return _current_call.get() or TrainCall()


def decided_run_dir(cfg, algo: str, label) -> str:
    """The directory the current call's run will use; ``start_run`` then uses the same one."""
    return current_call().run_dir_for(cfg, algo, label)


class Run:
    def __init__(self, run_dir: Path, algo: str, cfg, saved: dict | None, replace: bool = False,
                 call: TrainCall | None = None, lock: RunLock | None = None):
        self.dir, self.algo, self.cfg = run_dir, algo, cfg
        self.lock = lock
        """this process's lock on the directory (``start_run``), let go when the run closes or is abandoned"""
        self.saved = saved
        """the loaded checkpoint when resuming, else None"""
        self.checkpointer = Checkpointer(run_dir)
        self.metrics: MetricsLog | None = None
        self.last_checkpoint = saved["counters"] if saved else None
        """the counters of the newest checkpoint on disk (None before the first)"""
        self._directory = RunDirectory(run_dir, saved["components"]["metrics"]["offset"] if saved else None, replace)
        self._call = call
        self._saving: tuple | None = None
        """(the checkpoint file before it, the counters) while a save is under way"""
        self.finished_stages: list[str] = []
        """the demo stages in ``stages/`` that are whole (made by this run or reused): a run that
        stops before its first checkpoint keeps them, and a new start with ``--run-dir`` reuses them"""
        self.kept_settings: dict = {}
        """a resumed run's saved settings this version does not know (a newer version's): kept in config.json"""
        self.writer = is_main_process()
        """False in the other processes of a data-parallel run: they read the checkpoint and
        take part in gathering it, and write nothing"""
        self.deferring_stops = False
        """a SIGTERM waits for this run's next checkpoint (``stopping.py``), from ``begin`` to ``close``"""
        if call is not None:
            call.started = self

    def config_dict(self) -> dict:
        """What config.json holds: the algorithm, the config's fields, and the directory the run
        writes to (decided by ``start_run`` when the user named none)."""
        values = dataclasses.asdict(self.cfg)
        values["run_dir"] = str(self.dir)
        data_files = recorded_data(self.cfg)  # absolute paths and fingerprints (track/resume.py)
        extra = {DATA_FILES_KEY: data_files} if data_files else {}
        paths = recorded_paths(self.cfg)  # where relative --model, --teacher, ... were (track/resume.py)
        extra.update({PATHS_KEY: paths} if paths else {})
        weights = recorded_weights(self.cfg)  # what those model folders held, checked on resume
        extra.update({WEIGHTS_KEY: weights} if weights else {})
        return {"algo": self.algo, **self.kept_settings, **values, **extra}

    def begin(self, components: dict) -> dict:
        """Restore the checkpoint into ``components`` when resuming, then write the run's
        config and open its log. Returns the saved counters ({} for a new run)."""
        counters = self._restore(components) if self.saved else {}
        if not self.writer:
            return counters
        if self._call is not None:
            self._call.run = self
        if self.saved:
            self.kept_settings = self.cfg.unknown_settings(load_config_dict(self.dir))
        try:
            with self.disk_faults():
                self._directory.open()
                config_dict = self.config_dict()
                # whole or not at all: a resumed run's config.json stays as it was on a full disk
                write_atomically(self.dir / CONFIG_NAME, json.dumps(config_dict, indent=2, default=describe).encode())
                self.metrics = MetricsLog(self.dir, config_dict, append=self.saved is not None,
                                          tensorboard=self.cfg.tensorboard, wandb=self.cfg.wandb)
                if self.saved:
                    self.metrics.load_state_dict(self.saved["components"]["metrics"])
                    if self.cfg.FINAL_MODEL:  # its model/, if any, is from before this resume until the end
                        mark_resumed(self.dir / MODEL_FOLDER, self.algo, self.dir)
            if self.kept_settings:
                print(f"omnigym: note: {self.dir / CONFIG_NAME} has settings this version does not know, kept as "
                      f"they are and not used: {', '.join(self.kept_settings)}", file=sys.stderr)
        except OSError as exc:
            self.abandon()
            if as_disk_fault(exc, self.dir) is not None:  # the directory itself could not be made
                raise as_disk_fault(exc, self.dir).then(self._after_fault()) from None
            raise OmnigymError(f"cannot write to run directory {self.dir}: {exc.strerror}; "
                               "choose another --run-dir") from None
        except BaseException:
            self.abandon()
            raise
        self.deferring_stops = stopping.begin_deferring(not launched_by_torchrun(),
                                                        60.0 * self.cfg.checkpoint_minutes)
        return counters

    def _restore(self, components: dict) -> dict:
        try:
            return self.checkpointer.restore(self.saved, components)
        except (RuntimeError, KeyError, ValueError, TypeError) as exc:
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise OmnigymError(f"the checkpoint in {self.dir} does not fit this run's settings ({detail}); "
                               "resume with the settings in its config.json, or start a new run") from None

    def _after_fault(self) -> str:
        """What to do about a failed write once there is space again, from where the run stands."""
        if self.last_checkpoint is None:
            return f"start the run again ({self.dir} is put back as it was before the start)"
        return self.state_line()

    @contextmanager
    def disk_faults(self):
        """A write of this run that fails (a full disk) says what to do next (``_after_fault``)."""
        try:
            yield
        except DiskFault as fault:
            raise fault.then(self._after_fault()) from None

    def log(self, step: int, metrics: dict) -> None:
        if self.writer:
            with self.disk_faults():
                self.metrics.log(step, metrics)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        if self.writer:
            with self.disk_faults():
                self.metrics.log_samples(step, rows)

    def export_model(self, model, tokenizer) -> Path:
        """The trained model as a Hugging Face folder, ``model/`` in the run (LoRA merged into a
        copy), so that ``--model RUN_DIR`` starts the next stage from it. Written whole or not at
        all (``model_folder.py``): a run is finished only once its ``model/`` exists."""
        folder = self.dir / MODEL_FOLDER
        if not self.writer:
            return folder
        with self.disk_faults():
            return save_model_folder(model, tokenizer, folder)

    def save(self, components: dict, **counters) -> None:
        if not self.writer:  # its part in gathering sharded state, nothing written
            for component in components.values():
                if hasattr(component, "state_dict"):
                    component.state_dict()
            self.last_checkpoint = counters
            return
        stopping.saving_for_stop()
        self._saving = (self._checkpoint_on_disk(), counters)
        try:
            with self.disk_faults():
                self.checkpointer.save({**components, "metrics": self.metrics}, **counters)
        finally:
            self._settle_save()
        if self.deferring_stops:
            stopping.checkpoint_written()
            stopping.stop_if_requested()  # the checkpoint a SIGTERM waited for is on disk

    def _settle_save(self) -> None:
        """A SIGTERM or Ctrl-C can land anywhere in a save, this very method included (``abandon``
        settles again then): what counts is the disk. Renamed into place, the new checkpoint is
        the run's (it is not rolled back, and the message names it); else the previous one
        stands, and no half file stays beside it."""
        if self._saving is None:
            return
        before, counters = self._saving
        if self._checkpoint_on_disk() != before:
            self.last_checkpoint = counters
            self._directory.commit()
        else:
            self.checkpointer.path.with_name(self.checkpointer.path.name + ".tmp").unlink(missing_ok=True)
        self._saving = None

    def _checkpoint_on_disk(self) -> tuple | None:
        """Which file ``checkpoint.pt`` is (a rename over it makes another), None before the first."""
        try:
            found = self.checkpointer.path.stat()
        except FileNotFoundError:
            return None
        return found.st_ino, found.st_dev, found.st_mtime_ns

    def close(self, plot: bool = True, metric: str | tuple[str, ...] = "charts/episodic_return") -> Path | None:
        """``metric``: the curve's metric, or several (one panel each, the first the main one)."""
        try:
            picture = self._close(plot, metric)
        except BaseException:
            self._stop_deferring()
            raise
        # a SIGTERM after the last checkpoint: the process stops here, not in what follows the run
        self._stop_deferring(finished=self.finished_line())
        return picture

    def finished_line(self) -> str:
        return f"the run had finished; it is in {self.dir}"

    def _stop_deferring(self, finished: str | None = None) -> None:
        if self.deferring_stops:
            self.deferring_stops = False
            stopping.end_deferring(finished)

    def _close(self, plot: bool, metric) -> Path | None:
        if self._call is not None and self._call.run is self:
            self._call.run = self._call.started = None  # finished: nothing for the caller to undo or report
            self._call.finished = self.finished_line()
        if not self.writer:
            return None
        try:
            with self.disk_faults():
                self.metrics.close()
            self._directory.drop_replaced()
            if not plot:
                return None
            from omnigym.track.files import read_metrics, write_fault
            from omnigym.track.plot import plot_runs

            main = metric if isinstance(metric, str) else metric[0]
            if not any(main in row for row in read_metrics(self.dir)):  # a short run that ended no episode
                why = "no episode ended" if main == "charts/episodic_return" else "it was never measured"
                self.say(f"no learning curve: the run logged no {main} ({why})")
                return None
            curve = self.dir / "curve.png"
            try:
                with write_fault(curve):
                    return plot_runs([self.dir], curve, metric=metric)
            except DiskFault as fault:  # the run itself is whole; only its picture is missing
                curve.unlink(missing_ok=True)
                which = "" if metric == "charts/episodic_return" else f" --metric {metric}"
                raise fault.then(f"draw it with: omnigym plot {self.dir} --out {curve}{which}  "
                                 "(the run itself finished)") from None
        finally:
            self._release_lock()

    def _release_lock(self) -> None:
        if self.lock is not None:
            self.lock.release()
        if self._call is not None and self._call.lock is self.lock:
            self._call.lock = None

    def abandon(self) -> None:
        """After a failure or Ctrl-C before this process wrote a checkpoint, put the
        directory back as it was: a resumed run gets its config.json and its log up to the
        checkpoint back; a new run's files and the folders it made go, and a run it was
        replacing (``--overwrite``) comes back."""
        try:
            with stopping.signals_held():  # a second Ctrl-C here left the directory half put back
                if self.writer:
                    self._settle_save()  # a save the signal cut short may have put its checkpoint in place
                if self._directory.committed or not self.writer:
                    return  # the run has a checkpoint of this process; the CLI says how to continue
                put_back = self._directory.put_back_stages()  # the old ones, in place of what this start made again
                self.finished_stages = [name for name in self.finished_stages if name not in put_back]
                if self.metrics is not None:
                    try:
                        self.metrics.close()
                    except OmnigymError:  # a full disk: what the log still held is lost with the run anyway
                        pass
                self._directory.roll_back()
        finally:
            self._release_lock()  # after the roll-back: nobody else sees the directory half put back
            self._stop_deferring()

    def set_aside_stage(self, stage: Path) -> None:
        """Keep the stage at ``stage`` until this run has a checkpoint (``RunDirectory.set_aside_stage``):
        a demo pipeline calls it before it makes that stage again."""
        if self.writer:
            self._directory.set_aside_stage(stage)

    def say(self, *lines: str) -> None:
        """The closing lines a person reads (stderr, so stdout stays the episode stream)."""
        for line in lines if self.writer else ():
            print(line, file=sys.stderr)

    def kept_stages_line(self) -> str:
        """What a stop before the first checkpoint leaves of this run: its finished stages."""
        return (f"its finished stages ({', '.join(self.finished_stages)}) are kept in {self.dir / STAGES_FOLDER}: "
                f"the same command with --run-dir {self.dir} reuses them")

    def _changed_settings(self) -> dict:
        """The settings of this run's config that its config.json on disk does not hold."""
        try:
            saved = load_config_dict(self.dir)
        except (OmnigymError, OSError):
            return {}
        now = json.loads(json.dumps(dataclasses.asdict(self.cfg), default=describe))  # as config.json holds it
        return {name: getattr(self.cfg, name) for name, value in now.items()
                if name not in ("resume", "run_dir") and name in saved and value != saved[name]
                and not same_path(name, value, saved[name], saved)}

    def state_line(self) -> str:
        """Where the run stands, for a message about a run that stopped early."""
        if self.last_checkpoint is None:
            return ("no checkpoint was written yet (one comes every --checkpoint-every steps or --checkpoint-minutes), "
                    f"so there is nothing to resume; {self.dir} was put back as it was before the start"
                    + (f", except that {self.kept_stages_line()}" if self.finished_stages else ""))
        at = ", ".join(f"{k} {v}" for k, v in self.last_checkpoint.items() if type(v) is int and k != "update")
        again = ""
        if self.saved is not None and not self._directory.committed:
            # A resume that wrote no checkpoint put config.json back as it was: what this command
            # changed (a longer --total-timesteps) is lost unless it is said again.
            again = "".join(f" {show_flag(name, value)}" for name, value in self._changed_settings().items())
        return f"continue with: omnigym train {self.algo} --resume {self.dir}{again}  (last checkpoint: {at})"


def start_run(cfg, algo: str, label) -> Run:
    """The run directory of ``cfg`` (``--resume`` or ``--run-dir``, else the one this call
    decided already, else a new name from ``label``), checked, and its checkpoint when
    resuming. Nothing is written until ``begin``. In a data-parallel run the first process
    decides and checks, and tells the others its directory, or its refusal (which they raise
    too, silently: the first one says it)."""
    call = current_call()
    if not is_main_process():
        told = broadcast(None)
        if "refused" in told:
            raise OmnigymError(told["refused"])
        run_dir = Path(told["run_dir"])
        return Run(run_dir, algo, cfg, Checkpointer(run_dir).load() if told.get("resumed") else None, call=call)
    # One process per run directory: the lock comes before the checks (a run being written is
    # refused as in use, not judged half-made) and before anything is written; a new directory
    # is made for it (removed again if the run does not start). GRPO's warm-up and the RLHF
    # demo's stages, written before ``begin``, are under it too.
    refuse_a_broken_link(Path(call.run_dir_for(cfg, algo, label)), "--resume" if cfg.resume else "--run-dir")
    lock = RunLock(Path(call.run_dir_for(cfg, algo, label)))
    try:
        locked = lock.acquire(create=not cfg.resume)
        run_dir, saved = checked_run_dir(cfg, algo, label, decided=call.run_dir)
        if not locked and Path(run_dir).is_dir():  # the checks passed, yet no file can be made in it
            raise OmnigymError(f"cannot write to run directory {run_dir}; choose another --run-dir")
    except BaseException as refusal:
        lock.release()
        if isinstance(refusal, OmnigymError):
            broadcast({"refused": str(refusal)})
        raise
    call.lock = lock if locked else None
    restart = bool(cfg.resume) and saved is None  # resume.py's restarts(): killed before its first checkpoint
    if restart:
        print(f"{run_dir} has no checkpoint (its process stopped before writing the first one): "
              "starting it again from step 0 with its config", file=sys.stderr, flush=True)
    # the caller learns where the run writes; the other processes, whether there is a checkpoint to load
    call.run_dir = broadcast({"run_dir": str(run_dir), "resumed": saved is not None})["run_dir"]
    if call.preset_line:  # the control preset applied (config.py's apply_preset)
        print(call.preset_line, flush=True)
    if call.resume_line:
        print(call.resume_line, flush=True)
    return Run(run_dir, algo, cfg, saved, replace=(cfg.overwrite or restart) and is_run_dir(run_dir), call=call,
               lock=call.lock)
