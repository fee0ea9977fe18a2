"""SAC and TD3: they learn Pendulum (slow tests, thresholds in docs/sac.md and docs/td3.md),
same seed gives the same metrics, an interrupted run resumes to the same metrics, a bad input
through the CLI is one line with nothing written, and ``omnigym eval`` replays a run."""

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

import test_bad_input
from omnigym.algos import sac, td3
from omnigym.cli import main
from omnigym.runs import evaluate_run
from omnigym.models.continuous import QNetwork, SquashedGaussianActor
from omnigym.track.checkpoint import load_checkpoint
from interrupts import interrupt_at_log
from test_reproducibility import metrics


class PixelBoxEnv(gym.Env):
    """C x 84 x 84 frames with a continuous action: SAC and TD3 here refuse it (no CNN)."""

    observation_space = gym.spaces.Box(0, 255, (1, 84, 84), np.uint8)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros((1, 84, 84), np.uint8), {}

    def step(self, action):
        return np.zeros((1, 84, 84), np.uint8), 0.0, False, True, {}


MODULES = {"sac": (sac, sac.SACConfig), "td3": (td3, td3.TD3Config)}
SMALL = dict(total_timesteps=2000, learning_starts=300, batch_size=64, hidden=(64, 64), buffer_size=5000,
             log_every=200, checkpoint_every=400)


def train(name, run_dir, **extra):
    module, config_cls = MODULES[name]
    cfg = config_cls(seed=7, run_dir=str(run_dir), progress=False, plot=False, tensorboard=False,
                     **{**SMALL, **extra})
    return module.train(cfg)


# Learning: judged at the end of the run (the last 10 training episodes: Pendulum's episodes
# are 200 steps, so a metrics line every 2000 steps holds 10; and the final checkpoint's
# greedy policy on 10 fresh episodes). Random play scores about -1200, solved about -150.

def last_10_episodes(run_dir) -> float:
    rows = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]
    assert rows[-1]["charts/episodes"] == 10
    return rows[-1]["charts/episodic_return"]


def quiet(tmp_path):
    return dict(env_id="Pendulum-v1", seed=1, learning_starts=1000, log_every=2000, run_dir=str(tmp_path / "run"),
                progress=False, plot=False, tensorboard=False, checkpoint_every=0)


@pytest.mark.slow
def test_sac_learns_pendulum(tmp_path):
    sac.train(sac.SACConfig(total_timesteps=6000, **quiet(tmp_path)))
    assert last_10_episodes(tmp_path / "run") > -400
    assert np.mean(evaluate_run(str(tmp_path / "run"), episodes=10, greedy=True)) > -300


@pytest.mark.slow
def test_td3_learns_pendulum(tmp_path):
    # 8000 steps: last 10 episodes -180.3, eval -117.4 (10000: -166.4, -113.4; docs/td3.md)
    td3.train(td3.TD3Config(total_timesteps=8000, **quiet(tmp_path)))
    assert last_10_episodes(tmp_path / "run") > -400
    assert np.mean(evaluate_run(str(tmp_path / "run"), episodes=10, greedy=True)) > -300


# Reliability.

@pytest.mark.parametrize("name", ["sac", "td3"])
def test_same_seed_gives_identical_metrics(name, tmp_path):
    train(name, tmp_path / "a", total_timesteps=1000)
    train(name, tmp_path / "b", total_timesteps=1000)
    a, b = metrics(tmp_path / "a"), metrics(tmp_path / "b")
    assert len(a) == 5 and "losses/actor_loss" in a[-1] and "losses/qf1_loss" in a[-1]
    assert a == b


@pytest.mark.parametrize("name", ["sac", "td3"])
def test_interrupted_run_resumes_to_the_same_metrics(name, tmp_path, monkeypatch):
    """With --save-buffer: interrupted on the 7th metrics line (step 1400, after the checkpoint
    at 1200), the resumed run drops that line and redoes the work to the same numbers (the runs end at
    1600, one line after the cut)."""
    train(name, tmp_path / "whole", save_buffer=True, total_timesteps=1600)
    interrupt_at_log(monkeypatch, lambda: train(name, tmp_path / "cut", save_buffer=True, total_timesteps=1600), n=7)
    assert len(metrics(tmp_path / "cut")) == 7

    train(name, tmp_path / "cut", save_buffer=True, resume=str(tmp_path / "cut"), total_timesteps=1600)
    assert len(metrics(tmp_path / "whole")) == 8 and metrics(tmp_path / "cut") == metrics(tmp_path / "whole")


@pytest.mark.parametrize("name", ["sac", "td3"])
def test_without_save_buffer_a_resumed_run_refills_the_buffer_first(name, tmp_path):
    train(name, tmp_path / "run", total_timesteps=1000)
    saved = load_checkpoint(tmp_path / "run")
    assert saved["components"]["replay"]["buffer"] is None and saved["counters"]["q_updates"] == 700
    train(name, tmp_path / "run", total_timesteps=1600, resume=str(tmp_path / "run"))
    # 600 more steps, the first learning_starts (300) of them only refilling the empty buffer.
    assert load_checkpoint(tmp_path / "run")["counters"]["q_updates"] == 1000
    with_buffer = tmp_path / "with"
    train(name, with_buffer, total_timesteps=1000, save_buffer=True)
    assert load_checkpoint(with_buffer)["components"]["replay"]["buffer"] is not None


def test_omnigym_eval_replays_a_short_sac_run(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["train", "sac", "--total-timesteps", "600", "--learning-starts", "300", "--batch-size", "32",
                 "--hidden", "32", "32", "--run-dir", str(run_dir), "--no-progress", "--no-plot",
                 "--no-tensorboard"]) == 0
    returns = evaluate_run(str(run_dir), episodes=2)
    assert len(returns) == 2 and all(-2000 < r <= 0 for r in returns)
    assert evaluate_run(str(run_dir), episodes=2) == returns  # same seed, same sampled actions
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "2", "--greedy"]) == 0
    assert "2 episodes: mean return" in capsys.readouterr().out


def test_squashed_gaussian_log_prob_matches_torch_distributions():
    torch.manual_seed(0)
    space = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
    actor = SquashedGaussianActor(3, space, (16,))
    obs = torch.randn(5, 3)
    torch.manual_seed(1)
    action, log_prob = actor.sample(obs)
    mean, log_std = actor._mean_log_std(obs)
    u = torch.atanh(((action - actor.action_bias) / actor.action_scale).clamp(-1 + 1e-6, 1 - 1e-6))
    expected = torch.distributions.Normal(mean, log_std.exp()).log_prob(u) \
        - torch.log(actor.action_scale * (1 - torch.tanh(u) ** 2) + 1e-6)
    assert torch.allclose(log_prob, expected.sum(-1), atol=1e-3)
    assert (action >= torch.tensor(space.low)).all() and (action <= torch.tensor(space.high)).all()
    assert (log_std >= -5).all() and (log_std <= 2).all()


def test_twin_q_network_is_two_independent_mlps():
    q = QNetwork(3, 2, (8, 8), n=2)
    obs, actions = torch.randn(4, 3), torch.randn(4, 2)
    out = q(obs, actions)
    assert out.shape == (2, 4) and not torch.allclose(out[0], out[1])
    assert torch.allclose(q.q1(obs, actions), out[0], atol=1e-6)
    out[1].sum().backward()  # Q_2's loss leaves Q_1's weights alone
    assert all(w.grad[0].abs().sum() == 0 for w in q.weights)


BAD = [
    (["train", "sac", "--env-id", "CartPole-v1"], "SAC needs a continuous (Box) action space, but the env has "
                                                  "Discrete(2); use dqn or ppo for discrete actions"),
    (["train", "td3", "--env-id", "CartPole-v1"], "TD3 needs a continuous (Box) action space, but the env has "
                                                  "Discrete(2); use dqn or ppo"),
    (["train", "sac", "--env-id", "test_sac_td3:PixelBoxEnv"], "SAC here takes vector observations (a 1-D Box), got "
                                                               "shape (1, 84, 84) (images need a CNN encoder"),
    (["train", "td3", "--env-id", "test_sac_td3:PixelBoxEnv"], "TD3 here takes vector observations"),
    (["train", "sac", "--tau", "0"], "--tau must be in (0, 1], got 0.0"),
    (["train", "sac", "--tau", "1.5"], "--tau must be in (0, 1], got 1.5"),
    (["train", "sac", "--batch-size", "0"], "--batch-size must be positive, got 0"),
    (["train", "sac", "--policy-frequency", "0"], "--policy-frequency must be positive, got 0"),
    (["train", "sac", "--buffer-size", "0"], "--buffer-size must be positive, got 0"),
    (["train", "sac", "--learning-starts", "-1"], "--learning-starts must be 0 or more, got -1"),
    (["train", "sac", "--alpha", "-0.1"], "--alpha must be 0 or more, got -0.1"),
    (["train", "sac", "--q-lr", "0"], "--q-lr must be positive, got 0.0"),
    (["train", "sac", "--hidden", "256", "0"], "--hidden must be positive, got (256, 0)"),
    (["train", "td3", "--tau", "0"], "--tau must be in (0, 1], got 0.0"),
    (["train", "td3", "--tau", "1.5"], "--tau must be in (0, 1], got 1.5"),
    (["train", "td3", "--batch-size", "0"], "--batch-size must be positive, got 0"),
    (["train", "td3", "--policy-frequency", "0"], "--policy-frequency must be positive, got 0"),
    (["train", "td3", "--buffer-size", "0"], "--buffer-size must be positive, got 0"),
    (["train", "td3", "--learning-starts", "-5"], "--learning-starts must be 0 or more, got -5"),
    (["train", "td3", "--policy-noise", "-0.2"], "--policy-noise must be 0 or more, got -0.2"),
    (["train", "td3", "--gamma", "1.5"], "--gamma must be between 0 and 1, got 1.5"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_gets_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, argv, message):
    test_bad_input.test_bad_input_gets_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, argv, message)
