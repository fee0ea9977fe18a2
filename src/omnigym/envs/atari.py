"""Atari through ale-py, with the DQN and PPO papers' preprocessing on every backend.

The preprocessing (Mnih et al., 2015; Machado et al., 2018), each part a flag:

=================  =========  ==============================================================
flag               default    what it does
=================  =========  ==============================================================
--noop-max         30         up to this many no-op actions after a reset (random starts)
--frame-skip       4          repeat each action this many frames; the max of the last two
                              frames is the observation (flicker removal)
--episodic-life    True       a lost life ends the episode *for learning*: no bootstrap
                              past it; the game goes on and returns count whole games
--fire-reset       True       press FIRE after a reset in games that need it to start
--clip-rewards     True       learn from the reward's sign; returns report the game score
--frame-stack      4          the observation is the last 4 frames, 84 x 84 grayscale
--sticky-actions   (the id's) the env repeats the previous action with this probability
                              (0.25 for ALE/*-v5 ids, 0 for *NoFrameskip-v4)
=================  =========  ==============================================================

Frames are always 84 x 84 grayscale: the Nature CNN's input.

Backends: ``ale`` (ale-py's own C++ vector env: threads, no Python per env), ``envpool``
(when installed), and gymnasium's ``async`` / ``sync`` vector envs over ``AtariEnv`` with
gymnasium's ``AtariPreprocessing`` and ``FrameStackObservation``. ``auto`` takes ``ale``.
Episodic life and reward clipping are the same code on every backend: they change what
the algorithm learns from (``envs/cursor.py``'s ``LearningSignal``), never the episode
statistics, so a return is a whole game's score everywhere.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from omnigym.errors import OmnigymError, missing_extra

BACKENDS = ("ale", "envpool", "async", "sync")


@dataclass(frozen=True)
class AtariOptions:
    noop_max: int = 30
    frame_skip: int = 4
    episodic_life: bool = True
    fire_reset: bool = True
    clip_rewards: bool = True
    frame_stack: int = 4
    sticky_actions: float | None = None

    FLAGS = ("noop_max", "frame_skip", "episodic_life", "fire_reset", "clip_rewards", "frame_stack", "sticky_actions")

    @classmethod
    def from_config(cls, cfg) -> "AtariOptions":
        return cls(**{name: getattr(cfg, name) for name in cls.FLAGS})


def is_atari(env_id) -> bool:
    if not isinstance(env_id, str):
        return False
    if env_id.startswith("ALE/"):
        return True
    if env_id not in gym.registry and importlib.util.find_spec("ale_py") is not None:
        require_ale()  # ids such as PongNoFrameskip-v4 are registered when ale_py is imported
    return _is_ale_spec(env_id)


def _is_ale_spec(env_id: str) -> bool:
    spec = gym.registry.get(env_id)
    return spec is not None and str(spec.entry_point).startswith("ale_py")


def require_ale() -> None:
    if importlib.util.find_spec("ale_py") is None:
        raise missing_extra("ale-py", "atari")
    import ale_py

    gym.register_envs(ale_py)


def make_atari_vec(env_id: str, num_envs: int, backend: str, seed: int | None, options: AtariOptions,
                   video=None) -> gym.vector.VectorEnv:
    """``num_envs`` preprocessed copies of the Atari game ``env_id`` on ``backend`` (``video``:
    an ``envs.video.Recording`` that renders and records env 0, on sync or async)."""
    require_ale()
    spec = gym.spec(env_id)
    game = spec.kwargs["game"]
    sticky = spec.kwargs.get("repeat_action_probability", 0.0) if options.sticky_actions is None \
        else options.sticky_actions
    if backend in ("auto", "native"):  # ale-py's vector env is what gymnasium's "native" builds for ALE ids
        backend = "ale"
    if backend == "ale":
        from ale_py.vector_env import AtariVectorEnv

        return AtariVectorEnv(game, num_envs, frameskip=options.frame_skip, stack_num=options.frame_stack,
                              noop_max=options.noop_max, use_fire_reset=options.fire_reset,
                              repeat_action_probability=sticky, episodic_life=False, reward_clipping=False,
                              img_height=84, img_width=84, grayscale=True, maxpool=True,
                              max_num_frames_per_episode=spec.kwargs.get("max_num_frames_per_episode", 108_000),
                              autoreset_mode=AutoresetMode.NEXT_STEP)
    if backend == "envpool":
        return _make_envpool(game, num_envs, seed, options, sticky)
    if backend not in ("sync", "async"):
        raise OmnigymError(f"--backend {backend} does not run Atari; choose one of auto, {', '.join(BACKENDS)}")

    def make(**kwargs):
        env = gym.make(env_id, frameskip=1, repeat_action_probability=sticky,
                       max_num_frames_per_episode=spec.kwargs.get("max_num_frames_per_episode", 108_000), **kwargs)
        env = gym.wrappers.AtariPreprocessing(env, noop_max=options.noop_max, frame_skip=options.frame_skip,
                                              screen_size=84, terminal_on_life_loss=False, grayscale_obs=True)
        if options.fire_reset and "FIRE" in env.unwrapped.get_action_meanings():
            env = FireReset(env)
        # black frames before the first, as the ale backend (and SB3's VecFrameStack) stack them,
        # so that every backend gives the same observations (tests/test_references.py)
        return gym.wrappers.FrameStackObservation(env, options.frame_stack, padding_type="zero")

    vector_cls = gym.vector.AsyncVectorEnv if backend == "async" else gym.vector.SyncVectorEnv
    fns = video.env_fns(make, num_envs, {}) if video is not None else [make] * num_envs
    return vector_cls(fns, autoreset_mode=AutoresetMode.NEXT_STEP)


class FireReset(gym.Wrapper):
    """Press FIRE once after each reset (games such as Breakout wait for it to start)."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        fire = self.env.unwrapped.get_action_meanings().index("FIRE")
        obs, _, terminated, truncated, info = self.env.step(fire)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


def _make_envpool(game: str, num_envs: int, seed: int | None, options: AtariOptions, sticky: float):
    if importlib.util.find_spec("envpool") is None:
        raise missing_extra("envpool", "envpool")
    import envpool

    from omnigym.envs.envpool import EnvPoolVectorEnv

    task = "".join(part.capitalize() for part in game.split("_")) + "-v5"
    pool = envpool.make_gymnasium(task, num_envs=num_envs, seed=seed or 0, episodic_life=False, reward_clip=False,
                                  stack_num=options.frame_stack, frame_skip=options.frame_skip,
                                  noop_max=options.noop_max, repeat_action_probability=sticky,
                                  use_fire_reset=options.fire_reset, img_height=84, img_width=84, gray_scale=True)
    return EnvPoolVectorEnv(pool)


def check_options(options: AtariOptions) -> None:
    if options.frame_skip <= 0 or options.frame_stack <= 0 or options.noop_max < 0:
        raise OmnigymError(f"--frame-skip and --frame-stack must be positive and --noop-max 0 or more, got "
                           f"{options.frame_skip}, {options.frame_stack}, {options.noop_max}")
    if options.sticky_actions is not None and not 0 <= options.sticky_actions <= 1:
        raise OmnigymError(f"--sticky-actions must be between 0 and 1, got {options.sticky_actions}")


def lives(info: dict, num_envs: int) -> np.ndarray:
    """Lives left per env, from the ``lives`` every Atari backend puts in ``info``."""
    if "lives" not in info:
        raise OmnigymError("--episodic-life needs the env to report info['lives'] (ale-py's envs do); "
                           "give --no-episodic-life for this env")
    return np.asarray(info["lives"]).reshape(num_envs)
