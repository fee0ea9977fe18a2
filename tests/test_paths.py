"""Paths that are not what they claim: a folder named like a data file, a damaged model
folder. Each gets one line naming the path, exit code 2, and nothing written."""

import json
import shutil

import pytest

from omnigym.cli import main
from test_bad_input import snapshot


@pytest.mark.parametrize("argv", [
    ["train", "sft", "--data", "x.jsonl"],
    ["train", "dpo", "--data", "x.jsonl"],
    ["train", "rm", "--data", "x.jsonl"],
    ["train", "rlhf", "--data", "x.jsonl"],
    ["train", "grpo", "--task", "x.jsonl"],
    ["train", "grpo", "--task", "gsm8k:x.jsonl"],
    ["train", "grpo", "--task", "humaneval:x.jsonl"],
], ids=" ".join)
def test_a_folder_given_as_a_data_file_is_one_line(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.jsonl").mkdir()
    before = snapshot(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "x.jsonl is a folder, not a JSON lines file" in err[0], err
    assert snapshot(tmp_path) == before


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from omnigym.models.lm import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def truncate_weights(folder):
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


DAMAGE = {
    "truncated weights": (truncate_weights, "model.safetensors"),
    "no weights": (lambda folder: (folder / "model.safetensors").unlink(), "no weights"),
    "an omnigym run config": (lambda folder: (folder / "config.json").write_text(json.dumps({"algo": "ppo"})),
                              "config.json"),
    "config not JSON": (lambda folder: (folder / "config.json").write_text("{oops"), "config.json"),
    "broken tokenizer": (lambda folder: (folder / "tokenizer.json").write_text("{oops"), "tokenizer"),
}


@pytest.mark.parametrize("as_run_dir", [False, True], ids=["folder", "run-dir"])
@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_model_folder_is_one_line_naming_it(tiny_model, tmp_path, monkeypatch, capsys, damage, as_run_dir):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "run" / "model" if as_run_dir else tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    spoil, word = DAMAGE[damage]
    spoil(folder)
    given = folder.parent if as_run_dir else folder
    before = snapshot(tmp_path)
    assert main(["train", "sft", "--model", str(given), "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--model {given}" in err[0] and word in err[0], err
    assert snapshot(tmp_path) == before


SFT = ["train", "sft", "--batch-size", "4", "--eval-size", "5", "--eval-every", "100", "--checkpoint-every", "1",
       "--no-progress", "--no-plot", "--no-tensorboard"]


def write_rows(path, answer="4"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": f"{i}+2=", "completion": answer}) + "\n" for i in range(30)))


def steps(run):
    return [json.loads(line)["global_step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_run_started_with_a_relative_data_path_resumes_from_anywhere(tmp_path, monkeypatch, capsys):
    """What identifies the data is the file's content (size and SHA-256, kept in config.json with
    its absolute path), not how its path was spelled: the run resumes from another folder, with
    the absolute path, and with a copy of the file elsewhere; other data is refused."""
    write_rows(tmp_path / "a" / "rows.jsonl")
    run = tmp_path / "run"
    monkeypatch.chdir(tmp_path / "a")
    assert main([*SFT, "--data", "rows.jsonl", "--steps", "1", "--run-dir", str(run)]) == 0
    saved = json.loads((run / "config.json").read_text())
    assert saved["data"] == "rows.jsonl"  # as typed; where it is and what it holds beside it
    assert saved["data_files"]["data"]["path"] == str(tmp_path / "a" / "rows.jsonl")

    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "b")
    assert main(["train", "sft", "--resume", str(run), "--steps", "2"]) == 0
    assert main(["train", "sft", "--resume", str(run), "--steps", "3", "--data", str(tmp_path / "a" / "rows.jsonl")]) == 0
    assert main(["train", "sft", "--resume", str(run), "--steps", "4", "--data", "../a/rows.jsonl"]) == 0
    (tmp_path / "a" / "rows.jsonl").rename(tmp_path / "b" / "moved.jsonl")  # the data moved too
    capsys.readouterr()
    assert main(["train", "sft", "--resume", str(run), "--steps", "5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"({tmp_path / 'a' / 'rows.jsonl'}), which is not there any more" in err[0], err
    assert main(["train", "sft", "--resume", str(run), "--steps", "5", "--data", "moved.jsonl"]) == 0
    assert steps(run)[-1] == 5
    assert json.loads((run / "config.json").read_text())["data_files"]["data"]["path"] == str(tmp_path / "b" /
                                                                                            "moved.jsonl")

    write_rows(tmp_path / "b" / "other.jsonl", answer="5")
    before = snapshot(run)
    capsys.readouterr()
    assert main(["train", "sft", "--resume", str(run), "--steps", "6", "--data", "other.jsonl"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was made with other data" in err[0] and "other.jsonl" in err[0], err
    assert snapshot(run) == before


def test_a_run_started_with_a_relative_model_and_template_resumes_from_anywhere(tiny_model, tmp_path, monkeypatch,
                                                                                capsys):
    """A relative --model and --chat-template are kept as typed, with their absolute paths beside:
    resumed from another folder, the run finds them (--model f/plain was read as a hub id, 'cannot
    connect to huggingface.co'); given again relative to the new folder, they must be the same."""
    from omnigym.models.lm import CHAT_TEMPLATE

    shutil.copytree(tiny_model, tmp_path / "a" / "f" / "plain")
    (tmp_path / "a" / "t.jinja").write_text(CHAT_TEMPLATE)
    write_rows(tmp_path / "a" / "rows.jsonl")
    run = tmp_path / "run"
    monkeypatch.chdir(tmp_path / "a")
    given = ["--model", "f/plain", "--chat-template", "t.jinja", "--data", "rows.jsonl"]
    assert main([*SFT, *given, "--steps", "1", "--run-dir", str(run)]) == 0
    saved = json.loads((run / "config.json").read_text())
    assert (saved["model"], saved["chat_template"]) == ("f/plain", "t.jinja")  # as typed
    assert saved["paths"] == {"model": str(tmp_path / "a" / "f" / "plain"), "chat_template": str(tmp_path / "a" /
                                                                                                 "t.jinja")}
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "b")
    assert main(["train", "sft", "--resume", str(run), "--steps", "2"]) == 0
    assert steps(run)[-1] == 2
    assert json.loads((run / "config.json").read_text())["model"] == str(tmp_path / "a" / "f" / "plain")
    assert main(["train", "sft", "--resume", str(run), "--steps", "3", "--model", "../a/f/plain"]) == 0
    shutil.copytree(tiny_model, tmp_path / "b" / "f" / "plain")  # another folder of the same name, here
    before = snapshot(run)
    capsys.readouterr()
    assert main(["train", "sft", "--resume", str(run), "--steps", "4", "--model", "f/plain"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"was made with --model ../a/f/plain ({tmp_path / 'a' / 'f' / 'plain'}), not f/plain" in err[0], err
    assert snapshot(run) == before


@pytest.mark.parametrize("argv", [
    ["train", "rlhf", "--model", "MODEL", "--reward-model", "RM", "--data", "prompts.jsonl"],
    ["train", "grpo", "--rewards", "rm:RM:1.0"],
], ids=["rlhf --reward-model", "grpo --rewards rm:"])
def test_a_damaged_reward_model_is_one_line_naming_it(tiny_model, tmp_path, monkeypatch, capsys, argv):
    from omnigym.models.scalar_head import MARKER

    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_model, tmp_path / "rm" / "model")
    (tmp_path / "rm" / "model" / MARKER).write_text("{}")
    truncate_weights(tmp_path / "rm" / "model")
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"{i}+1="}) + "\n" for i in range(20)))
    argv = [str(tiny_model) if a == "MODEL" else "rm" if a == "RM" else a.replace("RM", "rm") for a in argv]
    before = snapshot(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rm:rm: " in err[0] and "model.safetensors is damaged or incomplete" in err[0], err
    assert snapshot(tmp_path) == before


def test_a_saved_model_folder_reaches_the_disk_before_it_is_renamed_into_place(tiny_model, tmp_path, monkeypatch):
    """model/ is renamed into place only after each of its files (and the folder) was fsynced:
    otherwise a power cut could leave a model/ that exists but holds empty files."""
    import os
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omnigym.track import model_folder

    synced, renamed_after = [], []
    real_fsync, real_rename = os.fsync, Path.rename

    def fsync(descriptor):
        synced.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        real_fsync(descriptor)

    def rename(self, target):
        renamed_after.append(list(synced))
        return real_rename(self, target)

    monkeypatch.setattr(model_folder.os, "fsync", fsync)
    monkeypatch.setattr(Path, "rename", rename)
    folder = model_folder.save_model_folder(AutoModelForCausalLM.from_pretrained(tiny_model),
                                            AutoTokenizer.from_pretrained(tiny_model), tmp_path / "model")
    files = {str(tmp_path / "model.partial" / f.relative_to(folder)) for f in folder.rglob("*") if f.is_file()}
    assert files and files | {str(tmp_path / "model.partial")} <= set(renamed_after[-1])


def test_a_built_in_model_name_is_never_recorded_as_a_path(tmp_path, monkeypatch):
    """--model tiny is the built-in model, even beside a folder named tiny: recorded as a path, a
    resume from elsewhere would have loaded that folder instead."""
    from omnigym.algos import sft
    from omnigym.models.lm import TINY_MODELS
    from omnigym.config import LanguageModelConfig
    from omnigym.track.resume import recorded_paths

    assert set(LanguageModelConfig.BUILT_IN_MODELS) == {*TINY_MODELS, "lstm"}
    monkeypatch.chdir(tmp_path)
    for name in LanguageModelConfig.BUILT_IN_MODELS:
        (tmp_path / name).mkdir()
        assert recorded_paths(sft.SFTConfig(model=name)) == {}
    (tmp_path / "mine").mkdir()
    assert recorded_paths(sft.SFTConfig(model="mine")) == {"model": str(tmp_path / "mine")}


def test_a_run_with_a_relative_reward_model_resumes_from_anywhere(tmp_path, monkeypatch, capsys):
    """``--rewards rm:RUN_DIR`` relative: resumed from another folder, the run said 'rm:rm: no such
    folder'. Its folder is recorded beside the spec, which stays as typed (and so do the part's
    metrics' names); a recorded folder that is gone is one line, nothing written."""
    small = ["--steps", "1", "--no-progress", "--no-plot", "--no-tensorboard"]
    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    assert main(["train", "rm", *small, "--batch-size", "4", "--eval-size", "4", "--run-dir", "rm"]) == 0
    run = tmp_path / "run"
    grpo = ["--sft-steps", "0", "--prompts-per-step", "2", "--group-size", "2", "--eval-size", "2",
            "--max-new-tokens", "8", "--checkpoint-every", "1", "--no-progress", "--no-plot", "--no-tensorboard"]
    assert main(["train", "grpo", "--rewards", "rm:rm:1.0,format:0.1", "--steps", "1", "--run-dir", str(run),
                 *grpo]) == 0
    saved = json.loads((run / "config.json").read_text())
    assert saved["rewards"] == "rm:rm:1.0,format:0.1" and saved["paths"] == {"rewards rm:rm": str(tmp_path / "a" / "rm")}
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "b")
    assert main(["train", "grpo", "--resume", str(run), "--steps", "2"]) == 0
    assert steps(run)[-1] == 2
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert "reward/rm:rm" in last and json.loads((run / "config.json").read_text())["paths"] == saved["paths"]
    (tmp_path / "a" / "rm").rename(tmp_path / "a" / "rm-moved")
    before = snapshot(run)
    capsys.readouterr()
    assert main(["train", "grpo", "--resume", str(run), "--steps", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"omnigym: error: {run} was made with --rewards rm:rm ({tmp_path / 'a' / 'rm'}), which is not there "
                   "any more; put it back there, or give --rewards with rm:PATH where it is now (that part's metrics then take "
                   "the new name)"], err
    assert snapshot(run) == before


def test_reward_folders_named_by_dot_and_in_every_reward_flag_resume_from_anywhere(tmp_path, monkeypatch):
    """``rm:.`` (the run directory one stands in) was recorded but not used on resume: from
    another folder the run scored with whatever reward model was there, and rewrote the record.
    ``--accuracy-reward`` and the other reward flags are recorded as ``--rewards`` is."""
    small = ["--no-progress", "--no-plot", "--no-tensorboard"]
    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    assert main(["train", "rm", "--steps", "1", *small, "--batch-size", "4", "--eval-size", "4", "--run-dir", "rm"]) == 0
    run = tmp_path / "run"
    monkeypatch.chdir(tmp_path / "a" / "rm")
    assert main(["train", "grpo", "--rewards", "rm:.:1.0,format:0.1", "--accuracy-reward", "rm:../rm", "--steps", "1",
                 "--run-dir", str(run), "--sft-steps", "0", "--prompts-per-step", "2", "--group-size", "2",
                 "--eval-size", "2", "--max-new-tokens", "8", "--checkpoint-every", "1", *small]) == 0
    rm = str(tmp_path / "a" / "rm")
    saved = json.loads((run / "config.json").read_text())["paths"]
    assert saved == {"rewards rm:.": rm, "accuracy_reward rm:../rm": rm}, saved
    shutil.copytree(tmp_path / "a" / "rm", tmp_path / "b" / "rm")  # another reward model where "." would be
    monkeypatch.chdir(tmp_path / "b" / "rm")
    from omnigym.algos.lm.grpo import GRPOConfig
    from omnigym.track.resume import reward_places

    cfg = GRPOConfig(rewards="rm:.:1.0,format:0.1", accuracy_reward="rm:../rm", resume=str(run))
    assert reward_places(cfg) == {"rm:.": f"rm:{rm}"}
    assert reward_places(cfg, "accuracy_reward") == {"rm:../rm": f"rm:{rm}"}
    assert main(["train", "grpo", "--resume", str(run), "--steps", "2"]) == 0
    assert steps(run)[-1] == 2 and json.loads((run / "config.json").read_text())["paths"] == saved


def test_a_built_in_judge_is_not_a_folder_and_a_rubric_is_read_where_it_was(tmp_path, monkeypatch):
    from omnigym.algos.lm.grpo import GRPOConfig
    from omnigym.track.resume import found_elsewhere, recorded_paths

    (tmp_path / "tiny").mkdir()
    (tmp_path / "rubric.txt").write_text("x")
    monkeypatch.chdir(tmp_path)
    paths = recorded_paths(GRPOConfig(rewards="judge:tiny:1.0,format:0.1", judge_rubric="rubric.txt"))
    assert paths == {"judge_rubric": str(tmp_path / "rubric.txt")}  # judge:tiny is the built-in model
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    saved = {"judge_rubric": "rubric.txt", "paths": paths}
    assert found_elsewhere(saved) == {"judge_rubric": str(tmp_path / "rubric.txt")}
    (tmp_path / "elsewhere" / "rubric.txt").write_text("y")  # one here: moved_paths decides, later
    assert found_elsewhere(saved) == {}
