"""Ways a user still loses a finished run's files around ``--overwrite`` and the stages set aside
(``stages/.replaced-NAME``, ``RUN/.replaced-run``), found by an attacker helper at 7f26060 and
reproduced from the CLI (SIGTERM/SIGINT/SIGKILL at chosen moments) before being written down here.
All mended since; each test failed on 7f26060's code."""

from __future__ import annotations

import errno
import shutil
import subprocess
import sys

import pytest
from test_kept_stages import GRPO, contents, stop_with

from omnigym.algos.lm import grpo
from omnigym.cli import run_command


def killed(argv: list[str]) -> None:
    """``omnigym argv`` in a child process that dies as by SIGKILL (``os._exit``: no handler, no
    ``finally``) at GRPO's first step, after the warm-up and ``Run.begin``, before any checkpoint:
    what a kill or the OOM killer leaves on disk there."""
    code = ("import os, sys\nfrom omnigym.algos.lm import grpo\n"
            "grpo.HackingMonitor.for_run = lambda *a, **k: os._exit(137)\n"
            "from omnigym.cli import run_command\nsys.exit(run_command(sys.argv[1:]))")
    assert subprocess.run([sys.executable, "-c", code, *argv]).returncode == 137


@pytest.fixture(scope="module")
def seed3_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("attacks") / "run"
    assert run_command([*GRPO, "--run-dir", str(run)]) == 0  # --seed 3
    return run


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), OSError(errno.ENOSPC, "No space left on device")])
def test_a_stop_inside_begin_of_an_overwrite_keeps_the_old_run(tmp_path, monkeypatch, capsys, seed3_run, stop):
    run = tmp_path / "run"
    shutil.copytree(seed3_run, run)
    before = contents(run)
    # a Ctrl-C/SIGTERM (not yet deferred) or a full disk while the new run's log opens, after the
    # old run's files went to .replaced-run; from the CLI: SIGTERM ~0-10 ms after .replaced-run appears
    monkeypatch.setattr("omnigym.track.run.MetricsLog", stop_with(stop))
    assert run_command([*GRPO, "--run-dir", str(run), "--overwrite"]) in (2, 130)
    capsys.readouterr()  # it says "... was put back as it was before the start"
    assert contents(run) == before


def test_what_a_killed_overwrite_set_aside_is_refused_until_the_user_chooses(tmp_path, capsys, seed3_run):
    """A SIGKILL between an --overwrite's set-aside and its first checkpoint leaves the old run in
    .replaced-run and its warm-up in stages/.replaced-warmup. The same command then mixed them
    with its own (.replaced-run overwritten; a later stop put back one run's checkpoint beside
    another's config), and a run that reused the new warm-up left the stale one, which a later
    set-aside took for its own. Now every start there is refused in one line, nothing touched,
    and each of the two ways the line offers works."""
    run = tmp_path / "run"
    shutil.copytree(seed3_run, run)
    before = contents(run)
    seed4 = [*GRPO[:-1], "4", "--run-dir", str(run), "--overwrite"]
    killed(seed4)  # after the seed-4 warm-up and Run.begin, before a checkpoint
    after_kill = contents(run)
    for argv in (seed4, ["train", "grpo", "--resume", str(run), "--no-progress", "--no-plot"]):
        assert run_command(argv) == 2
        said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("omnigym:")]
        assert len(said) == 1 and "(.replaced-run, stages/.replaced-warmup)" in said[0], said
        assert contents(run) == after_kill

    kept = tmp_path / "kept"  # the old run back, as the line says: .replaced-run/* into RUN, the stage onto its name
    shutil.copytree(run, kept)
    for name in ("config.json", "metrics.jsonl"):
        (kept / name).unlink()
    for events in kept.glob("events.out.tfevents.*"):
        events.unlink()
    for old in (kept / ".replaced-run").iterdir():
        old.rename(kept / old.name)
    (kept / ".replaced-run").rmdir()
    shutil.rmtree(kept / "stages" / "warmup")
    (kept / "stages" / ".replaced-warmup").rename(kept / "stages" / "warmup")
    assert contents(kept) == before  # nothing of the old run was lost

    shutil.rmtree(run / ".replaced-run")  # or the one in place: the leftovers deleted, the command runs
    shutil.rmtree(run / "stages" / ".replaced-warmup")
    assert run_command(seed4) == 0
    capsys.readouterr()
    assert sorted(p.name for p in (run / "stages").iterdir()) == ["warmup"] and not (run / ".replaced-run").exists()
    seed4_warmup = contents(run / "stages" / "warmup")
    with pytest.MonkeyPatch.context() as patch:  # --seed 5, stopped inside its warm-up: seed 4's comes back
        patch.setattr("omnigym.pipelines.grpo_warmup.export_model_folder", stop_with(KeyboardInterrupt))
        assert run_command([*GRPO[:-1], "5", "--run-dir", str(run), "--overwrite"]) == 130
    capsys.readouterr()
    assert contents(run / "stages" / "warmup") == seed4_warmup
