import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from child_process import as_from_a_terminal

from omnigym.errors import OmnigymError
from omnigym.track.checkpoint import load_checkpoint, save_checkpoint

DIES_MID_WRITE = """
import os, sys, torch
from omnigym.track.checkpoint import save_checkpoint
path = sys.argv[1]
save_checkpoint(path, {"step": 1, "weights": torch.arange(10)})
def dying_save(obj, f, *args, **kwargs):
    f.write(b"half a checkpoint")
    f.flush()
    os._exit(9)
torch.save = dying_save
save_checkpoint(path, {"step": 2, "weights": torch.arange(10)})
"""

SAVES_IN_A_LOOP = """
import sys, torch
from omnigym.track.checkpoint import save_checkpoint
for step in range(10_000):
    save_checkpoint(sys.argv[1], {"step": step, "weights": torch.full((1_000_000,), float(step))})
    print(step, flush=True)  # this step's checkpoint is complete
"""


def test_process_dying_mid_write_leaves_previous_checkpoint(tmp_path):
    path = tmp_path / "checkpoint.pt"
    proc = subprocess.run([sys.executable, "-c", DIES_MID_WRITE, str(path)], capture_output=True)
    assert proc.returncode == 9
    state = load_checkpoint(path)
    assert state["step"] == 1
    torch.testing.assert_close(state["weights"], torch.arange(10))


def test_sigkill_during_repeated_saves_leaves_a_whole_checkpoint(tmp_path):
    path = tmp_path / "checkpoint.pt"
    proc = subprocess.Popen([sys.executable, "-c", SAVES_IN_A_LOOP, str(path)], stdout=subprocess.PIPE, text=True)
    completed = [int(proc.stdout.readline()) for _ in range(3)]
    time.sleep(0.05)  # most likely mid-write of a later one
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert completed == [0, 1, 2] and proc.returncode == -signal.SIGKILL
    state = load_checkpoint(path)
    assert state["step"] >= completed[-1]  # no completed save is lost, and what loads is whole
    assert torch.all(state["weights"] == float(state["step"]))


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(OmnigymError, match=r"no checkpoint at .*checkpoint.pt"):
        load_checkpoint(tmp_path)


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"\x00not a checkpoint")
    with pytest.raises(OmnigymError, match="is corrupt or not an omnigym checkpoint"):
        load_checkpoint(tmp_path)


def test_save_leaves_no_temporary_file(tmp_path):
    save_checkpoint(tmp_path / "checkpoint.pt", {"a": 1})
    assert os.listdir(tmp_path) == ["checkpoint.pt"]


def _train_until(run_dir, extra, ready):
    """``omnigym train ppo`` in a process of its own, returned once ``ready()`` holds."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "omnigym", "train", "ppo", "--total-timesteps", "2000000", "--run-dir",
               str(run_dir), "--no-progress", "--no-plot", "--no-tensorboard", *extra]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               preexec_fn=as_from_a_terminal)
    deadline = time.monotonic() + 120
    while not ready():
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.05)
    return process


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_after_a_checkpoint_say_how_to_continue(tmp_path, signum):
    """A scheduler's SIGTERM (or a closed terminal's SIGHUP) is handled as Ctrl-C: one line
    that says how to continue, the shell's exit code for the signal, and the run resumes."""
    run = tmp_path / "run"
    process = _train_until(run, ["--checkpoint-every", "2048"], lambda: (run / "checkpoint.pt").exists())
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signum, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"omnigym: stopped by {signal.Signals(signum).name}; "
                                                   f"continue with: omnigym train ppo --resume {run}"), err
    done = subprocess.run([sys.executable, "-m", "omnigym", "train", "ppo", "--resume", str(run),
                           "--total-timesteps", "8192", "--no-progress"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr


def test_sigterm_before_the_first_checkpoint_writes_one_and_says_how_to_continue(tmp_path, monkeypatch):
    """A scheduler's SIGTERM long before --checkpoint-every is due: the update under way ends,
    its checkpoint is written, and the run stops saying how to continue; the resumed run goes on
    from that step (not from 0). The grace is long, so only the deferred save can explain it."""
    run = tmp_path / "run"
    monkeypatch.setenv("OMNIGYM_STOP_GRACE", "50")
    process = _train_until(run, ["--checkpoint-every", "10000000"], lambda: (run / "metrics.jsonl").exists())
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM and time.monotonic() - signalled < 50, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"omnigym: stopped by SIGTERM; continue with: omnigym train ppo "
                                                   f"--resume {run}  (last checkpoint: global_step "), err
    saved_at = load_checkpoint(run)["counters"]["global_step"]
    assert saved_at > 0 and not (run / "checkpoint.pt.tmp").exists()
    done = subprocess.run([sys.executable, "-m", "omnigym", "train", "ppo", "--resume", str(run),
                           "--total-timesteps", str(saved_at + 2048), "--no-progress", "--no-plot"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert load_checkpoint(run)["counters"]["global_step"] > saved_at  # it went on from there


def test_sigterm_with_no_grace_stops_at_once_and_puts_the_run_directory_back(tmp_path, monkeypatch):
    """OMNIGYM_STOP_GRACE=0: the stop does not wait for a checkpoint, and a run without one
    is put back as it was before the start."""
    run = tmp_path / "run"
    monkeypatch.setenv("OMNIGYM_STOP_GRACE", "0")
    process = _train_until(run, ["--checkpoint-every", "10000000"], lambda: (run / "metrics.jsonl").exists())
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "omnigym: stopped by SIGTERM; no checkpoint was written yet" in err and len(err.strip().splitlines()) == 1
    assert not run.exists()


def test_checkpoint_every_counts_from_zero():
    """PPO's first update counts fewer env steps than its batch (246 of 256 on CartPole):
    a negative previous step made every run checkpoint at its first update."""
    from omnigym.track.progress import crossed_multiple

    assert not crossed_multiple(246, 246 - 256, 10**8)
    assert crossed_multiple(512, 256, 512) and not crossed_multiple(511, 255, 512)
    assert not crossed_multiple(10**6, 0, 0)  # 0: never


def test_a_second_stop_signal_does_not_wait_and_the_grace_is_an_alarm(monkeypatch):
    """The handler itself: the first SIGTERM of a deferring run only asks for a checkpoint (and
    arms the grace as SIGALRM, no thread); a second raises at once; checkpoint_due says yes."""
    from omnigym.track import stopping

    monkeypatch.setenv("OMNIGYM_STOP_GRACE", "30")
    previous = signal.signal(signal.SIGTERM, stopping.on_stop_signal)
    try:
        assert stopping.begin_deferring(True)
        assert not stopping.checkpoint_due(5, 4, 1000)
        stopping.on_stop_signal(signal.SIGTERM, None)
        assert stopping.checkpoint_due(5, 4, 1000) and 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 30
        with pytest.raises(stopping.Stopped) as stop:
            stopping.on_stop_signal(signal.SIGTERM, None)
        assert stop.value.signum == signal.SIGTERM and not stopping.stop_requested()
        assert signal.getitimer(signal.ITIMER_REAL)[0] == 0  # the grace is disarmed with the stop
    finally:
        stopping.end_deferring()
        signal.signal(signal.SIGTERM, previous)
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL and not stopping.begin_deferring(True)
