"""Small stand-ins for the four packages CORL's single-file offline algorithms import (``d4rl``,
``gym``, ``pyrallis``, ``wandb``), so that bench/offline_corl.py runs CORL's own ``train`` on a
local Minari dataset, with nothing downloaded and none of them installed.

What CORL's ``iql.py`` and ``td3_bc.py`` call of them, and what stands in:

- ``gym.make(config.env)``: ``config.env`` is the Minari dataset's id; the env is the one the
  dataset names, made by gymnasium and wrapped to gym's old API (``seed(s)`` seeds the next
  ``reset()``, which returns the observation only; ``step`` returns ``(obs, reward, done, info)``,
  ``done`` = terminated or truncated), with D4RL's ``get_normalized_score(return)`` (a fraction)
  from the dataset's reference returns. ``gym.Env`` is only a type in annotations.
- ``gym.wrappers.TransformObservation(env, f)`` and ``TransformReward(env, f)`` (``wrap_env``): old-API
  wrappers that pass every other attribute through (``get_normalized_score`` among them).
- ``d4rl.qlearning_dataset(env)``: D4RL's dict of ``observations``, ``actions``,
  ``next_observations``, ``rewards``, ``terminals`` (float32 arrays; terminals bool), plus
  ``timeouts``, from every transition of the dataset's episodes. Unlike D4RL's (whose datasets
  stored no final observation) no transition is dropped: Minari keeps each episode's last
  observation, so a truncated episode's last step is there with its true next observation.
- ``pyrallis.wrap()`` (a decorator: identity here, the bench builds ``TrainConfig`` itself) and
  ``pyrallis.dump`` (unused without ``checkpoints_path``).
- ``wandb.init``, ``wandb.run.save``, ``wandb.log``: no-ops, but ``log`` keeps the time of each
  call: ``Timing`` tells the gradient steps' wall clock apart from the evaluations'.
"""

from __future__ import annotations

import sys
import time
import types

import gymnasium
import numpy as np

from omnigym.offline.datasets import dataset_env_id, open_dataset


class OldApiEnv:
    """A gymnasium env as gym < 0.26 played it (what CORL's ``eval_actor`` expects)."""

    def __init__(self, dataset_name: str):
        self.dataset = open_dataset(dataset_name)
        self.env = gymnasium.make(dataset_env_id(self.dataset))
        self.observation_space, self.action_space = self.env.observation_space, self.env.action_space
        metadata = self.dataset.storage.metadata
        self.ref_min_score, self.ref_max_score = metadata.get("ref_min_score"), metadata.get("ref_max_score")
        self.next_seed = None

    def seed(self, seed: int) -> None:
        self.next_seed = seed

    def reset(self):
        obs, _ = self.env.reset(seed=self.next_seed)
        self.next_seed = None  # later resets continue the seeded stream, as gym's env.seed did
        return obs

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, float(reward), bool(terminated or truncated), info

    def get_normalized_score(self, episode_return: float) -> float:
        if self.ref_max_score is None:
            raise ValueError("the dataset has no reference returns (omnigym collect --expert or --ref-max-score)")
        return (episode_return - self.ref_min_score) / (self.ref_max_score - self.ref_min_score)


class Wrapper:
    """gym's old ``Wrapper``: every attribute not set here is the wrapped env's."""

    def __init__(self, env, function):
        self.env, self.function = env, function

    def __getattr__(self, name):
        return getattr(self.env, name)


class TransformObservation(Wrapper):
    def reset(self):
        return self.function(self.env.reset())

    def step(self, action):
        obs, reward, done, info = self.env.step(action)
        return self.function(obs), reward, done, info


class TransformReward(Wrapper):
    def reset(self):
        return self.env.reset()

    def step(self, action):
        obs, reward, done, info = self.env.step(action)
        return obs, self.function(reward), done, info


def qlearning_dataset(env) -> dict[str, np.ndarray]:
    """D4RL's transition dict of the env's dataset (see the module's docstring)."""
    parts: dict[str, list] = {k: [] for k in ("observations", "actions", "next_observations", "rewards", "terminals",
                                              "timeouts")}
    for episode in env.dataset.iterate_episodes():
        parts["observations"].append(episode.observations[:-1])
        parts["next_observations"].append(episode.observations[1:])
        parts["actions"].append(episode.actions)
        parts["rewards"].append(episode.rewards)
        parts["terminals"].append(episode.terminations)
        parts["timeouts"].append(episode.truncations)
    floats = {k: np.concatenate(parts[k]).astype(np.float32) for k in ("observations", "actions",
                                                                       "next_observations", "rewards")}
    return {**floats, "terminals": np.concatenate(parts["terminals"]).astype(bool),
            "timeouts": np.concatenate(parts["timeouts"]).astype(bool)}


class Timing:
    """When each ``wandb.log`` came: CORL logs every gradient step (``step=total_it``) and, after an
    evaluation, ``d4rl_normalized_score``; the time between the end of the ``WARM_UP``-th and the
    last gradient step's log is training only (the first steps build what a library builds once:
    allocator pools, and with ``--compile`` omnigym's compiled graphs, timed apart as ``started``
    to that step)."""

    WARM_UP = 10

    def __init__(self):
        self.started = self.first = self.last = None  # (wall clock, this process's CPU time)
        self.first_step = self.last_step = 0
        self.scores: list[float] = []

    def start(self) -> None:
        """Called before the first gradient step (omnigym's side: CORL's has no hook there)."""
        if self.started is None:
            self.started = (time.perf_counter(), time.process_time())

    def warm_up_seconds(self) -> float | None:
        """Wall-clock seconds from ``start`` to the end of the ``WARM_UP``-th step, if started."""
        return None if self.started is None or self.first is None else self.first[0] - self.started[0]

    def log(self, values: dict, step: int | None = None) -> None:
        now = (time.perf_counter(), time.process_time())
        if "d4rl_normalized_score" in values:
            self.scores.append(float(values["d4rl_normalized_score"]))
            return
        if step is not None and step < self.WARM_UP:
            return
        if self.first is None:
            self.first, self.first_step = now, step
        self.last, self.last_step = now, step

    def seconds_per(self, steps: int, cpu: bool = False) -> float:
        """Wall-clock seconds per ``steps`` gradient steps; ``cpu``: this process's CPU seconds
        (one thread: what the steps cost, less what other jobs on the machine took from them)."""
        clock = 1 if cpu else 0
        return (self.last[clock] - self.first[clock]) / max(self.last_step - self.first_step, 1) * steps


def install(timing: Timing | None = None) -> Timing:
    """Put the stand-ins into ``sys.modules`` (before CORL's file is imported); returns the timing."""
    timing = timing or Timing()
    gym = types.ModuleType("gym")
    gym.Env = OldApiEnv
    gym.make = OldApiEnv
    gym.wrappers = types.ModuleType("gym.wrappers")
    gym.wrappers.TransformObservation, gym.wrappers.TransformReward = TransformObservation, TransformReward
    d4rl = types.ModuleType("d4rl")
    d4rl.qlearning_dataset = qlearning_dataset
    pyrallis = types.ModuleType("pyrallis")
    pyrallis.wrap = lambda *args, **kwargs: (lambda function: function)
    pyrallis.dump = lambda config, stream: None
    wandb = types.ModuleType("wandb")
    wandb.init = lambda *args, **kwargs: None
    wandb.run = types.SimpleNamespace(save=lambda *args, **kwargs: None)
    wandb.log = timing.log
    sys.modules.update({"gym": gym, "gym.wrappers": gym.wrappers, "d4rl": d4rl, "pyrallis": pyrallis, "wandb": wandb})
    return timing
