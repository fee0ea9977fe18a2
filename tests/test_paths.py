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
