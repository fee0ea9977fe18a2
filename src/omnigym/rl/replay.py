"""Replay memory for off-policy algorithms (DQN, SAC, TD3) that stores each frame once.

A transition's next observation is, most of the time, the following transition's
observation; and with stacked frames (Atari's 4 x 84 x 84) an observation shares all but
its newest frame with the one before. Storing ``obs`` and ``next_obs`` whole would keep
each 84 x 84 frame eight times; here it is kept once:

- Each env has its own ring of *frames* (a frame is one slice of the stack, or the whole
  observation when ``frame_stack`` is 1) and its own ring of transitions. A transition
  holds the absolute index of its observation's newest frame and of its next
  observation's newest frame; an observation is the ``frame_stack`` frames ending there.
- ``add`` pushes one frame per env step: the newest slice of ``next_obs``. Only when an
  observation does not continue the env's previous ``next_obs`` (the first step of an
  episode) are its frames pushed whole. Both are decided by comparing arrays, so what
  ``sample`` rebuilds is bit for bit what was added, whatever the env.
- When the frame ring wraps, transitions whose frames were overwritten leave the memory
  with the oldest ones (the frame ring has room for a quarter more frames than
  transitions, so with episodes of more than a few steps this never comes first).

Only ``terminated`` is stored: a truncated transition still bootstraps from its next
observation, which is the episode's true final observation.
"""

from __future__ import annotations

import math

import numpy as np
import torch


class ReplayBuffer:
    def __init__(self, capacity: int, obs_shape: tuple, action_shape: tuple, obs_dtype=np.float32,
                 action_dtype=np.int64, num_envs: int = 1, frame_stack: int = 1):
        """``frame_stack`` > 1: observations are stacks along their first axis (Atari's
        ``frame_stack`` frames), and each frame is stored once."""
        obs_shape = tuple(obs_shape)
        if frame_stack > 1 and (not obs_shape or obs_shape[0] != frame_stack):
            raise ValueError(f"frame_stack {frame_stack} needs observations stacked on their first axis, got {obs_shape}")
        self.capacity, self.num_envs, self.stack, self.obs_shape = capacity, num_envs, frame_stack, obs_shape
        frame_shape = obs_shape[1:] if frame_stack > 1 else obs_shape
        self.env_capacity = math.ceil(capacity / num_envs)
        self.frame_capacity = self.env_capacity + self.env_capacity // 4 + 2 * frame_stack + 2
        self.frames = np.zeros((num_envs, self.frame_capacity, *frame_shape), dtype=obs_dtype)
        self.frames_pushed = np.zeros(num_envs, dtype=np.int64)
        self.obs_frame = np.zeros((num_envs, self.env_capacity), dtype=np.int64)   # absolute frame indices
        self.next_frame = np.zeros((num_envs, self.env_capacity), dtype=np.int64)
        self.actions = np.zeros((num_envs, self.env_capacity, *action_shape), dtype=action_dtype)
        self.rewards = np.zeros((num_envs, self.env_capacity), dtype=np.float32)
        self.terminated = np.zeros((num_envs, self.env_capacity), dtype=np.float32)
        self.added = np.zeros(num_envs, dtype=np.int64)   # transitions ever added, per env
        self.oldest = np.zeros(num_envs, dtype=np.int64)  # absolute index of the oldest live one
        self.last_next_obs = np.zeros((num_envs, *obs_shape), dtype=obs_dtype)
        self.has_last = np.zeros(num_envs, dtype=bool)

    def __len__(self) -> int:
        return int((self.added - self.oldest).sum())

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.frames, self.obs_frame, self.next_frame, self.actions, self.rewards,
                                      self.terminated, self.last_next_obs))

    def _push(self, envs: np.ndarray, frames: np.ndarray) -> None:
        """Push ``frames[i]`` (one frame, or ``[k, *frame]``) onto the ring of env ``envs[i]``."""
        slots = self.frames_pushed[envs] % self.frame_capacity
        self.frames[envs, slots] = frames
        self.frames_pushed[envs] += 1

    def add(self, obs, actions, rewards, next_obs, terminated, valid=None) -> None:
        """Add one vector step (row ``i`` from env ``i``); ``valid`` masks out autoreset steps."""
        envs = np.arange(len(rewards)) if valid is None else np.flatnonzero(valid)
        if len(envs) == 0:
            return
        obs, next_obs = np.asarray(obs)[envs], np.asarray(next_obs)[envs]
        axes = tuple(range(1, obs.ndim))
        continues = self.has_last[envs] & np.all(obs == self.last_next_obs[envs], axis=axes)
        for i in np.flatnonzero(~continues):  # an episode's first step: its observation's frames, whole
            for frame in (obs[i] if self.stack > 1 else obs[i][None]):
                self._push(envs[i:i + 1], frame[None])
        obs_frame = self.frames_pushed[envs] - 1
        if self.stack > 1:
            shifted = np.all(next_obs[:, :-1] == obs[:, 1:], axis=axes)
            for i in np.flatnonzero(~shifted):  # not a frame stack after all: all of next_obs
                for frame in next_obs[i, :-1]:
                    self._push(envs[i:i + 1], frame[None])
            self._push(envs, next_obs[:, -1])
        else:
            self._push(envs, next_obs)
        rows = self.added[envs] % self.env_capacity
        self.obs_frame[envs, rows], self.next_frame[envs, rows] = obs_frame, self.frames_pushed[envs] - 1
        self.actions[envs, rows] = np.asarray(actions)[envs]
        self.rewards[envs, rows] = np.asarray(rewards)[envs]
        self.terminated[envs, rows] = np.asarray(terminated)[envs]
        self.added[envs] += 1
        self.last_next_obs[envs], self.has_last[envs] = next_obs, True
        self._evict(envs)

    def _evict(self, envs: np.ndarray) -> None:
        """Drop transitions past the transition ring's size or whose oldest frame was overwritten."""
        self.oldest[envs] = np.maximum(self.oldest[envs], self.added[envs] - self.env_capacity)
        live = self.oldest[envs] < self.added[envs]
        oldest_frame = self.obs_frame[envs, self.oldest[envs] % self.env_capacity] - (self.stack - 1)
        for env in envs[live & (oldest_frame < self.frames_pushed[envs] - self.frame_capacity)]:
            first_kept_frame = self.frames_pushed[env] - self.frame_capacity
            while self.oldest[env] < self.added[env] and \
                    self.obs_frame[env, self.oldest[env] % self.env_capacity] - (self.stack - 1) < first_kept_frame:
                self.oldest[env] += 1

    def _observations(self, envs: np.ndarray, newest: np.ndarray) -> np.ndarray:
        offsets = np.arange(-(self.stack - 1), 1)
        slots = (newest[:, None] + offsets) % self.frame_capacity
        return self.frames[envs[:, None], slots].reshape(len(envs), *self.obs_shape)

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """Transitions drawn uniformly from all live ones."""
        sizes = self.added - self.oldest
        ends = np.cumsum(sizes)
        draw = rng.integers(0, ends[-1], size=batch_size)
        envs = np.searchsorted(ends, draw, side="right")
        rows = (self.oldest[envs] + draw - (ends[envs] - sizes[envs])) % self.env_capacity
        return {
            "obs": torch.from_numpy(self._observations(envs, self.obs_frame[envs, rows])),
            "actions": torch.from_numpy(self.actions[envs, rows]),
            "rewards": torch.from_numpy(self.rewards[envs, rows]),
            "next_obs": torch.from_numpy(self._observations(envs, self.next_frame[envs, rows])),
            "terminated": torch.from_numpy(self.terminated[envs, rows]),
        }

    STATE = ("frames", "frames_pushed", "obs_frame", "next_frame", "actions", "rewards", "terminated", "added",
             "oldest", "last_next_obs", "has_last")

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.STATE}

    def load_state_dict(self, state: dict) -> None:
        for k in self.STATE:
            setattr(self, k, state[k])


class Replay:
    """The replay buffer and the run's own random stream (exploration, replay indices), as a
    checkpoint sees them: the buffer only with ``--save-buffer``. ``restored`` says whether a
    resumed run got its buffer back; without it, the run refills it before learning again."""

    def __init__(self, buffer: ReplayBuffer, seed: int, save_buffer: bool):
        self.buffer, self.rng, self.save_buffer = buffer, np.random.default_rng(seed), save_buffer
        self.restored = False

    def learning_starts(self, learning_starts: int, global_step: int) -> int:
        """The step after which updates (re)start: ``learning_starts`` more steps after a resume
        that did not get its buffer back."""
        return learning_starts if global_step == 0 or self.restored else global_step + learning_starts

    def state_dict(self) -> dict:
        return {"rng": self.rng.bit_generator.state, "buffer": self.buffer.state_dict() if self.save_buffer else None}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        if state["buffer"] is not None:
            self.buffer.load_state_dict(state["buffer"])
            self.restored = True
