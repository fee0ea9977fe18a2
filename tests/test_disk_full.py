"""A full disk at each write of a run (issue 25): one line naming the file and what to do, exit
code 2, no traceback, the previous checkpoint whole, no ``.tmp`` left; a run without a checkpoint
is put back as before the start, one with a checkpoint resumes, once there is space again, to
the metrics of a run never interrupted.

The disk is a real 64 MB tmpfs filled to the last byte when this process may mount one (root),
so that every writer (Python's files, torch.save's C++, safetensors' Rust) meets the kernel's
ENOSPC. Where mounting is not permitted (CI), a file-size limit of 0 bytes (RLIMIT_FSIZE) plays
the full disk: the kernel refuses every write that grows a file, from every writer, with EFBIG,
which omnigym answers the same way."""

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from omnigym.cli import main
from omnigym.track.checkpoint import load_checkpoint, save_checkpoint
from omnigym.track.files import DiskFault

REASONS = r"(no space left on device \(ENOSPC\)|file too large \(a file size limit\) \(EFBIG\))"


class Disk:
    """A folder whose disk fills on demand (``fill``) and gets its space back (``free``)."""

    def __init__(self, root: Path):
        self.root, self.full, self._filler, self._limit = root, False, root / ".filler", None
        root.mkdir()
        # OMNIGYM_TEST_DISK=rlimit tries the fallback where a tmpfs could be mounted
        mounted = (os.environ.get("OMNIGYM_TEST_DISK") != "rlimit" and os.geteuid() == 0 and shutil.which("mount")
                   and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(root)],
                                      capture_output=True).returncode == 0)
        self.tmpfs = bool(mounted)

    def fill(self, leave: int = 0) -> None:
        """No room left but ``leave`` bytes (per file, under the file-size limit)."""
        if self.tmpfs:
            stat = os.statvfs(self.root)
            fd = os.open(self.filler_path(), os.O_WRONLY | os.O_CREAT)
            try:
                os.posix_fallocate(fd, 0, max(stat.f_bavail * stat.f_frsize - leave, 1))
            except OSError as exc:  # what tmpfs could not reserve in one go, byte blocks until it is full
                assert exc.errno == errno.ENOSPC
            os.close(fd)
        elif self._limit is None:
            self._limit = (signal.signal(signal.SIGXFSZ, signal.SIG_IGN), resource.getrlimit(resource.RLIMIT_FSIZE))
            resource.setrlimit(resource.RLIMIT_FSIZE, (leave, self._limit[1][1]))
        self.full = True

    def filler_path(self) -> Path:
        return self._filler

    def free(self) -> None:
        if self.tmpfs:
            self._filler.unlink(missing_ok=True)
        elif self._limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, self._limit[1])
            signal.signal(signal.SIGXFSZ, self._limit[0])
            self._limit = None
        self.full = False

    def close(self) -> None:
        self.free()
        if self.tmpfs:
            subprocess.run(["umount", "-l", str(self.root)], check=True)


@pytest.fixture
def disk(tmp_path):
    made = Disk(tmp_path / "disk")
    yield made
    made.close()


def fill_at(monkeypatch, disk, owner, name, call: int = 1, leave: int = 0):
    """Fill ``disk`` just before the ``call``-th call of ``owner.name``."""
    original, calls = getattr(owner, name), {"n": 0}

    def filling(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            disk.fill(leave)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, filling)
    return calls


def the_line(capsys, disk, argv) -> str:
    """The one line a failed command prints (exit code 2, no traceback). The space comes back as
    the command ends (pytest itself writes files: under the file-size limit it could not)."""
    capsys.readouterr()  # what earlier commands printed
    try:
        code = main(argv)
    finally:
        disk.free()
    assert code == 2
    err = capsys.readouterr().err.strip()
    said = [line for line in err.splitlines() if line.startswith("omnigym:")]  # a run's own lines come before
    assert len(said) == 1 and "Traceback" not in err and err.splitlines()[-1] == said[0], err
    assert said[0].startswith("omnigym: error: cannot write "), err
    return said[0]


def no_temporaries(run: Path) -> list[Path]:
    return [p for p in run.rglob("*") if p.name.endswith((".tmp", ".partial", ".replaced"))]


def rows(run: Path, name: str = "metrics.jsonl") -> list[dict]:
    lines = [json.loads(line) for line in (run / name).read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in lines]


PPO = ["--total-timesteps", "2048", "--checkpoint-every", "512", "--num-envs", "4", "--num-steps", "64",
       "--no-progress", "--no-plot", "--no-tensorboard"]


@pytest.fixture(scope="module")
def ppo_whole(tmp_path_factory):
    """The run never interrupted that every resumed PPO run must equal."""
    run = tmp_path_factory.mktemp("whole") / "run"
    assert main(["train", "ppo", "--run-dir", str(run), *PPO]) == 0
    return rows(run)


def test_a_full_disk_at_a_checkpoint_keeps_the_previous_one_and_resumes_exactly(disk, capsys, monkeypatch, ppo_whole):
    from omnigym.track.checkpoint import Checkpointer

    run = disk.root / "run"
    kept = {}
    original = Checkpointer.save

    def save(self, components, **counters):
        if self.path.exists() and not kept:
            kept["bytes"] = self.path.read_bytes()
            disk.fill()
        return original(self, components, **counters)

    monkeypatch.setattr(Checkpointer, "save", save)
    line = the_line(capsys, disk, ["train", "ppo", "--run-dir", str(run), *PPO])
    monkeypatch.undo()
    assert f"cannot write {run / 'checkpoint.pt'}: " in line and f"continue with: omnigym train ppo --resume {run}" in line
    assert (run / "checkpoint.pt").read_bytes() == kept["bytes"]  # the previous checkpoint, untouched
    assert load_checkpoint(run)["counters"]["global_step"] > 0 and no_temporaries(run) == []
    disk.free()
    assert main(["train", "ppo", "--resume", str(run), *PPO]) == 0
    assert rows(run) == ppo_whole


def test_a_full_disk_before_the_first_checkpoint_puts_the_run_back(disk, capsys, monkeypatch, ppo_whole):
    from omnigym.track.checkpoint import Checkpointer

    run = disk.root / "run"
    fill_at(monkeypatch, disk, Checkpointer, "save")
    line = the_line(capsys, disk, ["train", "ppo", "--run-dir", str(run), *PPO])
    monkeypatch.undo()
    assert f"cannot write {run / 'checkpoint.pt'}: " in line and "start the run again" in line
    assert not run.exists()  # as before the start: the same command runs again
    disk.free()
    assert main(["train", "ppo", "--run-dir", str(run), *PPO]) == 0
    assert rows(run) == ppo_whole


def test_a_full_disk_at_start_leaves_nothing(disk, capsys, monkeypatch):
    from omnigym.track.run import Run

    run = disk.root / "run"
    fill_at(monkeypatch, disk, Run, "begin")
    line = the_line(capsys, disk, ["train", "ppo", "--run-dir", str(run), *PPO])
    assert f"cannot write {run / 'config.json'}: " in line and not run.exists()


@pytest.mark.parametrize("algorithm", [["ppo", *PPO], ["alphazero", "--env-id", "openspiel/tic_tac_toe"]])
def test_a_disk_full_before_the_run_takes_its_lock_leaves_nothing(disk, capsys, algorithm):
    """The lock's pid line was the first write: an OSError traceback, an empty lock file and the run's
    folder left behind."""
    if algorithm[0] == "alphazero":
        pytest.importorskip("pyspiel", reason="needs the [games] extra")
    run = disk.root / "run"
    disk.fill()
    line = the_line(capsys, disk, ["train", algorithm[0], "--run-dir", str(run), *algorithm[1:]])
    assert f"cannot write {run / '.omnigym.lock'}: " in line and not run.exists()


def test_a_full_disk_when_a_resume_starts_leaves_the_run_as_it_was(tmp_path, disk, capsys, monkeypatch):
    from omnigym.track.run import Run

    run, twin = disk.root / "run", tmp_path / "twin"
    assert main(["train", "ppo", "--run-dir", str(run), *PPO]) == 0
    capsys.readouterr()
    shutil.copytree(run, twin)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    fill_at(monkeypatch, disk, Run, "begin")
    longer = ["--total-timesteps", "3072"]
    line = the_line(capsys, disk, ["train", "ppo", "--resume", str(run), *PPO, *longer])
    monkeypatch.undo()
    assert f"cannot write {run / 'config.json'}: " in line and f"--resume {run}" in line
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # config.json, log, checkpoint: as they were
    disk.free()
    assert main(["train", "ppo", "--resume", str(run), *PPO, *longer]) == 0
    assert main(["train", "ppo", "--resume", str(twin), *PPO, *longer]) == 0
    assert rows(run) == rows(twin)


def starts_a_page(disk, path: Path, pending: int) -> bool:
    """Writing ``pending`` more bytes to ``path`` needs a new page: a disk filled now refuses it.
    (A file's last page has room that a full tmpfs still lets it write into.)"""
    size, page = path.stat().st_size, os.sysconf("SC_PAGE_SIZE")
    return not disk.tmpfs or size % page == 0 or size % page + pending > page


SHORT_UPDATES = [*PPO, "--num-steps", "16"]  # 32 rows: the log crosses pages after the first checkpoint


def test_a_full_disk_at_the_metrics_log_resumes_exactly(tmp_path, disk, capsys, monkeypatch):
    from omnigym.track.metrics import MetricsLog

    whole, run = tmp_path / "whole", disk.root / "run"
    assert main(["train", "ppo", "--run-dir", str(whole), *SHORT_UPDATES]) == 0
    original = MetricsLog.log

    def log(self, step, metrics):
        if ((run / "checkpoint.pt").exists() and not disk.full
                and starts_a_page(disk, run / "metrics.jsonl", len(MetricsLog.row(step, metrics)[1]))):
            disk.fill()
        return original(self, step, metrics)

    monkeypatch.setattr(MetricsLog, "log", log)
    line = the_line(capsys, disk, ["train", "ppo", "--run-dir", str(run), *SHORT_UPDATES])
    monkeypatch.undo()
    assert f"cannot write {run / 'metrics.jsonl'}: " in line and f"--resume {run}" in line
    assert no_temporaries(run) == []
    disk.free()
    assert main(["train", "ppo", "--resume", str(run), *SHORT_UPDATES]) == 0
    assert rows(run) == rows(whole)


def tensorboard_steps(run: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run))
    events.Reload()
    return [event.step for event in events.Scalars(tag)]


def test_a_full_disk_at_tensorboard_events_says_so_in_one_line_and_resumes(disk, capsys, monkeypatch, ppo_whole):
    """TensorBoard's events are written in the run's thread: a failed write is this step's one
    line, not a traceback from a writer thread; the resumed run's TensorBoard drops what came
    after the checkpoint, as its metrics.jsonl does."""
    from omnigym.track.metrics import EventsFile

    run = disk.root / "run"
    flags = [flag for flag in PPO if flag != "--no-tensorboard"]
    original = EventsFile.flush

    def flush(self):
        if (run / "checkpoint.pt").exists() and not disk.full and starts_a_page(
                disk, self.path, len(self._pending.getvalue())):
            disk.fill()
        return original(self)

    monkeypatch.setattr(EventsFile, "flush", flush)
    line = the_line(capsys, disk, ["train", "ppo", "--run-dir", str(run), *flags])
    monkeypatch.undo()
    assert f"cannot write {run}/events.out.tfevents." in line and f"--resume {run}" in line
    disk.free()
    assert main(["train", "ppo", "--resume", str(run), *flags]) == 0
    assert rows(run) == ppo_whole
    logged = [row["global_step"] for row in rows(run) if "losses/value_loss" in row]
    assert tensorboard_steps(run, "losses/value_loss") == logged


def test_a_full_disk_at_the_learning_curve_keeps_the_finished_run(disk, capsys, monkeypatch, ppo_whole):
    from omnigym.track import plot

    run = disk.root / "run"
    flags = [flag for flag in PPO if flag != "--no-plot"]
    fill_at(monkeypatch, disk, plot, "plot_runs")
    line = the_line(capsys, disk, ["train", "ppo", "--run-dir", str(run), *flags])
    assert f"cannot write {run / 'curve.png'}: " in line and f"omnigym plot {run}" in line
    assert not (run / "curve.png").exists() and rows(run) == ppo_whole
    assert load_checkpoint(run)["counters"]["global_step"] == ppo_whole[-1]["global_step"]


def test_save_checkpoint_on_a_full_disk_is_one_line_not_torchs_runtime_error(disk):
    """torch.save reports a full disk as RuntimeError ('unexpected pos'): it is a DiskFault here."""
    path = disk.root / "checkpoint.pt"
    save_checkpoint(path, {"step": 1, "weights": torch.arange(10)})
    disk.fill()
    with pytest.raises(DiskFault, match=rf"cannot write {path}: {REASONS}"):
        save_checkpoint(path, {"step": 2, "weights": torch.zeros(1_000_000)})
    disk.free()
    assert load_checkpoint(path)["step"] == 1 and os.listdir(disk.root) == ["checkpoint.pt"]


# samples every 4 steps: after the first checkpoint one of their writes needs a new page of the disk
SFT = ["--steps", "40", "--eval-size", "20", "--batch-size", "4", "--eval-every", "4", "--checkpoint-every", "8",
       "--no-progress", "--no-plot", "--no-tensorboard"]


@pytest.fixture(scope="module")
def sft_whole(tmp_path_factory):
    run = tmp_path_factory.mktemp("sft") / "run"
    assert main(["train", "sft", "--run-dir", str(run), *SFT]) == 0
    return run


def test_a_full_disk_while_sft_saves_its_model_is_not_a_finished_run(disk, capsys, monkeypatch, sft_whole):
    """The issue's case: the disk fills while model/ is written (its config files fit, its weights
    do not). The run is not finished: no model/ is left, --model RUN says so in one line, and
    --resume writes the model, equal to the uninterrupted run's."""
    from safetensors.torch import load_file

    from omnigym.track import run as run_module

    run = disk.root / "run"
    fill_at(monkeypatch, disk, run_module, "save_model_folder", leave=16_384)
    line = the_line(capsys, disk, ["train", "sft", "--run-dir", str(run), *SFT])
    monkeypatch.undo()
    assert f"cannot write {run / 'model'}: " in line and f"continue with: omnigym train sft --resume {run}" in line
    assert not (run / "model").exists() and no_temporaries(run) == []
    assert load_checkpoint(run)["counters"]["step"] == 40
    disk.free()
    assert main(["train", "sft", "--model", str(run), "--run-dir", str(disk.root / "next"), *SFT]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the run has no finished model" in err and f"--resume {run}" in err, err
    assert not (disk.root / "next").exists()
    assert main(["train", "sft", "--resume", str(run), *SFT]) == 0
    assert rows(run) == rows(sft_whole)
    saved, whole = load_file(run / "model" / "model.safetensors"), load_file(sft_whole / "model" / "model.safetensors")
    assert saved.keys() == whole.keys() and all(torch.equal(saved[k], whole[k]) for k in saved)
    assert (run / "model" / "tokenizer_config.json").is_file()


def test_a_full_disk_at_sft_samples_resumes_to_the_same_samples(disk, capsys, monkeypatch, sft_whole):
    from omnigym.track.metrics import MetricsLog

    run = disk.root / "run"
    original = MetricsLog.log_samples

    def log_samples(self, step, rows):
        pending = sum(len(json.dumps({"global_step": step, **row})) + 1 for row in rows)
        if (run / "checkpoint.pt").exists() and not disk.full and starts_a_page(disk, run / "samples.jsonl", pending):
            disk.fill()
        return original(self, step, rows)

    monkeypatch.setattr(MetricsLog, "log_samples", log_samples)
    line = the_line(capsys, disk, ["train", "sft", "--run-dir", str(run), *SFT])
    monkeypatch.undo()
    assert f"cannot write {run / 'samples.jsonl'}: " in line and f"continue with: omnigym train sft --resume {run}" in line
    disk.free()
    assert main(["train", "sft", "--resume", str(run), *SFT]) == 0
    assert rows(run) == rows(sft_whole)
    assert (run / "samples.jsonl").read_text() == (sft_whole / "samples.jsonl").read_text()


GRPO = ["--sft-steps", "10", "--sft-target-accuracy", "1.1", "--sft-eval-every", "10", "--steps", "2",
        "--prompts-per-step", "2", "--group-size", "4", "--eval-size", "20", "--eval-every", "3",
        "--no-progress", "--no-plot", "--no-tensorboard"]


@pytest.mark.parametrize("where", ["stages/warmup/metrics.jsonl", "stages/warmup/model"])
def test_a_full_disk_in_grpos_warm_up_puts_the_run_back(disk, capsys, monkeypatch, where):
    from omnigym.pipelines import grpo_warmup
    from omnigym.track.metrics import MetricsLog

    run = disk.root / "run"
    if where.endswith("model"):
        fill_at(monkeypatch, disk, grpo_warmup, "export_model_folder", leave=16_384)
    else:
        original = MetricsLog.log

        def log(self, step, metrics):
            if not disk.full and starts_a_page(disk, self.dir / "metrics.jsonl",
                                                            len(MetricsLog.row(step, metrics)[1])):
                disk.fill()
            return original(self, step, metrics)

        monkeypatch.setattr(MetricsLog, "log", log)
    line = the_line(capsys, disk, ["train", "grpo", "--run-dir", str(run), *GRPO])
    assert f"cannot write {run / where}: " in line and "run the command again" in line
    assert not run.exists()


@pytest.mark.parametrize("algo", ["dpo", "rm"])
def test_a_full_disk_while_dpo_or_rm_saves_its_model_resumes_to_the_same_model(tmp_path, disk, capsys, monkeypatch,
                                                                              algo):
    import random

    from safetensors.torch import load_file

    from omnigym.tasks.gold_world import label_pairs, prompts, reply
    from omnigym.track import model_folder
    from omnigym.track import run as run_module

    rng = random.Random(0)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(p) + "\n" for p in label_pairs(prompts(120, 0), [(reply(rng), reply(rng))
                                                                                          for _ in range(120)])))
    flags = ["--data", str(pairs), "--eval-size", "40", "--steps", "4", "--batch-size", "8", "--eval-every", "2",
             "--checkpoint-every", "2", "--no-progress", "--no-plot", "--no-tensorboard"]
    whole = tmp_path / "whole"
    assert main(["train", algo, "--run-dir", str(whole), *flags]) == 0
    run = disk.root / "run"
    fill_at(monkeypatch, disk, run_module, "save_model_folder", leave=16_384)  # dpo: Run.export_model
    fill_at(monkeypatch, disk, model_folder, "save_model_folder", leave=16_384)  # rm: its reward model folder
    line = the_line(capsys, disk, ["train", algo, "--run-dir", str(run), *flags])
    monkeypatch.undo()
    assert f"cannot write {run / 'model'}: " in line and f"continue with: omnigym train {algo} --resume {run}" in line
    assert not (run / "model").exists() and no_temporaries(run) == []
    assert main(["train", algo, "--resume", str(run), *flags]) == 0
    assert rows(run) == rows(whole)
    saved, expected = load_file(run / "model" / "model.safetensors"), load_file(whole / "model" / "model.safetensors")
    assert saved.keys() == expected.keys() and all(torch.equal(saved[k], expected[k]) for k in expected)
    if algo == "rm":  # the marker that makes the folder a reward model, with the run's held-out accuracy
        marker = "omnigym_reward.json"
        assert (run / "model" / marker).read_text() == (whole / "model" / marker).read_text()


def test_a_resumed_runs_events_file_sorts_after_the_one_it_continues(tmp_path, monkeypatch):
    """TensorBoard reads a folder's events files in name order: a run resumed within the same
    second as its first file's must sort after it (an unpadded nanosecond part put "1000000"
    before "999", and the resumed steps first; found by the full suite)."""
    import time

    from omnigym.track.metrics import EventsFile

    pytest.importorskip("tensorboard")
    ticks = iter([5 * 10**9 + 999, 5 * 10**9 + 1_000_000])
    monkeypatch.setattr(time, "time", lambda: 5.0)
    monkeypatch.setattr(time, "time_ns", lambda: next(ticks))
    first = EventsFile(tmp_path, None)
    first.close()
    resumed = EventsFile(tmp_path, 10)
    resumed.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.path.name, resumed.path.name]
