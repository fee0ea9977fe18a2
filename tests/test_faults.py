"""Fault injection: SIGTERM and SIGKILL at several moments of a run, two processes on one run
directory, and Ctrl-C while the command is still importing.

Each case runs ``omnigym train ...`` in a process of its own, stops it at a known moment, and
then continues it the way a person would (``--resume``, or the same command again): the
finished run's metrics must equal those of a run never interrupted (wall-clock keys aside),
or the directory must be as it was before the start.

The moments are made exact by a test-only prelude run in the child (``CHILD`` below; nothing in
omnigym reads it): the k-th checkpoint write, or the final model's save, stops there and waits
to be killed, with a marker file saying it has got there. "mid-run" needs no hook: the child
is killed as soon as its first checkpoint is on disk.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from child_process import ForkedChild, as_from_a_terminal, run_forked

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import os, sys, time
hook, marker = os.environ.get("FAULT_HOOK", ""), os.environ.get("FAULT_MARKER", "")

def stop_here():  # tell the test where we are, then wait for its signal
    open(marker, "w").close()
    time.sleep(600)

if hook.startswith("checkpoint:"):  # stop inside the k-th checkpoint write, its .tmp complete but not renamed
    import torch
    at, original, saves = int(hook.split(":")[1]), torch.save, []
    def save(obj, f, *args, **kwargs):
        original(obj, f, *args, **kwargs)
        if "checkpoint.pt" in str(getattr(f, "name", f)):
            saves.append(1)
            if len(saves) == at:
                f.flush()
                stop_here()
    torch.save = save
elif hook.startswith("renamed:"):  # stop right after the k-th checkpoint is renamed into place
    at, original, saves = int(hook.split(":")[1]), os.replace, []
    def replace(src, dst, *args, **kwargs):
        original(src, dst, *args, **kwargs)
        if str(dst).endswith("checkpoint.pt"):
            saves.append(1)
            if len(saves) == at:
                stop_here()
    os.replace = replace
elif hook == "count":  # how many checkpoints an uninterrupted run writes
    import atexit, torch
    original, saves = torch.save, []
    def save(obj, f, *args, **kwargs):
        original(obj, f, *args, **kwargs)
        saves.append(1) if "checkpoint.pt" in str(getattr(f, "name", f)) else None
    torch.save = save
    atexit.register(lambda: open(marker, "w").write(str(len(saves))))
elif hook == "model":  # stop in the final model's save: the weights written, the tokenizer not yet
    from transformers import PreTrainedTokenizerBase
    original = PreTrainedTokenizerBase.save_pretrained
    def save_pretrained(self, folder, *args, **kwargs):
        # the run's model folder only: the tiny model's builder saves a tokenizer at start-up too
        if os.path.basename(str(folder)).startswith("model"):
            stop_here()
        return original(self, folder, *args, **kwargs)
    PreTrainedTokenizerBase.save_pretrained = save_pretrained
elif hook == "entered":  # say when main() has begun (its signal handling is on from here)
    import omnigym.cli
    set_up = omnigym.cli.set_up_process
    def set_up_process():
        open(marker, "w").close()
        set_up()
    omnigym.cli.set_up_process = set_up_process

from omnigym.cli import main
sys.exit(main(sys.argv[1:]))
"""

QUIET = ["--no-progress", "--no-plot", "--no-tensorboard"]
DPO_PAIRS = [{"prompt": [{"role": "user", "content": f"Say something about {w}."}],
              "chosen": [{"role": "assistant", "content": f"{w} is fine."}],
              "rejected": [{"role": "assistant", "content": "no"}]} for w in
             ["rain", "snow", "wind", "sun", "fog", "hail", "mist", "dew", "ice", "heat", "cold", "dust"] * 3]


def commands(tmp: Path) -> dict[str, list[str]]:
    """Tiny runs of each algorithm, a few checkpoints each (seconds on one core)."""
    pairs = tmp / "pairs.jsonl"
    if not pairs.exists():
        pairs.write_text("".join(json.dumps(p) + "\n" for p in DPO_PAIRS))
    return {
        "ppo": ["train", "ppo", "--total-timesteps", "2048", "--num-envs", "2", "--num-steps", "128",
                "--checkpoint-every", "512"],
        "dqn": ["train", "dqn", "--total-timesteps", "1200", "--learning-starts", "200", "--train-frequency", "50",
                "--gradient-steps", "5", "--hidden", "32", "32", "--log-every", "100", "--save-buffer",
                "--checkpoint-every", "300"],
        "sac": ["train", "sac", "--total-timesteps", "500", "--learning-starts", "100", "--batch-size", "32",
                "--hidden", "32", "32", "--buffer-size", "1000", "--save-buffer", "--checkpoint-every", "150"],
        "sft": ["train", "sft", "--model", "tiny", "--data", "words", "--steps", "8", "--batch-size", "4",
                "--eval-every", "4", "--eval-size", "16", "--checkpoint-every", "3"],
        "dpo": ["train", "dpo", "--model", "tiny", "--data", str(pairs), "--eval-size", "8", "--steps", "6",
                "--batch-size", "4", "--eval-every", "3", "--eval-prompts", "4", "--max-new-tokens", "4",
                "--checkpoint-every", "2"],
        "grpo": ["train", "grpo", "--model", "tiny", "--sft-steps", "0", "--steps", "6", "--prompts-per-step", "2",
                 "--group-size", "2", "--eval-size", "4", "--eval-every", "3", "--max-new-tokens", "4",
                 "--checkpoint-every", "2"],
    }


def child_env(**extra) -> dict:
    # a SIGTERM during a save the hook holds waits this long for it before stopping (track/stopping.py)
    return {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + str(ROOT / "tests"), "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1", "OMNIGYM_STOP_GRACE": "2", **extra}


def start(args: list[str], **env) -> ForkedChild:
    """``python -c CHILD ARGS``, forked from a process that has torch and transformers imported
    (tests/child_process.py: the same run, without 3-7 CPU-seconds of imports each time)."""
    return ForkedChild(CHILD, args, child_env(**env))


def start_afresh(args: list[str], **env) -> subprocess.Popen:
    """``python -c CHILD ARGS`` in a new interpreter, for what happens during its imports."""
    return subprocess.Popen([sys.executable, "-c", CHILD, *args], env=child_env(**env), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, preexec_fn=as_from_a_terminal)


def finish(args: list[str], timeout: float = 240, **env) -> subprocess.CompletedProcess:
    return run_forked(CHILD, args, child_env(**env), timeout)


def wait_for(process: subprocess.Popen, ready, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            # not an AssertionError: a moment never reached is the test's own mistake, which xfail must not hide
            raise RuntimeError(f"never got there (exit {process.poll()}): {process.stderr.read()}")
        time.sleep(0.02)


def metrics(run: Path) -> list[dict]:
    """metrics.jsonl without its wall-clock keys (bench/same_seed.py leaves out the same)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith(("perf/", "time/"))} for row in rows]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Each algorithm's run never interrupted, made once: its metrics and how many checkpoints it wrote."""
    tmp, made = tmp_path_factory.mktemp("uninterrupted"), {}

    def get(algo: str):
        if algo not in made:
            run, count = tmp / algo, tmp / f"{algo}.count"
            done = finish([*commands(tmp)[algo], "--run-dir", str(run), *QUIET], FAULT_HOOK="count",
                          FAULT_MARKER=str(count))
            assert done.returncode == 0, done.stderr
            made[algo] = metrics(run), int(count.read_text())
        return made[algo]

    return get


EXPORTS_A_MODEL = ("sft", "dpo")
"""the algorithms whose run ends by writing model/ (GRPO's ends with its final checkpoint)"""
FAST = {("ppo", "SIGKILL", "checkpoint-write"), ("ppo", "SIGTERM", "before-first-checkpoint"),
        ("ppo", "SIGKILL", "before-first-checkpoint"),
        ("ppo", "SIGTERM", "mid-run"), ("ppo", "SIGTERM", "first-checkpoint-renamed")}
"""the cases run without ``-m slow``; the rest are marked slow"""


def cases() -> list:
    return list(_cases())


def _cases():
    for algo in ("ppo", "dqn", "sac", "sft", "dpo", "grpo"):
        moments = ["before-first-checkpoint", "mid-run", "checkpoint-write", "final-save"]
        if algo in ("ppo", "sft"):  # a signal between the rename and the run noting its checkpoint
            moments.append("first-checkpoint-renamed")
        for name in ("SIGTERM", "SIGKILL"):
            for moment in moments:
                marks = [] if (algo, name, moment) in FAST else [pytest.mark.slow]
                yield pytest.param(algo, name, moment, marks=marks, id=f"{algo}-{name}-{moment}")


@pytest.mark.parametrize("algo, name, moment", cases())
def test_stopped_run_resumes_to_the_same_metrics(tmp_path, uninterrupted, algo, name, moment):
    """Stopped at ``moment`` by ``name``, then continued: the metrics equal an uninterrupted
    run's; or, stopped by SIGTERM before any checkpoint, the run directory is gone again."""
    expected, checkpoints = uninterrupted(algo)
    command, run, marker = commands(tmp_path)[algo], tmp_path / "run", tmp_path / "marker"
    hook = {"before-first-checkpoint": "checkpoint:1", "checkpoint-write": "checkpoint:2", "mid-run": "",
            "first-checkpoint-renamed": "renamed:1",
            "final-save": "model" if algo in EXPORTS_A_MODEL else f"checkpoint:{checkpoints}"}[moment]
    process = start([*command, "--run-dir", str(run), *QUIET], FAULT_HOOK=hook, FAULT_MARKER=str(marker))
    wait_for(process, marker.exists if hook else (run / "checkpoint.pt").exists)
    process.send_signal(signal.Signals[name])
    _, err = process.communicate(timeout=60)
    said = [line for line in err.splitlines() if line.startswith("omnigym:")]  # (a library's warnings aside)
    if name == "SIGKILL":
        assert process.returncode == -signal.SIGKILL
    else:
        assert process.returncode == 128 + signal.SIGTERM and len(said) == 1 and "Traceback" not in err, err
    assert name == "SIGKILL" or not (run / "checkpoint.pt.tmp").exists()  # SIGKILL cannot clean; the next save does
    if name == "SIGTERM" and moment == "before-first-checkpoint":
        assert "no checkpoint was written yet" in err and not run.exists(), err
        done = finish([*command, "--run-dir", str(run), *QUIET])  # the same command again
    else:
        if name == "SIGTERM":
            assert f"continue with: omnigym train {algo} --resume {run}" in err, err
        done = finish(["train", algo, "--resume", str(run), *QUIET])
    assert done.returncode == 0, done.stderr
    assert metrics(run) == expected
    assert not (run / "checkpoint.pt.tmp").exists()


def by_time(command: list[str], minutes: str) -> list[str]:
    """The command with ``--checkpoint-every 0`` (the last checkpoint only) and ``--checkpoint-minutes``."""
    every = command.index("--checkpoint-every")
    return [*command[:every], "--checkpoint-every", "0", *command[every + 2:], "--checkpoint-minutes", minutes]


@pytest.mark.parametrize("algo, steps", [("ppo", 8), ("grpo", 6)])
def test_checkpoint_minutes_saves_by_time_and_a_sigkill_loses_only_that(tmp_path, uninterrupted, algo, steps):
    """With --checkpoint-every 0 a run writes its last checkpoint only, and a SIGKILL before it loses
    everything; --checkpoint-minutes adds one whenever that much time has passed since the last (here
    0.0001 minutes, less than any step: one at every update). A run killed after its second such
    checkpoint resumes to the metrics of a run never interrupted, checkpointed by step count."""
    expected, _ = uninterrupted(algo)
    command = commands(tmp_path)[algo]
    for minutes, written in (("0", 1), ("0.0001", steps)):
        run, count = tmp_path / f"count-{minutes}", tmp_path / f"count-{minutes}.txt"
        done = finish([*by_time(command, minutes), "--run-dir", str(run), *QUIET], FAULT_HOOK="count",
                      FAULT_MARKER=str(count))
        assert done.returncode == 0, done.stderr
        assert int(count.read_text()) == written and metrics(run) == expected, minutes
    run, marker = tmp_path / "run", tmp_path / "marker"
    process = start([*by_time(command, "0.0001"), "--run-dir", str(run), *QUIET], FAULT_HOOK="renamed:2",
                    FAULT_MARKER=str(marker))
    wait_for(process, marker.exists)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    from omnigym.track.checkpoint import Checkpointer

    counters = Checkpointer(run).load()["counters"]  # the second update's or step's
    assert counters.get("update", counters.get("step")) == 2, counters
    done = finish(["train", algo, "--resume", str(run), *QUIET])
    assert done.returncode == 0, done.stderr
    assert metrics(run) == expected


def test_a_checkpoint_between_two_log_lines_keeps_the_episodes_not_yet_logged():
    """SAC killed during its final checkpoint resumed from one taken between two log lines and
    lost the episodes finished since the last line: its last metric line had no return."""
    from omnigym.track.episodes import EpisodeStats

    stats = EpisodeStats()
    stats.add_episodes([(-1137.0, 200), (-900.0, 200)], global_step=400)
    resumed = EpisodeStats()
    resumed.load_state_dict(stats.state_dict())
    assert resumed.drain() == stats.drain() != {}


# --- one process per run directory -----------------------------------------------------------

def long_ppo(run: Path, *extra: str) -> list[str]:
    return ["train", "ppo", "--total-timesteps", "5000000", "--num-envs", "2", "--num-steps", "128",
            "--checkpoint-every", "256", "--run-dir", str(run), *QUIET, *extra]


def refused_line(done: subprocess.CompletedProcess, pid: int, run: Path) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"omnigym: error: {run} is in use by another omnigym process (pid {pid}: "), lines[0]


def settled_files(run: Path) -> list[str]:
    """The run's files less the holder's checkpoint in flight (``checkpoint.pt.tmp`` comes and
    goes every 256 steps while it trains on; the refused process writes no such file)."""
    return sorted(p.name for p in run.iterdir() if not p.name.endswith(".tmp"))


def test_second_process_on_a_run_is_refused_naming_the_holder(tmp_path):
    """A new run, --overwrite, --resume and ``eval --video`` on a run being trained are each
    refused in one line naming the training process, and write nothing (two --resume at once
    used to interleave 217 metric lines for 117 steps)."""
    run = tmp_path / "run"
    holder = start(long_ppo(run))
    try:
        wait_for(holder, (run / "checkpoint.pt").exists)
        for args in (long_ppo(run), long_ppo(run, "--overwrite"), ["train", "ppo", "--resume", str(run), *QUIET],
                     ["eval", str(run), "--episodes", "1", "--video"]):
            files_before = settled_files(run)
            refused_line(finish(args), holder.pid, run)
            assert settled_files(run) == files_before and not (run / "videos").exists()
        assert holder.poll() is None  # the holder trains on, untouched
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.communicate(timeout=60)
    steps = [row["global_step"] for row in metrics(run)]
    assert steps == sorted(steps) and len(steps) == len(set(steps))
    assert not (run / ".omnigym.lock").exists()  # released at the end: the finished directory holds the run only


def test_lock_of_a_killed_process_is_taken_over_and_two_resumes_do_not_run_at_once(tmp_path):
    run = tmp_path / "run"
    first = start(long_ppo(run))
    wait_for(first, (run / "checkpoint.pt").exists)
    first.kill()
    first.wait()
    assert (run / ".omnigym.lock").exists()  # SIGKILL leaves the file; the kernel let the lock go
    resumed = start(["train", "ppo", "--resume", str(run), *QUIET])
    try:
        wait_for(resumed, lambda: f"\n{resumed.pid}" in "\n" + (run / ".omnigym.lock").read_text()
                 if (run / ".omnigym.lock").exists() else False)
        refused_line(finish(["train", "ppo", "--resume", str(run), *QUIET]), resumed.pid, run)
    finally:
        resumed.send_signal(signal.SIGTERM)
        resumed.communicate(timeout=60)
    assert resumed.returncode == 128 + signal.SIGTERM
    steps = [row["global_step"] for row in metrics(run)]
    assert steps == sorted(steps) and len(steps) == len(set(steps))


def test_lock_file_does_not_make_a_run_and_a_refused_start_leaves_nothing(tmp_path):
    from omnigym.errors import OmnigymError
    from omnigym.track.lock import LOCK_NAME, RunLock
    from omnigym.track.run_dir import is_run_dir

    folder = tmp_path / "a" / "b"
    holder = RunLock(folder)
    assert holder.acquire(create=True) and (folder / LOCK_NAME).read_text().startswith(f"{os.getpid()}\n")
    assert not is_run_dir(folder)
    with pytest.raises(OmnigymError, match=f"in use by another omnigym process \\(pid {os.getpid()}"):
        RunLock(folder).acquire(create=True)  # flock: two descriptors conflict in one process too
    holder.release()
    assert not (tmp_path / "a").exists()  # the folders it made, empty again, are gone

    from omnigym.cli import main

    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / LOCK_NAME).write_text("99999999\nomnigym train ppo\n")  # left by a killed process
    tiny = ["train", "ppo", "--total-timesteps", "256", "--num-envs", "2", "--num-steps", "128", "--run-dir",
            str(stale), *QUIET]
    assert main(tiny) == 0  # taken over: the lock file counts neither as a run nor as 'not empty'
    assert not (stale / LOCK_NAME).exists() and (stale / "checkpoint.pt").exists()
    assert main([*tiny, "--overwrite"]) == 0  # --overwrite's set-aside leaves the lock where it is
    assert sorted(p.name for p in stale.iterdir()) == ["checkpoint.pt", "config.json", "metrics.jsonl"]

    assert main(["train", "ppo", "--num-envs", "0", "--run-dir", str(tmp_path / "never" / "run")]) == 2
    assert main(["train", "ppo", "--env-id", "NoSuchEnv-v0", "--run-dir", str(tmp_path / "never" / "run")]) == 2
    assert not (tmp_path / "never").exists()  # refused: not even the folders the lock would have needed


# --- Ctrl-C and SIGTERM while the command is still importing ---------------------------------

@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_signal_during_the_first_imports_is_one_line(tmp_path, name):
    """The first ~0.6 s of a command import torch; a Ctrl-C there printed a KeyboardInterrupt
    traceback. Sent at several moments after main() begins: one line, the signal's exit code,
    nothing written."""
    code = 130 if name == "SIGINT" else 128 + signal.SIGTERM
    # Within torch's import (track.run, right after main() begins). Later (0.3 s), a SIGINT once
    # landed in numpy's import inside gymnasium, which Python's import machinery swallowed
    # ("Exception ignored in _get_module_lock"), leaving numpy half-imported: left alone, see the report.
    for delay in (0.0, 0.05, 0.15):
        run, marker = tmp_path / f"run{delay}", tmp_path / f"entered{delay}"
        process = start_afresh(["train", "ppo", "--total-timesteps", "100000", "--run-dir", str(run), *QUIET],
                               FAULT_HOOK="entered", FAULT_MARKER=str(marker))
        wait_for(process, marker.exists)
        time.sleep(delay)
        process.send_signal(signal.Signals[name])
        _, err = process.communicate(timeout=60)
        lines = err.strip().splitlines()
        assert process.returncode == code and len(lines) == 1 and "Traceback" not in err, (delay, err)
        assert lines[0].startswith("omnigym: interrupted; " if name == "SIGINT" else "omnigym: stopped by SIGTERM; ")
        assert not run.exists()


@pytest.mark.slow
def test_a_language_run_is_locked_during_its_warm_up_stage(tmp_path):
    """GRPO's warm-up writes RUN/stages/warmup before the run itself begins: the lock covers it,
    and a SIGTERM there puts the directory back (nothing to resume yet)."""
    run = tmp_path / "run"
    grpo = ["train", "grpo", "--model", "tiny", "--sft-steps", "100000", "--sft-target-accuracy", "1.1",
            "--sft-eval-every", "100000", "--eval-size", "4", "--run-dir", str(run), *QUIET]
    holder = start(grpo)
    try:
        wait_for(holder, (run / "stages" / "warmup" / "metrics.jsonl").exists)
        refused_line(finish(grpo), holder.pid, run)
        refused_line(finish([*grpo, "--overwrite"]), holder.pid, run)
    finally:
        holder.send_signal(signal.SIGTERM)
        _, err = holder.communicate(timeout=60)
    said = [line for line in err.splitlines() if line.startswith("omnigym:")]
    assert holder.returncode == 128 + signal.SIGTERM and said == ["omnigym: stopped by SIGTERM; the run had not "
                                                                  "started; nothing was written"], err
    assert not run.exists()


def test_an_interrupt_inside_the_save_bookkeeping_keeps_the_checkpoint(tmp_path, monkeypatch, capsys):
    """A signal's handler runs at Python's next check, which can fall just after checkpoint.pt
    was renamed into place, in the code noting it (seen once in 30 runs of grpo-SIGTERM-mid-run):
    the run then rolled itself back, deleting a whole checkpoint. Simulated exactly: the
    interrupt is raised in that code on the first save."""
    from omnigym.cli import main
    from omnigym.track.run import Run

    original, calls = getattr(Run, "_checkpoint_on_disk"), []

    def interrupted_after_the_rename(self):
        calls.append(1)
        if len(calls) == 2:  # the first save's check after its rename
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(Run, "_checkpoint_on_disk", interrupted_after_the_rename)
    run = tmp_path / "run"
    assert main(["train", "ppo", "--total-timesteps", "4096", "--num-envs", "2", "--num-steps", "128",
                 "--checkpoint-every", "256", "--run-dir", str(run), *QUIET]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"omnigym: interrupted; continue with: omnigym train ppo --resume {run}")
    assert (run / "checkpoint.pt").exists() and not (run / "checkpoint.pt.tmp").exists()


def test_an_interrupt_after_the_run_closed_says_it_finished(tmp_path, monkeypatch, capsys):
    """Ctrl-C in the lines a run prints after it closed (the summary, the curve's path) said
    "the run had not started; nothing was written" of a whole, finished run."""
    from omnigym.cli import main
    from omnigym.track.run import Run

    original = Run.say

    def interrupted_summary(self, *lines):
        if lines and lines[0].startswith("run: "):  # GRPO's summary, printed after close()
            raise KeyboardInterrupt
        return original(self, *lines)

    monkeypatch.setattr(Run, "say", interrupted_summary)
    run = tmp_path / "run"
    assert main(["train", "grpo", "--sft-steps", "0", "--steps", "1", "--eval-size", "4", "--prompts-per-step", "2",
                 "--group-size", "2", "--run-dir", str(run), *QUIET]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"omnigym: interrupted; the run had finished; it is in {run}", err
    assert (run / "metrics.jsonl").is_file() and (run / "model" / "config.json").is_file()


@pytest.mark.parametrize("command", ["train", "list"])
def test_a_signal_python_wrapped_in_a_runtime_error_is_the_interrupt_and_other_runtime_errors_are_not(
        monkeypatch, capsys, command):
    """Python 3.11 wraps an exception raised while a class is made in a RuntimeError ("Error
    calling __set_name__"): a SIGINT landing in such an import is still one line and 130; a
    RuntimeError of any other cause is a crash and propagates."""
    from omnigym import cli
    from omnigym.cli import main

    def wrapped(call):
        def raise_it(rest):
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as interrupt:
                raise RuntimeError("Error calling __set_name__ on '_Field' instance") from interrupt
        return {command: raise_it}

    monkeypatch.setattr(cli, "handlers", wrapped)
    assert main([command]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("omnigym: interrupted")

    def crashed(call):
        def raise_it(rest):
            raise RuntimeError("a real bug")
        return {command: raise_it}

    monkeypatch.setattr(cli, "handlers", crashed)
    with pytest.raises(RuntimeError, match="a real bug"):
        main([command])


@pytest.mark.parametrize("command", [
    ["train", "ppo", "--self-play", "--env-id", "openspiel/tic_tac_toe", "--total-timesteps", "512",
     "--eval-games", "100000"],
    ["train", "alphazero", "--env-id", "openspiel/tic_tac_toe", "--iterations", "1", "--games-per-iteration", "1",
     "--train-steps", "1", "--simulations", "4", "--eval-games", "100000", "--eval-random-games", "0"],
], ids=["ppo-self-play", "alphazero"])
def test_a_sigterm_during_a_long_evaluation_keeps_the_run(tmp_path, command):
    """The league's (and AlphaZero's) evaluation plays hundreds of games; a SIGTERM during it waited for the
    checkpoint after it, past the stop's grace, and a run whose only checkpoint is its last update's lost all of it.
    Now the evaluation gives way to the checkpoint: with a grace long enough to show the difference, the stop comes
    in seconds with the run saved, and its line says how to continue."""
    run = tmp_path / "run"
    process = start([*command, "--run-dir", str(run), *QUIET], OMNIGYM_STOP_GRACE="600")
    wait_for(process, (run / "config.json").exists)
    time.sleep(2)  # a 512-step rollout or one self-play game: well into the evaluation of 100,000 games
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=90)
    assert process.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err
    assert f"continue with: omnigym train {command[1]} --resume {run}" in err, err
    assert (run / "checkpoint.pt").exists()
