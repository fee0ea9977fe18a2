"""Replay buffer for off-policy algorithms (DQN now, SAC later)."""

from __future__ import annotations

import numpy as np
import torch


class ReplayBuffer:
    """A circular buffer of transitions ``(obs, action, reward, next_obs, terminated)``.

    Only ``terminated`` is stored: a truncated transition still bootstraps from its next
    observation, which is the episode's true final observation.
    """

    def __init__(self, capacity: int, obs_shape: tuple, action_shape: tuple, obs_dtype=np.float32, action_dtype=np.int64):
        self.capacity = capacity
        self.obs = np.zeros((capacity, *obs_shape), dtype=obs_dtype)
        self.next_obs = np.zeros((capacity, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros((capacity, *action_shape), dtype=action_dtype)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.terminated = np.zeros(capacity, dtype=np.float32)
        self.position = 0
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, obs, actions, rewards, next_obs, terminated, valid=None) -> None:
        """Add a batch of transitions (one per env) in one write per array. ``valid`` masks out
        autoreset steps. A batch longer than the buffer keeps its last ``capacity`` rows."""
        if valid is not None:
            obs, actions, rewards, next_obs, terminated = (a[valid] for a in (obs, actions, rewards, next_obs, terminated))
        n = len(rewards)
        if n > self.capacity:
            obs, actions, rewards, next_obs, terminated = (a[n - self.capacity:] for a in
                                                           (obs, actions, rewards, next_obs, terminated))
            self.position, n = (self.position + n - self.capacity) % self.capacity, self.capacity
        rows = (self.position + np.arange(n)) % self.capacity
        self.obs[rows], self.actions[rows], self.rewards[rows] = obs, actions, rewards
        self.next_obs[rows], self.terminated[rows] = next_obs, terminated
        self.position = (self.position + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        idx = rng.integers(0, self.size, size=batch_size)
        return {
            "obs": torch.as_tensor(self.obs[idx]),
            "actions": torch.as_tensor(self.actions[idx]),
            "rewards": torch.as_tensor(self.rewards[idx]),
            "next_obs": torch.as_tensor(self.next_obs[idx]),
            "terminated": torch.as_tensor(self.terminated[idx]),
        }

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("obs", "next_obs", "actions", "rewards", "terminated", "position", "size")}

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)
