"""Envs that need memory: what a policy must remember is left out of each observation.

``omnigym/CartPoleNoVel-v1`` is CartPole-v1 with the two velocities removed from the
observation (cart position and pole angle only), the task sb3-contrib's RecurrentPPO and
RL-Zoo use for recurrent policies. One observation cannot tell a pole falling left from one
rising left; two consecutive ones can, so a policy with memory (``omnigym train ppo_lstm``)
solves it and a feed-forward one (``omnigym train ppo``) does not. Same dynamics, rewards,
500-step limit and 475 threshold as CartPole-v1.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

POSITIONS = np.array([0, 2])
"""CartPole's observation is (x, x_dot, theta, theta_dot): the positions are x and theta"""

IDS = ("omnigym/CartPoleNoVel-v1",)


class CartPoleNoVelEnv(CartPoleEnv):
    def __init__(self, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        high = self.observation_space.high[POSITIONS]
        self.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return obs[POSITIONS], info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs[POSITIONS], reward, terminated, truncated, info


def register() -> None:
    if IDS[0] not in gym.registry:
        gym.register(IDS[0], entry_point="omnigym.envs.memory:CartPoleNoVelEnv", max_episode_steps=500,
                     reward_threshold=475.0)
