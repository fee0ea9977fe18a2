"""``omnigym eval`` reproduces a checkpoint's training-time return: discrete, continuous
with observation normalization (and clipping to the action box), and pixels.

Each env (tests/toy_envs.py) has a known best return that training reaches, and each
breaks an eval that does not treat observations and actions as training did: the
observation offset of 1000 hides the signal without the run's normalization, and the
continuous reward punishes actions outside the box, which only clipping avoids.
"""

import json

import numpy as np
import pytest

from omnigym.algos.control.ppo import PPOConfig, train
from omnigym.cli import main
from omnigym.runs import evaluate_run


def trained(tmp_path, env_id, steps, **flags):
    out = train(PPOConfig(env_id=env_id, total_timesteps=steps, run_dir=str(tmp_path / "run"), progress=False,
                          plot=False, tensorboard=False, **flags))
    return out["run_dir"], out["mean_return_last_20"]


@pytest.mark.parametrize("env_id, best", [("toy_envs:SignChoiceEnv", 20.0), ("toy_envs:SignEnv", 0.0)])
def test_eval_reproduces_training_return_with_normalized_observations(tmp_path, capsys, env_id, best):
    run_dir, training_return = trained(tmp_path, env_id, 8192, normalize_obs=True)
    assert abs(training_return - best) < 0.5, training_return
    for greedy in (False, True):
        returns = evaluate_run(run_dir, episodes=20, greedy=greedy)
        assert abs(np.mean(returns) - training_return) < 0.5, (greedy, np.mean(returns), training_return)
    # From the shell, by the name the run's config.json recorded.
    assert json.loads((tmp_path / "run" / "config.json").read_text())["env_id"] == env_id
    assert main(["eval", run_dir, "--episodes", "5"]) == 0
    assert f"mean return {best:.2f}" in capsys.readouterr().out.replace("-0.00", "0.00")


@pytest.mark.slow
def test_eval_reproduces_training_return_on_pixels(tmp_path):
    """2048 steps (8 updates): the last 20 training episodes averaged 20.0 on seed 1 (19.9 on seed 2,
    19.75 at 1536 steps) and the greedy eval 20.0; the CNN's updates are the test's cost."""
    run_dir, training_return = trained(tmp_path, "toy_envs:SidePixelEnv", 2048)
    assert training_return > 19.0, training_return
    assert abs(np.mean(evaluate_run(run_dir, episodes=20, greedy=True)) - training_return) < 1.0


def test_eval_without_normalization_would_not_reproduce(tmp_path):
    """The check above can fail: the same checkpoint without its normalization statistics
    scores far below its training return."""
    import torch

    run_dir, training_return = trained(tmp_path, "toy_envs:SignChoiceEnv", 8192, normalize_obs=True)
    checkpoint = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    checkpoint["components"]["collector"]["obs_rms"] = None
    torch.save(checkpoint, tmp_path / "run" / "checkpoint.pt")
    assert np.mean(evaluate_run(run_dir, episodes=20, greedy=True)) < training_return - 5


def test_eval_plays_the_env_the_run_trained_on_with_its_env_kwargs(tmp_path, capsys):
    """A run trained with --env-kwargs (here gymnasium's time limit) is evaluated on that env,
    not on the id's defaults: a locomotion run's commands and randomization are such settings."""
    run_dir, _ = trained(tmp_path, "CartPole-v1", 512, env_kwargs=("max_episode_steps=7",))
    returns = evaluate_run(run_dir, episodes=5, greedy=True)
    assert max(returns) <= 7 and 7 in returns, returns  # the untrained policy reaches the limit sometimes
    assert max(evaluate_run(run_dir, episodes=5, greedy=True, env="CartPole-v1")) > 7  # another env: its own


def test_sampled_eval_is_repeatable_with_its_seed(tmp_path):
    run_dir, _ = trained(tmp_path, "CartPole-v1", 1024)
    first, again = evaluate_run(run_dir, episodes=5, seed=3), evaluate_run(run_dir, episodes=5, seed=3)
    assert first == again
    assert evaluate_run(run_dir, episodes=5, seed=4) != first


def test_eval_of_an_env_that_never_ends_stops_with_one_line(tmp_path, monkeypatch):
    from omnigym.errors import OmnigymError
    from omnigym.evaluation import control

    run_dir, _ = trained(tmp_path, "toy_envs:EndlessEnv", 256)
    monkeypatch.setattr(control, "MAX_EPISODE_STEPS", 500)
    with pytest.raises(OmnigymError, match="no episode ended in 500 steps; give the env a time limit"):
        evaluate_run(run_dir, episodes=2)


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_a_config_edited_to_another_env_is_one_line_for_eval_and_load_policy(tmp_path, capsys, algo):
    """A config.json whose env_id was edited (CartPole's checkpoint, Acrobot's spaces) gave torch's
    size-mismatch traceback; Python's load_policy(run, env=...) with another env did too."""
    from omnigym.runs import load_policy

    run = tmp_path / "run"
    steps = ["--total-timesteps", "256"] + (["--learning-starts", "64"] if algo == "dqn" else [])
    assert main(["train", algo, "--env-id", "CartPole-v1", *steps, "--run-dir", str(run), "--no-progress",
                 "--no-plot"]) == 0
    with pytest.raises(Exception, match="does not fit the env it is played on") as other_env:
        load_policy(run, env="Acrobot-v1")
    assert "Traceback" not in str(other_env.value)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "env_id": "Acrobot-v1"}))
    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"omnigym: error: the checkpoint in {run} does not fit the env it is played on (observations "
                   "of shape (6,), actions Discrete(3)): give the env it was trained on (config.json says env_id "
                   "'Acrobot-v1'); if it is, the checkpoint is not the one config.json describes (another run's "
                   "checkpoint.pt, or an edited config.json)"], err


def test_a_checkpoint_with_keys_the_runs_networks_lack_is_one_line(tmp_path, capsys):
    """iql's checkpoint.pt copied into a td3_bc run raised torch's 'Unexpected key(s) "log_std"' traceback."""
    import torch

    run = tmp_path / "run"
    assert main(["train", "ppo", "--total-timesteps", "256", "--run-dir", str(run), "--no-progress", "--no-plot"]) == 0
    saved = torch.load(run / "checkpoint.pt", weights_only=False)
    saved["components"]["model"]["log_std"] = torch.zeros(1)
    torch.save(saved, run / "checkpoint.pt")
    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the checkpoint is not the one config.json describes (another run's checkpoint.pt" in err[0]


@pytest.mark.parametrize("algo, env_id, other", [("dqn", "CartPole-v1", "Pendulum-v1"),
                                                 ("sac", "Pendulum-v1", "CartPole-v1")])
def test_a_config_edited_to_another_kind_of_space_is_one_line(tmp_path, capsys, algo, env_id, other):
    """Discrete actions for a continuous actor, or a Box for DQN: the builders raised IndexError
    and AttributeError (found by an attacker helper)."""
    run = tmp_path / "run"
    steps = ["--total-timesteps", "300", "--learning-starts", "100"]
    assert main(["train", algo, "--env-id", env_id, *steps, "--run-dir", str(run), "--no-progress", "--no-plot"]) == 0
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "env_id": other}))
    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"omnigym: error: the checkpoint in {run} does not fit the env it "
                                               f"is played on") and "building its policy raised" in err[0], err


def test_an_interrupted_eval_says_only_that_it_stopped(tmp_path, capsys, monkeypatch):
    """It said the training line, "the run had not started; nothing was written" (found by an
    attacker helper): eval trains no run."""
    import omnigym.runs

    monkeypatch.setattr(omnigym.runs, "play_episodes", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    run_dir, _ = trained(tmp_path, "toy_envs:SignChoiceEnv", 256)
    capsys.readouterr()
    assert main(["eval", run_dir, "--episodes", "1"]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["omnigym: interrupted"]


def test_eval_says_when_the_run_has_not_finished(tmp_path, capsys, monkeypatch):
    """A run stopped part-way was evaluated as if it were the finished policy, with no word of it; a finished
    on-policy run stands below its --total-timesteps (autoreset steps are not counted) and gets no such line."""
    from interrupts import interrupt_at_log

    config = PPOConfig(env_id="CartPole-v1", total_timesteps=2048, num_envs=4, num_steps=32, checkpoint_every=256,
                       run_dir=str(tmp_path / "cut"), progress=False, plot=False, tensorboard=False)
    interrupt_at_log(monkeypatch, lambda: train(config), 6)
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "cut"), "--episodes", "1"]) == 0
    assert "the run has not finished: its last checkpoint is at update 5 of 16" in capsys.readouterr().out
    train(PPOConfig(**{**config.__dict__, "run_dir": None, "resume": str(tmp_path / "cut")}))
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "cut"), "--episodes", "1"]) == 0
    assert "not finished" not in capsys.readouterr().out
