"""A running vector env as a checkpoint sees it: the env, its current observation and
which of its envs reset on their next step.

The vector env autoresets on the step after an episode ends (NEXT_STEP mode): that step
returns the reset observation and reward 0 and is not a real transition, so ``step``
reports it as not ``valid`` and algorithms skip it. ``state_dict`` pickles the env itself
when its backend allows (gymnasium's sync envs, native vector envs), so a resumed run
continues mid-episode exactly; envs that cannot be pickled (subprocesses, emulators)
restart fresh episodes seeded by the step count.

A ``LearningSignal`` changes what the algorithm learns from, never the episode statistics
(which the vector env records inside): Atari's reward clipping, and its episodic life,
where a lost life is reported as ``terminated`` (no bootstrap past it) while the game goes
on and is not reset.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Callable

import numpy as np

from omnigym.errors import OmnigymError


def check_finite_obs(obs, step: int):
    """NaN or inf in an observation would surface later as a NaN loss or a sampling error
    far from its cause; stop here and say where it came from. Dict observations (goal envs):
    each of their arrays."""
    if isinstance(obs, dict):
        for value in obs.values():
            check_finite_obs(value, step)
        return obs
    if isinstance(obs, np.ndarray) and obs.dtype.kind == "f" and not np.isfinite(obs).all():
        bad = obs[~np.isfinite(obs)][0]
        raise OmnigymError(f"the env returned a non-finite observation ({bad}) at env step {step}; fix the env, "
                           "or wrap it (gymnasium.wrappers.TransformObservation) to replace such values")
    return obs


def check_finite_rewards(rewards: np.ndarray, step: int) -> None:
    """A NaN or infinite reward would be a NaN loss later, blamed on the learning rate."""
    if not np.isfinite(rewards).all():
        raise OmnigymError(f"the env returned a non-finite reward ({rewards[~np.isfinite(rewards)][0]}) at env step "
                           f"{step}; fix the env's reward, or clip it with a gymnasium wrapper")


@dataclass(frozen=True)
class LearningSignal:
    clip_rewards: bool = False
    """learn from the sign of each reward"""
    life_loss_ends: bool = False
    """a lost life (``info["lives"]`` went down) is a termination for learning"""


class EnvCursor:
    def __init__(self, envs, seed: int, prepare: Callable = lambda obs: obs, signal: LearningSignal = LearningSignal()):
        """``prepare`` turns a raw observation batch into what ``obs`` holds (e.g. normalized)."""
        self.envs, self.seed, self.prepare, self.signal = envs, seed, prepare, signal
        obs, info = envs.reset(seed=seed)
        self.obs, self.info = prepare(check_finite_obs(obs, 0)), info
        self.autoreset = np.zeros(envs.num_envs, dtype=bool)
        self.lives = self._lives(info)
        self.steps = 0

    def _lives(self, info: dict):
        if not self.signal.life_loss_ends:
            return None
        from omnigym.envs.atari import lives

        return lives(info, self.envs.num_envs)

    def step(self, actions):
        """One vector step. Returns ``(next_obs, rewards, terminated, truncated, info, valid)``
        with ``next_obs`` raw and ``valid`` False for the envs whose step was an autoreset."""
        next_obs, rewards, terminated, truncated, info = self.envs.step(actions)
        valid = ~self.autoreset
        self.steps += int(np.count_nonzero(valid))  # faster than valid.sum() on a bool array
        check_finite_obs(next_obs, self.steps)
        check_finite_rewards(rewards, self.steps)
        self.autoreset = terminated | truncated
        self.obs, self.info = self.prepare(next_obs), info
        if self.signal.life_loss_ends:
            lives = self._lives(info)
            terminated = terminated | (valid & (lives < self.lives))
            self.lives = lives
        if self.signal.clip_rewards:
            rewards = np.sign(rewards)
        return next_obs, rewards, terminated, truncated, info, valid

    def state_dict(self) -> dict:
        try:
            snapshot = pickle.dumps(self.envs)
        except Exception:  # subprocess or emulator backends cannot be pickled
            snapshot = None
        return {"envs": snapshot, "obs": self.obs, "autoreset": self.autoreset, "steps": self.steps,
                "lives": self.lives, "info": self.info, "physics": _physics_state(self.envs)}

    def load_state_dict(self, state: dict) -> None:
        self.steps = state["steps"]
        if state["envs"] is None:
            obs, info = self.envs.reset(seed=self.seed + self.steps)
            self.obs, self.info, self.lives = self.prepare(obs), info, self._lives(info)
            self.autoreset = np.zeros(self.envs.num_envs, dtype=bool)
            return
        self.envs.close()
        self.envs = pickle.loads(state["envs"])
        _set_physics_state(self.envs, state.get("physics"))
        self.obs, self.autoreset, self.lives = state["obs"], state["autoreset"], state.get("lives")
        self.info = state.get("info", {})

    def close(self) -> None:
        self.envs.close()


def _mujoco_envs(envs) -> list:
    """The MuJoCo envs inside a sync vector env (gymnasium's MuJoCo envs pickle as their
    constructor's arguments: a fresh simulation with a fresh random generator)."""
    import gymnasium as gym

    sync = envs.unwrapped
    if not isinstance(sync, gym.vector.SyncVectorEnv):
        return []
    return [env.unwrapped for env in sync.envs if hasattr(env.unwrapped, "data") and hasattr(env.unwrapped, "model")]


def _physics_state(envs) -> list | None:
    """Each MuJoCo env's simulation (``MjData``, which pickles whole) and random generator, and
    a goal env's goal (gymnasium-robotics' ``goal``, not among its constructor's arguments)."""
    found = _mujoco_envs(envs)
    return [(pickle.dumps(env.data), env.np_random.bit_generator.state, getattr(env, "goal", None))
            for env in found] or None


def _set_physics_state(envs, saved: list | None) -> None:
    if not saved:
        return
    import mujoco

    for env, (data, generator, *goal) in zip(_mujoco_envs(envs), saved):
        mujoco.mj_copyData(env.data, env.model, pickle.loads(data))
        env.np_random.bit_generator.state = generator
        if goal and goal[0] is not None:
            env.goal = goal[0]


class ActionMasks:
    """Which actions are valid in each env's current observation, for masked PPO: from
    ``info["action_mask"]`` (put it in ``reset``'s info too) or from the env's
    ``action_masks()`` method (sb3-contrib's name; sync backend only). ``ActionMasks.find``
    returns None for an env that gives neither."""

    def __init__(self, source: str, n_actions: int):
        self.source, self.n_actions = source, n_actions

    @classmethod
    def find(cls, envs, info: dict) -> "ActionMasks | None":
        import gymnasium as gym

        if not isinstance(envs.single_action_space, gym.spaces.Discrete):
            if "action_mask" in info:
                raise OmnigymError(f"the env gives an action_mask, but masks apply to Discrete actions, not "
                                   f"{envs.single_action_space}")
            return None
        n = int(envs.single_action_space.n)
        if "action_mask" in info:
            return cls("info", n)
        # The method is looked for, not called, and only in a sync vector env's own envs: a
        # failing call in an async env's workers would shut them down.
        sync = envs.unwrapped
        if not isinstance(sync, gym.vector.SyncVectorEnv):
            return None
        try:
            found = all(callable(env.get_wrapper_attr("action_masks")) for env in sync.envs)
        except AttributeError:
            return None
        return cls("method", n) if found else None

    def __call__(self, envs, info: dict, step: int) -> np.ndarray:
        if self.source == "info":
            if "action_mask" not in info:
                raise OmnigymError(f"the env stopped giving info['action_mask'] at env step {step}; give it in the info "
                                   "of reset() and of every step()")
            raw = info["action_mask"]
        else:
            raw = np.stack(envs.unwrapped.call("action_masks"))
        raw = np.asarray(raw)
        if raw.dtype == object:  # a list per env: the vector env's info holds them as objects
            try:
                raw = np.stack([np.asarray(each) for each in raw])
            except ValueError:
                pass  # lists of different lengths: the shape check below names it
        if raw.dtype != object and not np.isin(raw, (0, 1)).all():  # 0.5 and nan were read as allowed
            odd = raw[~np.isin(raw, (0, 1))].flat[0].item()
            raise OmnigymError(f"the env's action mask holds {odd!r}; it must be booleans (or 0 and 1): True where an "
                               "action is allowed")
        masks = raw.astype(bool)
        if masks.shape != (envs.num_envs, self.n_actions):
            raise OmnigymError(f"the env's action mask has shape {masks.shape[1:]}; it must have one entry per action "
                               f"({self.n_actions})")
        stuck = ~masks.any(-1)
        if stuck.any():
            raise OmnigymError(f"the env's action mask allows no action at env step {step} (env {int(stuck.argmax())}); "
                               "every observation needs at least one valid action")
        return masks
