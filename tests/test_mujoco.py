"""Continuous PPO as CleanRL's ppo_continuous_action runs it on MuJoCo: reward scaling equal to
gymnasium's NormalizeReward, normalization statistics in the checkpoint and used by eval,
same seed same metrics, exact resume, and learning InvertedPendulum-v5 (docs/mujoco.md)."""

import json

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("mujoco", reason="mujoco is not installed (pip install 'omnigym[mujoco]')")

from omnigym.algos import ppo  # noqa: E402
from omnigym.runs import evaluate_run  # noqa: E402
from omnigym.rl.running_stats import RewardScaler  # noqa: E402
from omnigym.track.checkpoint import load_checkpoint  # noqa: E402


class RewardStream(gym.Env):
    """Rewards from a fixed random stream; episodes of 7 steps that terminate."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.rewards = np.random.default_rng(0).normal(3.0, 5.0, size=1000)
        self.i = 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t, self.i = self.t + 1, self.i + 1
        return np.zeros(1, np.float32), float(self.rewards[self.i]), self.t == 7, False, {}


def test_reward_scaler_matches_gymnasium_normalize_reward():
    theirs = gym.wrappers.NormalizeReward(RewardStream(), gamma=0.99, epsilon=1e-8)
    theirs.reset(seed=0)
    ours, stream = RewardScaler(1, gamma=0.99, clip=np.inf), RewardStream()
    stream.reset()
    for _ in range(300):
        _, expected, terminated, _, _ = theirs.step(0)
        _, raw, terminated_raw, _, _ = stream.step(0)
        got = ours(np.array([raw], np.float32), np.array([terminated_raw]), np.array([True]))
        assert got[0] == pytest.approx(expected, rel=1e-4)
        if terminated:
            theirs.reset()
            stream.reset()


def small(run_dir, **extra):
    return ppo.PPOConfig(env_id="InvertedPendulum-v5", total_timesteps=2048, num_steps=256, num_minibatches=4,
                         update_epochs=2, seed=4, run_dir=str(run_dir), progress=False, plot=False,
                         tensorboard=False, **extra)


def metrics(run_dir):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in open(f"{run_dir}/metrics.jsonl")]


def test_mujoco_preset_checkpoints_its_statistics_and_repeats_itself(tmp_path):
    ppo.train(small(tmp_path / "a"))
    ppo.train(small(tmp_path / "b"))
    assert metrics(tmp_path / "a") == metrics(tmp_path / "b") and len(metrics(tmp_path / "a")) == 8
    saved = json.loads(open(tmp_path / "a" / "config.json").read())
    assert saved["preset"] == "mujoco" and saved["normalize_obs"] and saved["normalize_reward"]
    collector = load_checkpoint(tmp_path / "a")["components"]["collector"]
    assert collector["obs_rms"]["count"] > 1500 and collector["reward_scaler"]["rms"]["count"] > 1500


def test_eval_normalizes_with_the_saved_statistics(tmp_path, monkeypatch):
    from omnigym.rl import running_stats

    ppo.train(small(tmp_path / "a"))
    saved = load_checkpoint(tmp_path / "a")["components"]["collector"]["obs_rms"]
    assert np.abs(saved["mean"]).max() > 0.01 and np.abs(saved["var"] - 1).max() > 0.01  # not the initial 0 and 1
    # every observation eval feeds the policy is normalized with the run's saved statistics,
    # unchanged by the evaluation episodes
    seen, normalize = [], running_stats.RunningMeanStd.normalize

    def recording(self, x, *args, **kwargs):
        seen.append((self.mean.copy(), self.var.copy()))
        return normalize(self, x, *args, **kwargs)

    monkeypatch.setattr(running_stats.RunningMeanStd, "normalize", recording)
    assert len(evaluate_run(str(tmp_path / "a"), episodes=3, greedy=True)) == 3
    assert len(seen) > 3 and all(np.array_equal(mean, saved["mean"]) and np.array_equal(var, saved["var"])
                                 for mean, var in seen)


@pytest.mark.slow
def test_continuous_ppo_learns_inverted_pendulum(tmp_path):
    run = tmp_path / "ip"
    ppo.train(ppo.PPOConfig(env_id="InvertedPendulum-v5", total_timesteps=50_000, seed=1, run_dir=str(run),
                            progress=False, plot=False, tensorboard=False, checkpoint_every=0))
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    last_20 = [row["charts/return_last_20"] for row in rows if "charts/return_last_20" in row][-1]
    assert last_20 >= 800  # best 1000 (docs/mujoco.md)
    assert np.mean(evaluate_run(str(run), episodes=5, greedy=True)) >= 800


def test_a_mujoco_warning_is_printed_once_and_no_log_file_is_written(tmp_path, monkeypatch, capsys):
    """gymnasium's HalfCheetah XML uses MuJoCo's deprecated settotalmass: MuJoCo's own handler
    printed that for every env made and appended it to MUJOCO_LOG.TXT in the working directory.
    That one is gymnasium's, not the user's to act on (printed, it came before a refusal's one
    line): it is not printed; any other is, once."""
    import subprocess
    import sys

    from omnigym.envs import vector

    code = ("from omnigym.envs.vector import make_vec\n"
            "make_vec('HalfCheetah-v5', 3).close()\n"
            "make_vec('HalfCheetah-v5', 2).close()\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert "settotalmass" not in done.stderr and "MuJoCo warning" not in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(vector, "_MUJOCO_WARNED", set())
    for _ in range(3):
        vector._print_mujoco_warning_once("Nan, Inf or huge value in QACC at DOF 0")
    assert capsys.readouterr().err == "MuJoCo warning: Nan, Inf or huge value in QACC at DOF 0\n"
