"""Play a loaded control run's policy on fresh episodes.

A run directory becomes a ``LoadedRun`` in ``omnigym/runs.py`` (``load_run``): turning it back
into a policy needs its algorithm's config class and ``load_policy``, which the algorithm
registry finds by name, and the registry sits above this package (the trainers use
``evaluation/text.py``). What is here takes the loaded run and needs no registry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import ModuleType

import gymnasium as gym
import numpy as np

from omnigym.envs.atari import AtariOptions, is_atari
from omnigym.envs.cursor import ActionMasks
from omnigym.envs.pixels import PixelOptions
from omnigym.envs.vector import make_vec, trained_env
from omnigym.envs.video import every_episode
from omnigym.errors import OmnigymError
from omnigym.process import run_scope
from omnigym.track.checkpoint import CHECKPOINT_NAME


MAX_EPISODE_STEPS = 1_000_000
"""an episode this long means an env without a time limit: eval stops instead of hanging"""


@dataclass(frozen=True)
class LoadedRun:
    """A finished (or checkpointed) control run: its directory, its algorithm's module (which has
    ``load_policy``), its config and its last checkpoint, for
    ``module.load_policy(cfg, saved["components"], envs)``. Made by ``omnigym.runs.load_run``.

    ``load_policy`` returns ``policy(obs batch[, masks]) -> actions``. A policy with memory (ppo_lstm)
    also has ``reset(envs=None)``: the envs (a bool per env; None: all) whose next observation
    begins an episode, so it forgets them; ``play_episodes`` calls it after each autoreset step."""

    dir: str
    module: ModuleType
    cfg: object
    saved: dict

    @property
    def algorithm(self) -> str:
        return self.module.__name__.rpartition(".")[2]

    def policy(self, envs, greedy: bool):
        """``module.load_policy`` on the last checkpoint, for ``envs``. A checkpoint whose shapes
        or kinds of space do not fit the env's (a config.json edited to another env, or ``env=``
        another env) is one line, not a traceback from torch or from the networks' builders."""
        try:
            return self.module.load_policy(self.cfg, self.saved["components"], envs, greedy=greedy)
        except (RuntimeError, AttributeError, IndexError, TypeError) as exc:
            # torch's size mismatch; or a space of another kind than the networks are built for
            # (a DQN checkpoint on a Box of actions: "'Box' object has no attribute 'n'")
            # "Unexpected key(s)": another algorithm's checkpoint.pt copied in (iql's log_std in a td3_bc run)
            if isinstance(exc, RuntimeError) and not any(
                    said in str(exc) for said in ("size mismatch", "Missing key", "Unexpected key")):
                raise
            seen, actions = envs.single_observation_space, envs.single_action_space
            seen = f"observations of shape {seen.shape}" if seen.shape else f"{type(seen).__name__} observations"
            raise OmnigymError(f"the checkpoint in {self.dir} does not fit the env it is played on ({seen}, actions "
                               f"{actions if isinstance(actions, gym.spaces.Discrete) else actions.shape}): give "
                               f"the env it was trained on (config.json says env_id "
                               f"{getattr(self.cfg, 'env_id', '?')!r}); if it is, the checkpoint is not the one "
                               f"config.json describes (another run's {CHECKPOINT_NAME}, or an edited config.json)"
                               f"{built(exc)}") from None


def built(exc: Exception) -> str:
    """What building the policy raised, where it was not torch's size mismatch (which the line
    says already): a bug would otherwise hide behind the env's spaces."""
    return "" if isinstance(exc, RuntimeError) else f" [building its policy raised {type(exc).__name__}: {exc}]"


def run_env(run_dir: str, cfg, env, seed: int, verb: str, python_call: str, video_dir: str | None = None):
    """One env of the run's (or ``env``), made as training made it: its ``--env-kwargs``, Atari
    preprocessing and ``--pixels`` rendering, so observations and spaces are the ones the policy read."""
    env, env_kwargs = trained_env(run_dir, cfg, env, verb, python_call)
    # Atari plays on the run's own backend and preprocessing (video needs gymnasium's sync env); mjlab's
    # task ids exist only on mjlab.
    backend = cfg.backend if (is_atari(env) and video_dir is None) or cfg.backend == "mjlab" else "sync"
    return make_vec(env, 1, backend=backend, seed=seed, video_dir=video_dir, video_episodes=every_episode,
                    atari=AtariOptions.from_config(cfg), pixels=PixelOptions.from_config(cfg), **env_kwargs)


class RunPolicy:
    """A run's policy in Python, as ``omnigym eval`` plays it: ``policy(obs) -> action``.

    ``obs`` is what the run's env returns: one observation (``env.reset()``'s) or a batch of
    them (a vector env's; a goal env's Dict of batches); one observation gets one action, a batch a
    batch. It is the algorithm's own ``load_policy`` on the run's last checkpoint, with what
    training put between env and network (observation normalization, a goal env's flattening,
    PPO's clip into the action bounds); env wrappers (Atari's frame preprocessing) are not in it."""

    def __init__(self, run: LoadedRun, greedy: bool = True, env=None):
        self.module, self.cfg = run.module, run.cfg
        self.components = run.saved["components"]
        self.global_step = run.saved.get("counters", {}).get("global_step")
        self.algorithm = run.algorithm
        envs = run_env(run.dir, self.cfg, env, 0, "load_policy", "load it with load_policy(run_dir, env=...)")
        try:
            self.observation_space, self.action_space = envs.single_observation_space, envs.single_action_space
            self._policy = run.policy(envs, greedy)
        finally:
            envs.close()

    def reset(self) -> None:
        """A new episode begins: a policy with memory (ppo_lstm) forgets the last one; others have none."""
        if hasattr(self._policy, "reset"):
            self._policy.reset()

    def __call__(self, obs, *mask):
        single = self._is_single(obs)
        if single:  # one observation: a batch of one in, its one action out
            obs = {k: np.asarray(v)[None] for k, v in obs.items()} if isinstance(obs, dict) else np.asarray(obs)[None]
            mask = tuple(np.asarray(m)[None] for m in mask)
        actions = self._policy(obs, *mask)
        return actions[0] if single else actions

    def _is_single(self, obs) -> bool:
        space = self.observation_space
        if isinstance(space, gym.spaces.Dict) and isinstance(obs, dict):
            key = next(iter(space.spaces))
            return np.ndim(obs[key]) == len(space[key].shape)
        return np.ndim(obs) == len(getattr(space, "shape", None) or ())


def check_episodes(episodes: int, seed: int) -> None:
    """``--episodes`` and ``--seed`` of an evaluation, checked before a run is loaded."""
    if episodes <= 0:
        raise OmnigymError(f"--episodes must be positive, got {episodes}")
    if not 0 <= seed < 2**32:
        raise OmnigymError(f"--seed must be between 0 and 2**32 - 1, got {seed}")


def play_episodes(run: LoadedRun, episodes: int = 10, greedy: bool = False, seed: int = 12345, env=None,
                  video_dir: str | None = None, successes: list | None = None) -> list[float]:
    """Returns of ``episodes`` episodes of the run's env (or ``env``: the id, class, factory or
    env object to use instead, for a run trained on a Python object eval cannot rebuild).
    ``video_dir`` records every episode there as .mp4 (the returns are the same without it).
    ``successes``: a list that gets each episode's ``info["is_success"]`` at its end, where the
    env gives one (goal envs). ``omnigym.runs.evaluate_run`` is the same from a run directory."""
    check_episodes(episodes, seed)
    cfg = run.cfg
    envs = run_env(run.dir, cfg, env, seed, "eval", "evaluate it from Python with evaluate_run(run_dir, env=...)",
                   video_dir=video_dir)
    if video_dir is not None:
        os.makedirs(video_dir, exist_ok=True)  # the env could render: its videos have a place to go
    with run_scope(seed):  # sampled actions come from torch's generator: same seed, same returns
        policy = run.policy(envs, greedy)
        returns: list[float] = []
        obs, info = envs.reset(seed=seed)
        masks = ActionMasks.find(envs, info)  # the valid actions, where the env gives them
        forget = getattr(policy, "reset", None)  # a policy with memory (ppo_lstm): see load_policy's contract
        steps_since_episode, autoreset = 0, np.zeros(envs.num_envs, dtype=bool)
        while len(returns) < episodes:
            actions = policy(obs) if masks is None else policy(obs, masks(envs, info, steps_since_episode))
            obs, _, terminated, truncated, info = envs.step(actions)
            if forget is not None and autoreset.any():  # that step was an autoreset: obs begins an episode
                forget(autoreset)
            autoreset = terminated | truncated
            steps_since_episode += 1
            if "episode" in info and info["_episode"][0]:
                returns.append(float(info["episode"]["r"][0]))
                if successes is not None and "is_success" in info:
                    successes.append(float(info["is_success"][0]))
                steps_since_episode = 0
            elif steps_since_episode >= MAX_EPISODE_STEPS:
                raise OmnigymError(f"no episode ended in {MAX_EPISODE_STEPS} steps; give the env a time limit "
                                   "(gymnasium.register(..., max_episode_steps=N) or gymnasium.wrappers.TimeLimit)")
    envs.close()
    return returns
