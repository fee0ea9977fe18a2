"""Hindsight relabelling against Stable-Baselines3's ``HerReplayBuffer``: the same finished
episodes stored in both, large minibatches drawn from each with the same strategy and k.

The two draw from different random streams (SB3 from numpy's global one, omnigym from the
run's generator), so the draws are compared as distributions: for each strategy, the share of
each (transition, new goal) pair among the relabelled samples, and the reward each side gives a
pair, which both recompute with the env's ``compute_reward``. Each transition's next achieved
goal is unique here, so a sample names its transition and the transition its goal came from.

Differences, asserted below:

- How many of a minibatch are relabelled: SB3 ``int(batch * (1 - 1 / (k + 1)))`` (rounded down,
  the relabelled ones last), omnigym ``round(batch * k / (k + 1))`` (the first ones): 204 and
  205 of 256 with k = 4.
- A running episode: SB3 draws only from finished episodes; omnigym also from the one still
  running, which ends at its newest transition (rl/her.py). The episodes here are finished.

Skips when Stable-Baselines3 is not installed (``[bench]``, in ``[dev]``).
"""

from __future__ import annotations

from collections import Counter

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("stable_baselines3", reason="Stable-Baselines3 is not installed (pip install 'omnigym[bench]')")

from omnigym.envs.goal import GoalLayout  # noqa: E402
from omnigym.rl.her import HindsightRelabelling  # noqa: E402
from omnigym.rl.replay import ReplayBuffer  # noqa: E402

EPISODES = ((0, 5), (10, 4), (30, 6))  # (first achieved goal, length): after step t it is start + t + 1
DESIRED, STORED_REWARD, K, DRAWS = 99.0, 7.0, 4, 60_000
LAYOUT = GoalLayout(obs_dim=1, goal_dim=1)


def compute_reward(achieved, goals, info):
    """A reward that names the (achieved, goal) pair it was computed from."""
    achieved, goals = np.asarray(achieved, np.float64), np.asarray(goals, np.float64)
    return (-np.abs(achieved - goals)[:, 0] * 1000 - achieved[:, 0]).astype(np.float32)


class GoalToy(gym.Env):
    """SB3's buffer asks its env for ``compute_reward``; only the spaces and that matter."""

    observation_space = gym.spaces.Dict({k: gym.spaces.Box(-1e3, 1e3, (1,), np.float32)
                                         for k in ("observation", "achieved_goal", "desired_goal")})
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}

    def compute_reward(self, achieved_goal, desired_goal, info):
        return compute_reward(achieved_goal, desired_goal, info)


def step_obs(achieved: float) -> dict:
    return {"observation": np.array([[achieved]], np.float32), "achieved_goal": np.array([[achieved]], np.float32),
            "desired_goal": np.array([[DESIRED]], np.float32)}


def transitions():
    for start, length in EPISODES:
        for t in range(length):
            yield step_obs(start + t), step_obs(start + t + 1), t == length - 1


def omnigym_draws(strategy: str, draws: int):
    buffer = ReplayBuffer(100, (LAYOUT.stored_dim,), (1,), num_envs=1, goals=LAYOUT,
                          relabel=HindsightRelabelling(strategy, K, compute_reward))
    for obs, next_obs, last in transitions():
        buffer.add(obs, np.zeros((1, 1), np.float32), np.array([STORED_REWARD]), next_obs, np.array([False]),
                   truncated=np.array([last]))
    batch = buffer.sample(draws, np.random.default_rng(0))
    moved = batch["relabelled"].numpy()
    # obs is [observation, goal]; here the observation is the achieved goal
    return (batch["next_obs"].numpy()[moved, 0], batch["obs"].numpy()[moved, 1], batch["rewards"].numpy()[moved],
            int(moved.sum()))


def sb3_draws(strategy: str, draws: int):
    from stable_baselines3 import HerReplayBuffer
    from stable_baselines3.common.vec_env import DummyVecEnv

    env = DummyVecEnv([GoalToy])
    buffer = HerReplayBuffer(100, env.observation_space, env.action_space, env=env, device="cpu",
                             n_sampled_goal=K, goal_selection_strategy=strategy)
    for obs, next_obs, last in transitions():
        buffer.add(obs, next_obs, np.zeros((1, 1), np.float32), np.array([STORED_REWARD]), np.array([last]),
                   [{"TimeLimit.truncated": last}])
    np.random.seed(0)
    batch = buffer.sample(draws)
    virtual = int(buffer.her_ratio * draws)  # SB3 puts the relabelled ones last
    achieved = batch.next_observations["achieved_goal"].numpy()[-virtual:, 0]
    goals = batch.observations["desired_goal"].numpy()[-virtual:, 0]
    assert (batch.next_observations["desired_goal"].numpy()[-virtual:, 0] == goals).all()
    return achieved, goals, batch.rewards.numpy()[-virtual:, 0], virtual


def shares(achieved, goals) -> dict:
    counts = Counter(zip(achieved.tolist(), goals.tolist()))
    return {pair: n / len(achieved) for pair, n in counts.items()}


def total_variation(p: dict, q: dict) -> float:
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in p.keys() | q.keys())


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_relabelled_goals_and_rewards_are_sb3s(strategy):
    ours_achieved, ours_goals, ours_rewards, ours_n = omnigym_draws(strategy, DRAWS)
    their_achieved, their_goals, their_rewards, their_n = sb3_draws(strategy, DRAWS)
    assert ours_n == their_n == DRAWS * K // (K + 1)  # 60,000 is a multiple of k + 1: no rounding
    ours, theirs = shares(ours_achieved, ours_goals), shares(their_achieved, their_goals)
    assert ours.keys() == theirs.keys()  # the same goals are possible for each transition
    # the same chance of each (transition, goal): sampling noise only (about 0.01 at these sizes)
    assert total_variation(ours, theirs) < 0.03
    for achieved, goals, rewards in ((ours_achieved, ours_goals, ours_rewards),
                                     (their_achieved, their_goals, their_rewards)):
        assert np.array_equal(rewards, compute_reward(achieved[:, None], goals[:, None], {}))
        assert (rewards != STORED_REWARD).all()


def test_the_comparison_tells_the_strategies_apart():
    """The distributions above are close for the same strategy and far for another."""
    future = shares(*omnigym_draws("future", DRAWS)[:2])
    episode = shares(*sb3_draws("episode", DRAWS)[:2])
    assert total_variation(future, episode) > 0.2


def test_sb3_rounds_the_relabelled_count_down_where_omnigym_rounds_to_nearest():
    assert omnigym_draws("future", 256)[3] == 205
    assert sb3_draws("future", 256)[3] == 204
