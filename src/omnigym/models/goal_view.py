"""How a goal env's observation reaches the networks and the replay memory (``GoalLayout``):
the networks see ``observation ++ desired_goal`` (one flat float32 vector), the replay memory
stores ``observation ++ achieved_goal ++ desired_goal`` so that a goal can be swapped for one
achieved later in the episode. ``network_view`` gives any network the space it sees and the
function that turns an observation batch into its input (the identity for every other env).

It is about observation spaces only, so it lives with the networks (``models/``), below
``envs/``, whose goal envs (``envs/goal.py``) produce such observations."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")


def is_goal_space(space) -> bool:
    """A Dict of the three goal keys, each a 1-D Box (gymnasium-robotics' GoalEnv layout)."""
    return isinstance(space, gym.spaces.Dict) and set(space.spaces) >= set(GOAL_KEYS) and all(
        isinstance(space[k], gym.spaces.Box) and len(space[k].shape) == 1 for k in GOAL_KEYS) and \
        space["achieved_goal"].shape == space["desired_goal"].shape


@dataclass(frozen=True)
class GoalLayout:
    obs_dim: int
    goal_dim: int

    @classmethod
    def of(cls, space) -> "GoalLayout | None":
        """The layout of a goal env's observation space; None for any other space."""
        if not is_goal_space(space):
            return None
        return cls(space["observation"].shape[0], space["desired_goal"].shape[0])

    @property
    def stored_dim(self) -> int:
        return self.obs_dim + 2 * self.goal_dim

    @property
    def network_space(self) -> gym.spaces.Box:
        return gym.spaces.Box(-np.inf, np.inf, (self.obs_dim + self.goal_dim,), np.float32)

    def stored(self, obs: dict) -> np.ndarray:
        """A batch of Dict observations as the replay memory keeps them: ``[n, obs + 2 goal]``."""
        return np.concatenate([np.asarray(obs[k], dtype=np.float32) for k in GOAL_KEYS], -1)

    @staticmethod
    def network_input(obs: dict) -> np.ndarray:
        """A batch of Dict observations as the networks see them: ``[n, obs + goal]``."""
        return np.concatenate([np.asarray(obs[k], dtype=np.float32) for k in ("observation", "desired_goal")], -1)

    def achieved(self, stored: np.ndarray) -> np.ndarray:
        return stored[..., self.obs_dim:self.obs_dim + self.goal_dim]

    def desired(self, stored: np.ndarray) -> np.ndarray:
        return stored[..., self.obs_dim + self.goal_dim:]

    def with_goal(self, stored: np.ndarray, goals: np.ndarray) -> np.ndarray:
        """Stored observations as the networks see them, pursuing ``goals``."""
        return np.concatenate([stored[..., :self.obs_dim], goals], -1)


def network_view(space):
    """``(the space the networks see, obs batch -> network input)``: ``observation ++
    desired_goal`` for a goal env, the space and the observation unchanged otherwise."""
    layout = GoalLayout.of(space)
    return (space, lambda obs: obs) if layout is None else (layout.network_space, layout.network_input)
