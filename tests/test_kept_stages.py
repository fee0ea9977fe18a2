"""A demo run stopped before its first checkpoint keeps the stages it finished (GRPO's warm-up,
the RLHF demo's SFT model, pairs and reward model, distillation's teacher): its line names them
and says how to go on, the directory then holds only ``stages/``, and the same command with
``--run-dir`` reuses them and logs what a run that was never stopped logs. Before, a stop after
the warm-up and before GRPO's first step said "nothing was written", left ``stages/`` behind,
and the same command refused the directory ("not empty and holds no omnigym run"); a stop
after GRPO began removed the finished warm-up with the run."""

from __future__ import annotations

import json

import pytest
from test_rlhf import metrics, strip

from omnigym.algos.lm import grpo, rm
from omnigym.cli import run_command
from omnigym.errors import OmnigymError
from omnigym.pipelines import rlhf_demo

GRPO = ["train", "grpo", "--sft-steps", "6", "--sft-eval-every", "3", "--steps", "2", "--eval-size", "4",
        "--prompts-per-step", "2", "--group-size", "2", "--no-progress", "--no-plot", "--seed", "3"]


def stop_with(exception):
    def stopped(*args, **kwargs):
        raise exception
    return stopped


def omnigym_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("omnigym:")]


@pytest.fixture(scope="module")
def uninterrupted_grpo(tmp_path_factory):
    whole = tmp_path_factory.mktemp("whole") / "run"
    assert run_command([*GRPO, "--run-dir", str(whole)]) == 0
    return strip(metrics(whole)), strip(metrics(whole / "stages" / "warmup"))


@pytest.mark.parametrize("where", ["before GRPO begins", "at GRPO's first step"])
def test_a_stop_after_grpos_warm_up_keeps_it_and_the_same_command_reuses_it(tmp_path, monkeypatch, capsys,
                                                                           uninterrupted_grpo, where):
    run = tmp_path / "stopped"
    with monkeypatch.context() as patch:
        if where == "before GRPO begins":  # after the warm-up's model is written, before config.json
            patch.setattr(grpo, "make_engine", stop_with(KeyboardInterrupt))
        else:  # the run has begun: config.json and metrics.jsonl are written, no checkpoint yet
            patch.setattr(grpo.HackingMonitor, "for_run", stop_with(KeyboardInterrupt))
        capsys.readouterr()
        assert run_command([*GRPO, "--run-dir", str(run)]) == 130
    said = omnigym_lines(capsys.readouterr().err)
    assert len(said) == 1 and said[0].startswith("omnigym: interrupted; "), said
    assert f"its finished stages (warmup) are kept in {run / 'stages'}: the same command with --run-dir {run}" \
           " reuses them" in said[0]
    assert sorted(p.name for p in run.iterdir()) == ["stages"]  # the run's own files went, the stage stayed
    assert run_command([*GRPO, "--resume", str(run)]) == 2  # a user who tries --resume is told --run-dir
    assert omnigym_lines(capsys.readouterr().err) == [f"omnigym: error: {run} is not a run directory (no "
                                                      "config.json): it holds only the finished stages of a run "
                                                      "stopped before its first checkpoint; start that run again "
                                                      f"with --run-dir {run} (not --resume), which reuses them"]
    assert sorted(p.name for p in run.iterdir()) == ["stages"]
    assert run_command([*GRPO, "--run-dir", str(run)]) == 0
    assert "warm-up: reusing" in capsys.readouterr().err
    assert (strip(metrics(run)), strip(metrics(run / "stages" / "warmup"))) == uninterrupted_grpo


def test_a_stop_inside_the_warm_up_still_leaves_nothing(tmp_path, monkeypatch, capsys):
    """No stage finished: the directory is put back as it was (it did not exist)."""
    monkeypatch.setattr("omnigym.pipelines.grpo_warmup.export_model_folder", stop_with(KeyboardInterrupt))
    assert run_command([*GRPO, "--run-dir", str(tmp_path / "run")]) == 130
    assert omnigym_lines(capsys.readouterr().err) == ["omnigym: interrupted; the run had not started; nothing was "
                                                      "written"]
    assert not (tmp_path / "run").exists()


@pytest.fixture
def small_demo(monkeypatch):
    monkeypatch.setattr(rlhf_demo, "SFT_STEPS", 4)  # the demo's stages, small: the same code, less of it
    monkeypatch.setattr(rlhf_demo, "PAIR_PROMPTS", 260)  # the reward model holds 200 out
    monkeypatch.setattr(rlhf_demo, "RM_STEPS", 4)


RLHF = ["train", "rlhf", "--steps", "1", "--eval-prompts", "4", "--no-progress", "--no-plot"]


def test_an_error_in_the_rlhf_demos_reward_model_stage_keeps_the_sft_model_and_pairs(tmp_path, monkeypatch, capsys,
                                                                                     small_demo):
    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(rm, "train", stop_with(OmnigymError("the reward model's stage failed")))
        assert run_command([*RLHF, "--run-dir", str(run)]) == 2
    said = omnigym_lines(capsys.readouterr().err)
    assert said == [f"omnigym: error: the reward model's stage failed [its finished stages (sft, pairs.jsonl) are "
                    f"kept in {run / 'stages'}: the same command with --run-dir {run} reuses them]"], said
    pairs = (run / "stages" / "pairs.jsonl").read_bytes()
    assert run_command([*RLHF, "--run-dir", str(run)]) == 0
    err = capsys.readouterr().err
    assert "demo stage 3" in err and "demo stage 1" not in err and "demo stage 2" not in err, err
    assert (run / "stages" / "pairs.jsonl").read_bytes() == pairs and (run / "model").is_dir()


def test_a_directory_holding_anything_beside_stages_is_still_refused(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "stages").mkdir(parents=True)
    (run / "notes.txt").write_text("mine")
    assert run_command([*GRPO, "--run-dir", str(run)]) == 2
    assert omnigym_lines(capsys.readouterr().err) == [f"omnigym: error: {run} is not empty and holds no omnigym "
                                                      "run; choose a new or empty --run-dir"]
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt", "stages"]


def test_a_file_named_stages_is_not_kept_stages(tmp_path, capsys):
    """A file where the stages folder would be: refused as any foreign file (it was a traceback)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "stages").write_text("mine")
    assert run_command([*GRPO, "--run-dir", str(run)]) == 2
    assert omnigym_lines(capsys.readouterr().err) == [f"omnigym: error: {run} is not empty and holds no omnigym "
                                                      "run; choose a new or empty --run-dir"]
    assert (run / "stages").read_text() == "mine"


# --- a stage made again is set aside until the new run has a checkpoint ------------------------------
#
# `--overwrite` with a stage setting the replaced run did not use (another --seed) made the stage
# again in place: a stop before the new run's first checkpoint brought the old run back beside the
# new run's stage, the old stage lost. The old one now waits beside it (`.replaced-NAME`) and comes
# back with the run.


def contents(folder) -> dict:
    """Every file under ``folder`` (its lock file aside) by relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".omnigym.lock"}


@pytest.fixture(scope="module")
def finished_grpo(tmp_path_factory):
    run = tmp_path_factory.mktemp("finished") / "run"
    assert run_command([*GRPO, "--run-dir", str(run)]) == 0
    return run


@pytest.mark.parametrize("where", ["inside the warm-up", "at GRPO's first step"])
def test_overwrite_with_another_seed_stopped_before_its_checkpoint_puts_the_old_warm_up_back(
        tmp_path, monkeypatch, capsys, finished_grpo, where):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished_grpo, run)
    before = contents(run)
    with monkeypatch.context() as patch:
        if where == "inside the warm-up":  # the new stage half made: its model never written
            patch.setattr("omnigym.pipelines.grpo_warmup.export_model_folder", stop_with(KeyboardInterrupt))
        else:  # the new warm-up finished, the old run set aside, no checkpoint yet
            patch.setattr(grpo.HackingMonitor, "for_run", stop_with(KeyboardInterrupt))
        argv = [*GRPO[:-1], "4", "--run-dir", str(run), "--overwrite"]  # --seed 4, not the run's 3
        assert run_command(argv) == 130
    said = omnigym_lines(capsys.readouterr().err)
    assert len(said) == 1 and said[0].startswith("omnigym: interrupted; ") and "kept" not in said[0], said
    assert contents(run) == before  # the old run and its warm-up, byte for byte; nothing set aside left
    assert run_command(argv) == 0  # the same command, not stopped, replaces both
    capsys.readouterr()
    assert sorted(p.name for p in (run / "stages").iterdir()) == ["warmup"]
    assert json.loads((run / "stages" / "warmup" / "config.json").read_text())["seed"] == 4
    assert not (run / ".replaced-run").exists()


def test_rlhf_demo_with_another_seed_remakes_the_pairs_and_an_error_puts_every_old_stage_back(
        tmp_path, monkeypatch, capsys, small_demo):
    """The pairs are sampled from the SFT model: another seed's SFT model makes them again (they
    were reused, sampled from the old one), and an error in the reward model's stage brings back
    the old SFT model, pairs and reward model with the old run."""
    run = tmp_path / "run"
    assert run_command([*RLHF, "--run-dir", str(run), "--seed", "0"]) == 0
    before = contents(run)
    with monkeypatch.context() as patch:
        patch.setattr(rm, "train", stop_with(OmnigymError("the reward model's stage failed")))
        assert run_command([*RLHF, "--run-dir", str(run), "--seed", "1", "--overwrite"]) == 2
    said = omnigym_lines(capsys.readouterr().err)
    assert said == ["omnigym: error: the reward model's stage failed"], said
    assert contents(run) == before
    assert run_command([*RLHF, "--run-dir", str(run), "--seed", "1", "--overwrite"]) == 0
    capsys.readouterr()
    after = contents(run)
    assert after["stages/pairs.jsonl"] != before["stages/pairs.jsonl"]  # sampled from seed 1's SFT model
    assert not any(".replaced" in name for name in after), [n for n in after if ".replaced" in n]
