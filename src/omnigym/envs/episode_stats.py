"""gymnasium's vector ``RecordEpisodeStatistics`` with a step that costs a few numpy calls.

Why: its step boolean-indexes five arrays and calls ``np.sum`` on every vector step, finished
episode or not: ~30 us a step, a fifth of a HalfCheetah step at one env and more than the
native CartPole step itself (bench/env_throughput.py). Here the common step (no env reset
on it, none ending) is two in-place adds; the rare ones do what gymnasium does. The
numbers are gymnasium's, bit for bit (tests/test_rollout_speed.py): an env reset on this
step gets a return and length of 0 without adding, the others add this step's reward and 1.
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode


class RecordEpisodeStatistics(gym.wrappers.vector.RecordEpisodeStatistics):
    def step(self, actions):
        observations, rewards, terminations, truncations, infos = self.env.step(actions)
        if self._autoreset_mode == AutoresetMode.SAME_STEP or not isinstance(infos, dict):
            return self._record(observations, rewards, terminations, truncations, infos)
        prev = self.prev_dones
        np.add(self.episode_returns, rewards, out=self.episode_returns)
        self.episode_lengths += 1
        if prev.any():  # NEXT_STEP: the envs that reset on this step start from 0
            self.episode_returns[prev] = 0
            self.episode_lengths[prev] = 0
            self.episode_start_times[prev] = time.perf_counter()
        self.prev_dones = dones = np.logical_or(terminations, truncations)
        if dones.any():
            self._finished(dones, infos)
        return observations, rewards, terminations, truncations, infos

    def _record(self, observations, rewards, terminations, truncations, infos):
        """gymnasium's own step, on the steps it was given (the env already stepped)."""
        inner, self.env = self.env, _Stepped(self.env, (observations, rewards, terminations, truncations, infos))
        try:
            return super().step(None)
        finally:
            self.env = inner

    def _finished(self, dones: np.ndarray, infos: dict) -> None:
        if self._stats_key in infos or f"_{self._stats_key}" in infos:
            raise ValueError(f"Attempted to add episode stats with key '{self._stats_key}' but this key already "
                             f"exists in info: {list(infos.keys())}")
        episode_time_length = np.round(time.perf_counter() - self.episode_start_times, 6)
        infos[self._stats_key] = {"r": np.where(dones, self.episode_returns, 0.0),
                                  "l": np.where(dones, self.episode_lengths, 0),
                                  "t": np.where(dones, episode_time_length, 0.0)}
        infos[f"_{self._stats_key}"] = dones
        self.episode_count += np.sum(dones)
        finished = np.flatnonzero(dones)
        self.time_queue.extend(episode_time_length[finished])
        self.return_queue.extend(self.episode_returns[finished])
        self.length_queue.extend(self.episode_lengths[finished])


class _Stepped:
    """An env whose next ``step`` returns what it was given: gymnasium's wrapper run on a step taken."""

    def __init__(self, env, result):
        self.env, self.result = env, result

    def step(self, actions):
        return self.result
