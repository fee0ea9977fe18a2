"""Attacks on --precision bf16 and on the paths config.json records for a relative --model
(track/resume.py PATHS_KEY): found by a tester from the docs and the CLI. The xfail tests are
problems still open; the others pin behaviour that held. (All fixed since; the bf16 resume was
the harness's: a config built in Python resumes as given, and it had left --precision out.)"""

import json
import os

import pytest

pytest.importorskip("transformers")

from omnigym.cli import main  # noqa: E402


def sft(run_dir, **extra):
    from omnigym.algos.lm.sft import SFTConfig, train

    where = {"resume": str(run_dir)} if extra.pop("resume", False) else {"run_dir": str(run_dir)}
    return train(SFTConfig(**where, progress=False, plot=False, tensorboard=False, eval_size=5, batch_size=4,
                           eval_every=2, checkpoint_every=2, **extra))


def metrics(run_dir):
    rows = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


def test_a_bf16_run_leaves_autocast_off_and_saves_float32_weights(tmp_path):
    import torch
    from safetensors import safe_open

    sft(tmp_path / "run", steps=2, precision="bf16")
    assert not torch.is_autocast_enabled("cpu")  # the hook's exit ran after every forward
    assert json.loads((tmp_path / "run" / "config.json").read_text())["precision"] == "bf16"
    files = list((tmp_path / "run" / "model").glob("*.safetensors"))
    assert files
    for file in files:
        with safe_open(str(file), "pt") as weights:
            assert {weights.get_tensor(k).dtype for k in weights.keys()} == {torch.float32}


def test_a_bf16_run_resumes_to_the_same_metrics(tmp_path):
    sft(tmp_path / "whole", steps=4, precision="bf16")
    sft(tmp_path / "cut", steps=2, precision="bf16")
    sft(tmp_path / "cut", steps=4, resume=True, precision="bf16")  # from Python, the config is as given
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "whole")


def test_eval_of_a_run_with_an_unknown_precision_is_one_line(tmp_path, monkeypatch, capsys):
    sft(tmp_path / "run", steps=2)
    config = tmp_path / "run" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "precision": "fp16"}))
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()  # the run's own output
    try:
        code = main(["eval", "run", "--n", "1"])
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("omnigym: error: ") and "precision" in err[0], err


def two_models(tmp_path):
    from omnigym.models.lm import build_tiny_model

    for name in ("a", "b"):
        build_tiny_model(tmp_path / name / "f" / "plain")
    return tmp_path / "a" / "f" / "plain", tmp_path / "b" / "f" / "plain"


def test_an_absolute_model_is_not_replaced_by_the_recorded_path(tmp_path):
    from omnigym.algos.lm.sft import SFTConfig
    from omnigym.track.resume import moved_paths

    typed, other = two_models(tmp_path)
    saved = {"model": str(typed), "paths": {"model": str(other)}}
    assert moved_paths(SFTConfig(model=str(typed)), saved) == {}


@pytest.mark.parametrize("recorded", ["elsewhere", "../a/f/plain"])
def test_a_recorded_path_must_be_where_the_relative_value_was(tmp_path, monkeypatch, recorded):
    from omnigym.algos.lm.sft import SFTConfig
    from omnigym.track.resume import moved_paths

    two_models(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    there = str(tmp_path / "elsewhere") if recorded == "elsewhere" else recorded
    assert moved_paths(SFTConfig(model="f/plain"), {"model": "f/plain", "paths": {"model": there}}) == {}


def test_a_built_in_model_is_never_moved_to_a_recorded_folder(tmp_path, monkeypatch):
    from omnigym.algos.lm.sft import SFTConfig
    from omnigym.track.resume import moved_paths

    (tmp_path / "tiny").mkdir()
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    assert moved_paths(SFTConfig(model="tiny"), {"model": "tiny", "paths": {"model": str(tmp_path / "tiny")}}) == {}


def test_the_same_relative_name_for_another_folder_is_not_the_run_model(tmp_path, monkeypatch):
    from omnigym.algos.lm.sft import SFTConfig
    from omnigym.errors import OmnigymError
    from omnigym.track.resume import check_fixed_settings, moved_paths

    made_with, here = two_models(tmp_path)
    monkeypatch.chdir(tmp_path / "b")
    saved = {"model": "f/plain", "paths": {"model": str(made_with)}}
    cfg = SFTConfig(model="f/plain", resume=str(tmp_path / "run"))
    try:
        found = moved_paths(cfg, saved)
        check_fixed_settings(cfg, saved)
    except OmnigymError:
        return  # refused in one line: fine
    assert found.get("model") and os.path.samefile(found["model"], made_with)


def moved_run(tmp_path, monkeypatch):
    """A run started with --model f/plain from tmp_path/start, whose model folder then moved to
    tmp_path/start/moved/plain; the working directory is tmp_path/elsewhere."""
    from omnigym.models.lm import build_tiny_model

    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    elsewhere.mkdir(parents=True)
    build_tiny_model(start / "f" / "plain")
    monkeypatch.chdir(start)
    sft(start / "run", steps=2, model="f/plain")
    (start / "moved").mkdir()
    (start / "f" / "plain").rename(start / "moved" / "plain")
    monkeypatch.chdir(elsewhere)
    return start


def one_line(capsys, argv):
    capsys.readouterr()  # the first run's own output
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    return code, capsys.readouterr().err.strip().splitlines()


def test_a_moved_model_folder_is_named_on_resume(tmp_path, monkeypatch, capsys):
    start = moved_run(tmp_path, monkeypatch)
    code, err = one_line(capsys, ["train", "sft", "--resume", str(start / "run"), "--steps", "3", "--no-progress"])
    assert code == 2 and len(err) == 1 and str(start / "f" / "plain") in err[0] and "huggingface" not in err[0], err


def test_a_moved_model_folder_can_be_given_where_it_is_now(tmp_path, monkeypatch, capsys):
    start = moved_run(tmp_path, monkeypatch)
    code, err = one_line(capsys, ["train", "sft", "--resume", str(start / "run"), "--steps", "3", "--no-progress",
                                  "--model", str(start / "moved" / "plain")])
    assert code in (0, None), err
