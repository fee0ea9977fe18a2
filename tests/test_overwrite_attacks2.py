"""A Ctrl-C that lands while a checkpoint is being written (found attacking --overwrite).

Python runs a signal's handler in the next Python code: during ``torch.save`` that is the file's
``write``, called back from torch's zip writer. The KeyboardInterrupt raised there leaves the zip
half written, torch's ``__exit__`` then raises ``RuntimeError: unexpected pos``, and
``save_checkpoint`` re-raises that RuntimeError (its context the KeyboardInterrupt). The CLI treats
a RuntimeError without a KeyboardInterrupt *cause* as a crash: a Python traceback and exit code 1
instead of the one ``omnigym: interrupted`` line. Seen for real: two SIGINTs 19 ms apart during an
``omnigym train grpo ... --overwrite`` ended in that traceback (the old run was put back); a
SIGINT sent 0.2-0.7 s into ``save_checkpoint`` of a 240 MB state gave the RuntimeError 4 times in 6.
A checkpoint of a real model takes seconds to write, so a Ctrl-C is likely to land in one.
"""

import pytest
import torch

from omnigym.cli import main
from omnigym.track import checkpoint
from omnigym.track.checkpoint import save_checkpoint


def interrupt_the_nth_write(monkeypatch, n: int) -> None:
    """As the SIGINT handler does: KeyboardInterrupt raised inside the ``n``-th write torch makes."""
    original, calls = checkpoint._SeenWrites.write, {"n": 0}

    def write(self, data):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt
        return original(self, data)

    monkeypatch.setattr(checkpoint._SeenWrites, "write", write)


def test_a_ctrl_c_inside_a_checkpoint_write_comes_out_as_the_interrupt(tmp_path, monkeypatch):
    interrupt_the_nth_write(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path / "checkpoint.pt", {"w": [torch.randn(100_000) for _ in range(4)]})
    assert not (tmp_path / "checkpoint.pt.tmp").exists()


def test_a_ctrl_c_during_the_first_checkpoint_write_is_one_line_and_the_directory_is_put_back(tmp_path, monkeypatch,
                                                                                               capsys):
    run = tmp_path / "run"
    interrupt_the_nth_write(monkeypatch, 3)
    try:
        code = main(["train", "ppo", "--env-id", "CartPole-v1", "--total-timesteps", "1024", "--num-envs", "2",
                     "--num-steps", "128", "--checkpoint-every", "256", "--no-progress", "--no-plot",
                     "--run-dir", str(run)])
    except RuntimeError as exc:  # what happens now: the interrupt's line never comes
        pytest.fail(f"a traceback: {exc!r}")
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("omnigym:")]
    assert code == 130 and len(lines) == 1 and lines[0].startswith("omnigym: interrupted; no checkpoint"), err
    assert not run.exists()  # put back as it was before the start


def test_a_signal_inside_the_locks_release_does_not_close_its_descriptor_twice(tmp_path, monkeypatch):
    """Seen for real: SIGTERM then SIGINT 2 ms apart in GRPO's warm-up under --overwrite; the second
    signal's KeyboardInterrupt came out of ``os.close`` in ``Run.abandon``'s lock release, and
    ``scoped_run``'s ``call.release_lock()`` closed the same number again: ``OSError: [Errno 9] Bad
    file descriptor``, a traceback and exit code 1 instead of one line (the old run was put back).
    Had the number been reused meanwhile, the second close would shut somebody else's file."""
    import os

    from omnigym.track import lock as lock_module

    held = lock_module.RunLock(tmp_path / "run")
    assert held.acquire(create=True)
    real_close, calls = os.close, {"n": 0}

    def close_then_signal(fd):  # Python runs the handler when os.close returns
        real_close(fd)
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(lock_module.os, "close", close_then_signal)
    with pytest.raises(KeyboardInterrupt):
        held.release()
    held.release()  # scoped_run's finally: must be a no-op now, not a second close


def test_what_a_kill_after_the_first_checkpoint_left_half_deleted_is_not_called_a_start_killed_before_it(tmp_path):
    """Seen for real (old run with 30,000 files in videos/, --checkpoint-every 1, SIGKILL 50 ms after
    the new checkpoint.pt appeared, inside ``RunDirectory.drop_replaced``'s rmtree): RUN held the new
    run's checkpoint.pt, config.json (--seed 4), metrics.jsonl, and a .replaced-run missing the old
    metrics.jsonl and model/ (24,205 of 30,000 videos left). ``--resume RUN`` was refused with the
    line below; following its advice to get the old run back (``mv .replaced-run/* RUN``) put the old
    config.json and checkpoint.pt over the new ones beside the new metrics.jsonl: ``--resume`` then
    said "metrics.jsonl is missing or shorter", ``eval`` "no finished model"; the new run's
    resumable checkpoint was gone too. A checkpoint.pt beside .replaced-run means the commit
    was under way (before the first checkpoint the old one is aside and no new one is in place)."""
    from omnigym.errors import OmnigymError
    from omnigym.track.resume import refuse_what_a_killed_start_set_aside

    run = tmp_path / "run"
    (run / ".replaced-run" / "videos").mkdir(parents=True)
    (run / ".replaced-run" / "checkpoint.pt").write_bytes(b"the old run's checkpoint")
    (run / ".replaced-run" / "config.json").write_text('{"algo": "grpo", "seed": 3}')
    torch.save({"counters": {"step": 1}}, run / "checkpoint.pt")  # the new run's, renamed into place
    (run / "config.json").write_text('{"algo": "grpo", "seed": 4}')
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    try:
        refuse_what_a_killed_start_set_aside(run)
    except OmnigymError as refusal:
        assert "before its first checkpoint" not in str(refusal), str(refusal)


def files_of(run):
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def test_a_second_ctrl_c_just_before_the_hold_still_puts_the_replaced_run_back(tmp_path, monkeypatch, capsys):
    """Python runs a signal's handler at its next check, and ``Run.abandon``'s first line is one
    (as are ``signals_held``'s own calls before the SIG_IGN): a second Ctrl-C arriving after the
    first one's KeyboardInterrupt reached ``scoped_run`` but before the hold raises there, and nothing
    puts the run back (no retry). Simulated here by a KeyboardInterrupt at abandon's first call. Then
    ``.replaced-run`` stays with no process killed, every later start there is refused as if
    one had been, and the CLI's line says "put back as it was before the start"."""
    from omnigym.track.run import Run

    run = tmp_path / "run"
    ppo = ["train", "ppo", "--env-id", "CartPole-v1", "--total-timesteps", "512", "--num-envs", "2", "--num-steps",
           "128", "--no-progress", "--no-plot", "--run-dir", str(run)]
    assert main([*ppo, "--checkpoint-every", "256"]) == 0
    before = files_of(run)
    capsys.readouterr()

    def first_log(self, step, values):
        raise KeyboardInterrupt  # the first Ctrl-C, before the first checkpoint

    original_abandon, calls = Run.abandon, {"n": 0}

    def abandon_after_a_second_ctrl_c(self):
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt  # the second one's handler, run at abandon's first check
        original_abandon(self)

    monkeypatch.setattr(Run, "log", first_log)
    monkeypatch.setattr(Run, "abandon", abandon_after_a_second_ctrl_c)
    code = main([*ppo, "--seed", "4", "--overwrite", "--checkpoint-every", "100000"])
    err = capsys.readouterr().err
    assert code == 130, err
    assert not (run / ".replaced-run").exists() and files_of(run) == before, err
