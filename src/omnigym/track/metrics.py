"""The metrics log of a run: ``metrics.jsonl``, TensorBoard's events, ``samples.jsonl`` and W&B.

What crosses this module: a run directory that exists (``Run.begin`` made it) and the
config as a dict (for W&B) go in; rows of metrics and samples come in one step at a time.
Its checkpoint state is the byte offsets of the two JSON-lines files and the last step, so
that restoring a checkpoint cuts the log back to it (and TensorBoard drops what came after).
It knows nothing about checkpoints, resuming or which run is active.

A write that fails (a full disk) raises a ``DiskFault`` naming the file, at the step that
wrote it. TensorBoard's events are written here, in the run's own thread, with TensorBoard's
record format and protos: its ``SummaryWriter`` writes from a background thread, whose failure
printed a thread traceback and surfaced only at some later call.
"""

from __future__ import annotations

import io
import json
import math
import os
import socket
import time
from pathlib import Path

from omnigym.errors import OmnigymError
from omnigym.track.files import METRICS_NAME, DiskFault, as_disk_fault, write_all, write_fault

SAMPLES_NAME = "samples.jsonl"


class EventsFile:
    """One TensorBoard events file, written synchronously: what ``SummaryWriter`` writes (the
    file-version event, the purge marker of a resumed run, scalar and text summaries), so that a
    failed write raises here, in the caller's thread, naming the file."""

    def __init__(self, run_dir: Path, purge_step: int | None):
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._event = Event
        now = time.time()
        # SummaryWriter's name, with nanoseconds in place of its process-wide counter; zero-padded
        # so that a run resumed within the same second sorts after the file it continues
        # (TensorBoard reads a folder's files in name order: "999" sorted after "1000000")
        self.path = run_dir / (f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}."
                               f"{time.time_ns() % 10**9:09d}")
        self._pending = io.BytesIO()  # the records of one step, written in one go by flush
        self._records = RecordWriter(self._pending)
        with write_fault(self.path):
            self._file = open(self.path, "xb", buffering=0)
            self._add(Event(wall_time=now, step=purge_step or 0, file_version="brain.Event:2"))
            if purge_step is not None:  # TensorBoard hides the points at and after it written earlier
                self._add(Event(wall_time=now, step=purge_step, session_log=SessionLog(status=SessionLog.START)))
            self.flush()

    def _add(self, event) -> None:
        self._records.write(event.SerializeToString())

    def add_scalars(self, step: int, values: dict) -> None:
        from torch.utils.tensorboard.summary import scalar

        for name, value in values.items():  # into memory: flush writes them
            self._add(self._event(wall_time=time.time(), step=step, summary=scalar(name, value)))

    def add_text(self, tag: str, text: str, step: int) -> None:
        from torch.utils.tensorboard.summary import text as text_summary

        self._add(self._event(wall_time=time.time(), step=step, summary=text_summary(tag, text)))

    def flush(self) -> None:
        data = self._pending.getvalue()
        self._pending.seek(0)
        self._pending.truncate()  # a step whose write failed is dropped here, not written later
        with write_fault(self.path):
            write_all(self._file, data)

    def close(self) -> None:
        with write_fault(self.path):
            self._file.close()


class MetricsLog:
    """Metrics as JSON lines, TensorBoard scalars and (optionally) W&B, one row per step.

    Its state is the byte offset of the log: a checkpoint stores it, and loading it cuts
    off the rows written after that checkpoint."""

    def __init__(self, run_dir: Path, config_dict: dict, append: bool, tensorboard: bool = True, wandb: bool = False):
        self.dir = run_dir
        with write_fault(run_dir / METRICS_NAME):
            self._file = open(run_dir / METRICS_NAME, "ab" if append else "wb", buffering=0)
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

    def _board(self) -> EventsFile:
        """TensorBoard's events file, opened on first use: importing TensorBoard costs a
        noticeable part of a CartPole run's start-up."""
        if self._tb is None:
            self._tb = EventsFile(self.dir, self._purge_step)
        return self._tb

    @staticmethod
    def row(step: int, metrics: dict) -> tuple[dict, bytes]:
        """The values logged (NaN left out) and their line in metrics.jsonl."""
        clean = {k: (float(v) if not isinstance(v, (int, str)) else v) for k, v in metrics.items()}
        clean = {k: v for k, v in clean.items() if not (isinstance(v, float) and math.isnan(v))}
        return clean, (json.dumps({"global_step": step, **clean}) + "\n").encode()

    def log(self, step: int, metrics: dict) -> None:
        clean, line = self.row(step, metrics)
        with write_fault(self.dir / METRICS_NAME):
            write_all(self._file, line)
        self._last_step = step
        if self._use_tensorboard:
            board = self._board()
            board.add_scalars(step, {k: v for k, v in clean.items() if isinstance(v, (int, float))})
            board.flush()
        if self._wandb is not None:
            self._wandb.log(clean, step=step)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        """A few prompts with their completions and rewards: a line each in samples.jsonl, and
        one table per step in TensorBoard's text tab."""
        with write_fault(self.dir / SAMPLES_NAME):
            if self._samples is None:
                self._samples = open(self.dir / SAMPLES_NAME, self._samples_mode, buffering=0)
            write_all(self._samples, "".join(json.dumps({"global_step": step, **row}) + "\n" for row in rows).encode())
        if self._use_tensorboard and rows:
            columns = list(rows[0])
            cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
            table = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            table += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
            self._board().add_text("samples", "\n".join(table), step)
            self._board().flush()

    def state_dict(self) -> dict:
        with write_fault(self.dir / METRICS_NAME):
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
        """Close every file, even when one of them cannot write what it still held (a full
        disk); then raise the first such failure."""
        fault: DiskFault | None = None
        for path, handle in [(self.dir / METRICS_NAME, self._file), (self.dir / SAMPLES_NAME, self._samples),
                             (None, self._tb)]:
            if handle is None:
                continue
            try:
                handle.close()
            except (OSError, DiskFault) as exc:
                fault = fault or as_disk_fault(exc, path)
                if as_disk_fault(exc, path) is None:
                    raise
        self._samples = self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        if fault is not None:
            raise fault
