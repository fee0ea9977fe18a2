"""The rollout's cheaper per-step code computes what the code it replaced computed, bit for
bit (issue 41: rollouts at the env's speed without changing results): the episode
statistics wrapper against gymnasium's, the batch mean and variance against numpy's, the
reward scaler and the observation normalizer against their former formulas, and the
collector's step count against the valid steps."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from omnigym.envs.episode_stats import RecordEpisodeStatistics
from omnigym.envs.vector import make_vec
from omnigym.models.control import ActorCritic
from omnigym.rl.rollout import RolloutCollector
from omnigym.rl.running_stats import RewardScaler, RunningMeanStd, mean_var
from omnigym.track.episodes import EpisodeStats


def sync_cartpole(n):
    return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * n, autoreset_mode=AutoresetMode.NEXT_STEP)


def test_make_vec_uses_the_cheaper_episode_statistics():
    envs = make_vec("CartPole-v1", 2, backend="sync", seed=0)
    assert type(envs) is RecordEpisodeStatistics
    envs.close()


def same_step_cartpole(n):  # gymnasium's own step, reached through the wrapper's fallback
    return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * n, autoreset_mode=AutoresetMode.SAME_STEP)


@pytest.mark.parametrize("make", [sync_cartpole, lambda n: gym.make_vec("CartPole-v1", n, "vector_entry_point"),
                                  same_step_cartpole])
def test_episode_statistics_equal_gymnasiums(make):
    ours, theirs = RecordEpisodeStatistics(make(4)), gym.wrappers.vector.RecordEpisodeStatistics(make(4))
    ours.reset(seed=3), theirs.reset(seed=3)
    actions = np.random.default_rng(0).integers(0, 2, (400, 4))
    finished = 0
    for step in actions:
        a, b = ours.step(step), theirs.step(step)
        np.testing.assert_array_equal(a[1], b[1])
        assert ("episode" in a[4]) == ("episode" in b[4])
        if "episode" in a[4]:
            finished += int(a[4]["_episode"].sum())
            np.testing.assert_array_equal(a[4]["_episode"], b[4]["_episode"])
            for key in "rl":
                np.testing.assert_array_equal(a[4]["episode"][key], b[4]["episode"][key])
        np.testing.assert_array_equal(ours.episode_returns, theirs.episode_returns)
        np.testing.assert_array_equal(ours.episode_lengths, theirs.episode_lengths)
    assert finished > 20 and ours.episode_count == theirs.episode_count
    assert list(ours.return_queue) == list(theirs.return_queue)
    assert list(ours.length_queue) == list(theirs.length_queue)


@pytest.mark.parametrize("shape", [(1, 17), (8, 4), (64, 48), (2,), (5,), (64,)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mean_var_is_numpys_bit_for_bit(shape, dtype):
    batch = (np.random.default_rng(1).normal(size=shape) * 100 + 7).astype(dtype)
    mean, var = mean_var(batch)
    np.testing.assert_array_equal(mean, batch.mean(0))
    np.testing.assert_array_equal(var, batch.var(0))
    assert np.asarray(mean).dtype == batch.mean(0).dtype and np.asarray(var).dtype == batch.var(0).dtype


class FormerRewardScaler(RewardScaler):
    """The scaler as it was before issue 41: np.where and a boolean index on every step, np.clip."""

    def __call__(self, rewards, terminated, valid):
        self.returns = np.where(valid, self.returns * self.gamma * (1 - terminated) + rewards, self.returns)
        if valid.any():
            self.rms.combine(self.returns[valid].mean(0), self.returns[valid].var(0), int(valid.sum()))
        scaled = rewards / math.sqrt(float(self.rms.var) + 1e-8)
        return np.clip(scaled, -self.clip, self.clip).astype(np.float32, copy=False)


@pytest.mark.parametrize("n", [1, 4])
def test_reward_scaler_and_normalizer_give_the_former_numbers(n):
    rng = np.random.default_rng(2)
    ours, former = RewardScaler(n, 0.99), FormerRewardScaler(n, 0.99)
    obs_rms = RunningMeanStd((3,))
    former_mean, former_var, count = np.zeros(3), np.ones(3), 1e-4
    for step in range(300):
        rewards = (rng.normal(size=n) * 50).astype(np.float32)
        terminated, valid = rng.random(n) < 0.05, rng.random(n) < (0.5 if step % 3 == 0 else 1.0)
        np.testing.assert_array_equal(ours(rewards, terminated, valid), former(rewards, terminated, valid))
        obs = (rng.normal(size=(n, 3)) * 30).astype(np.float32)
        obs_rms.update(obs)
        # the former update (numpy's mean and var) and the former normalize (np.clip)
        delta, total = obs.mean(0) - former_mean, count + n
        former_mean = former_mean + delta * n / total if n > 1 else former_mean + delta / total
        m2 = former_var * count + obs.var(0) * n + delta**2 * count * n / total
        former_var = m2 / total if n > 1 else (former_var * count + delta**2 * count / total) / total
        count = total
        np.testing.assert_array_equal(obs_rms.mean, former_mean)
        np.testing.assert_array_equal(obs_rms.var, former_var)
        expected = (obs - former_mean) / np.sqrt(former_var + 1e-8)
        expected = np.clip(expected, -10, 10).astype(np.float32)
        np.testing.assert_array_equal(obs_rms.normalize(obs), expected)
    np.testing.assert_array_equal(ours.returns, former.returns)


def test_the_collector_counts_the_valid_steps_and_repeats_itself():
    def run():
        envs = make_vec("CartPole-v1", 4, backend="native", seed=5)
        torch.manual_seed(0)
        agent = ActorCritic(envs.single_observation_space, envs.single_action_space)
        stats = EpisodeStats()
        collector = RolloutCollector(envs, 64, stats, "cpu", 5, normalize_obs=True,
                                     reward_scaler=RewardScaler(4, 0.99))
        rollout, steps = collector.collect(agent, 0)
        envs.close()
        return rollout, steps, stats.take()

    (first, steps, episodes), (second, _, _) = run(), run()
    assert steps == int(first.valid.sum()) < 64 * 4 and len(episodes) > 0
    for name in ("obs", "actions", "logprobs", "values", "rewards", "valid"):
        torch.testing.assert_close(getattr(first, name), getattr(second, name), rtol=0, atol=0)
