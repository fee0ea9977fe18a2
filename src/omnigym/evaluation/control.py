"""Evaluate a control run's last checkpoint on fresh episodes."""

from __future__ import annotations

import os

from omnigym.algos import check_foreign_settings, config_class, get_algorithm
from omnigym.config import config_from_dict, unknown_settings
from omnigym.envs.atari import AtariOptions, is_atari
from omnigym.envs.cursor import ActionMasks
from omnigym.envs.pixels import PixelOptions
from omnigym.envs.vector import make_vec, trained_env
from omnigym.envs.video import every_episode
from omnigym.errors import OmnigymError
from omnigym.process import run_scope
from omnigym.track.checkpoint import Checkpointer
from omnigym.track.files import CONFIG_NAME, load_config_dict


MAX_EPISODE_STEPS = 1_000_000
"""an episode this long means an env without a time limit: eval stops instead of hanging"""


def load_run(run_dir: str, command: str = "omnigym eval"):
    """A finished (or checkpointed) control run: its algorithm's module, its config and its last
    checkpoint, for ``module.load_policy(cfg, saved["components"], envs)``."""
    values = load_config_dict(run_dir)
    module = get_algorithm(values.get("algo", "?"))
    if not hasattr(module, "load_policy"):
        raise OmnigymError(f"{command} does not support {values['algo']} runs; their eval metrics are in metrics.jsonl")
    source = os.path.join(run_dir, CONFIG_NAME)
    check_foreign_settings(values["algo"], unknown_settings(config_class(module), values), source)
    cfg = config_from_dict(config_class(module), values, source)
    return module, cfg, Checkpointer(run_dir).load()


def evaluate_run(run_dir: str, episodes: int = 10, greedy: bool = False, seed: int = 12345, env=None,
                 video_dir: str | None = None, successes: list | None = None) -> list[float]:
    """Returns of ``episodes`` episodes of the run's env (or ``env``: the id, class, factory or
    env object to use instead, for a run trained on a Python object eval cannot rebuild).
    ``video_dir`` records every episode there as .mp4 (the returns are the same without it).
    ``successes``: a list that gets each episode's ``info["is_success"]`` at its end, where the
    env gives one (goal envs)."""
    if episodes <= 0:
        raise OmnigymError(f"--episodes must be positive, got {episodes}")
    if not 0 <= seed < 2**32:
        raise OmnigymError(f"--seed must be between 0 and 2**32 - 1, got {seed}")
    module, cfg, saved = load_run(run_dir)
    env, env_kwargs = trained_env(run_dir, cfg, env, "eval",
                                  "evaluate it from Python with evaluate_run(run_dir, env=...)")
    # Atari plays on the run's own backend and preprocessing (video needs gymnasium's sync env); mjlab's
    # task ids exist only on mjlab.
    backend = cfg.backend if (is_atari(env) and video_dir is None) or cfg.backend == "mjlab" else "sync"
    envs = make_vec(env, 1, backend=backend, seed=seed, video_dir=video_dir, video_episodes=every_episode,
                    atari=AtariOptions.from_config(cfg), pixels=PixelOptions.from_config(cfg), **env_kwargs)
    if video_dir is not None:
        os.makedirs(video_dir, exist_ok=True)  # the env could render: its videos have a place to go
    with run_scope(seed):  # sampled actions come from torch's generator: same seed, same returns
        policy = module.load_policy(cfg, saved["components"], envs, greedy=greedy)
        returns: list[float] = []
        obs, info = envs.reset(seed=seed)
        masks = ActionMasks.find(envs, info)  # the valid actions, where the env gives them
        steps_since_episode = 0
        while len(returns) < episodes:
            actions = policy(obs) if masks is None else policy(obs, masks(envs, info, steps_since_episode))
            obs, _, _, _, info = envs.step(actions)
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
