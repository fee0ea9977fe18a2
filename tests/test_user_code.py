"""Your own env, task and reward: from Python as objects, from the CLI as ``module:name``."""

import json

import numpy as np
import pytest

from omnigym.algos.control.ppo import PPOConfig, train
from omnigym.cli import main
from omnigym.errors import OmnigymError
from omnigym.runs import evaluate_run


def ppo(tmp_path, env, name="run", steps=1024):
    return train(PPOConfig(env_id=env, total_timesteps=steps, run_dir=str(tmp_path / name), progress=False,
                           plot=False, tensorboard=False, normalize_obs=True))


def test_python_api_takes_an_env_class_a_factory_and_an_env_object(tmp_path):
    import gymnasium as gym
    import toy_envs

    by_class = ppo(tmp_path, toy_envs.SignChoiceEnv, "class")
    assert json.loads((tmp_path / "class" / "config.json").read_text())["env_id"] == "toy_envs:SignChoiceEnv"
    assert len(evaluate_run(by_class["run_dir"], episodes=2)) == 2  # found again by name

    by_lambda = ppo(tmp_path, lambda: toy_envs.SignChoiceEnv(offset=10.0), "factory")
    with pytest.raises(OmnigymError, match="trained on a Python object .* evaluate it from Python with evaluate_run"):
        evaluate_run(by_lambda["run_dir"])
    assert len(evaluate_run(by_lambda["run_dir"], episodes=2, env=toy_envs.SignChoiceEnv)) == 2

    by_object = ppo(tmp_path, gym.wrappers.TimeLimit(toy_envs.SignChoiceEnv(), 20), "object")
    assert by_object["global_step"] > 900


def test_cli_takes_a_registered_id_from_a_module_and_a_class(tmp_path, capsys):
    for env_id in ("toy_envs:SignChoice-v0", "toy_envs:SignChoiceEnv"):
        run_dir = tmp_path / env_id.replace(":", "_")
        assert main(["train", "ppo", "--env-id", env_id, "--total-timesteps", "512", "--run-dir", str(run_dir),
                     "--no-progress", "--no-plot"]) == 0
        assert main(["eval", str(run_dir), "--episodes", "2"]) == 0
        assert "2 episodes: mean return" in capsys.readouterr().out


def test_a_module_that_fails_to_import_is_named_with_its_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken_env.py").write_text("import gymnasium\n\nraise ValueError('typo here')\n")
    assert main(["train", "ppo", "--env-id", "broken_env:Env"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"omnigym: error: --env-id broken_env:Env: importing it failed at {tmp_path / 'broken_env.py'}:3: "
                   "ValueError: typo here")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["__pycache__", "broken_env.py"] or \
        sorted(p.name for p in tmp_path.iterdir()) == ["broken_env.py"]


def grpo_flags(tmp_path, *extra):
    return ["train", "grpo", "--task", "toy_text:short_questions", "--eval-size", "8", "--sft-steps", "0",
            "--steps", "2", "--prompts-per-step", "2", "--group-size", "2", "--run-dir", str(tmp_path / "run"),
            "--no-progress", "--no-plot", "--no-tensorboard", *extra]


def test_accuracy_follows_the_tasks_own_reward_and_cut_off_completions_are_reported(tmp_path, capsys):
    """With a reward that gives every completion 1, held-out accuracy is 1.0 (it was fixed
    to the math reward, which scores these answers 0); with 2 new tokens nearly every
    completion is cut off, and the run says so."""
    assert main(grpo_flags(tmp_path, "--rewards", "toy_text:anything:1.0", "--max-new-tokens", "2")) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["eval/accuracy"] for r in rows if "eval/accuracy" in r] == [1.0, 1.0]
    assert rows[-1]["completion/cut_off_fraction"] > 0.9 and rows[-1]["reward/toy_text:anything"] == 1.0
    err = capsys.readouterr().err
    assert "held-out accuracy before GRPO: 1.000  after: 1.000" in err
    assert "completions cut off by --max-new-tokens 2: " in err


def test_accuracy_reward_can_be_named(tmp_path):
    assert main(grpo_flags(tmp_path, "--rewards", "toy_text:anything:1.0", "--accuracy-reward", "math",
                           "--max-new-tokens", "2")) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["eval/accuracy"] for r in rows if "eval/accuracy" in r] == [0.0, 0.0]


def test_a_reward_of_the_wrong_shape_is_one_line_and_leaves_no_run(tmp_path, capsys):
    assert main(grpo_flags(tmp_path, "--rewards", "toy_text:wrong_shape:1.0", "--max-new-tokens", "2")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["omnigym: error: reward toy_text:wrong_shape returned shape (9,) for 8 completions; a reward "
                   "returns one float per completion (wrap a per-example function with per_sample)"]
    assert not (tmp_path / "run").exists()


def test_progress_is_a_line_every_so_often_without_a_terminal(capsys):
    from omnigym.track.progress import ProgressBar

    bar = ProgressBar(1000, "ppo", line_every=0.0)
    bar.update(250, sps=100, ret=np.float64(21.5).item())
    bar.close()
    assert capsys.readouterr().err.startswith("ppo: 250/1000 (25%) sps 100  ret 21.5  [")
