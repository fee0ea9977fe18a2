"""EnvPool's C++ pool seen as a gymnasium VectorEnv (for ``--backend envpool``)."""

from __future__ import annotations

import gymnasium as gym
from gymnasium.vector import AutoresetMode


class EnvPoolVectorEnv(gym.vector.VectorEnv):
    """EnvPool's C++ pool seen as a gymnasium VectorEnv (it autoresets on the next step too)."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, pool):
        self.pool = pool
        self.num_envs = pool.config["num_envs"]
        self.single_observation_space = pool.observation_space
        self.single_action_space = pool.action_space
        self.observation_space = gym.vector.utils.batch_space(pool.observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(pool.action_space, self.num_envs)

    def reset(self, *, seed=None, options=None):
        # EnvPool takes its seed at construction; a later seed cannot re-seed the pool.
        return self.pool.reset()

    def step(self, actions):
        return self.pool.step(actions)

    def close(self, **kwargs):
        self.pool.close()
