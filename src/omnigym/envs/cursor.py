"""A running vector env as a checkpoint sees it: the env, its current observation and
which of its envs reset on their next step.

The vector env autoresets on the step after an episode ends (NEXT_STEP mode): that step
returns the reset observation and reward 0 and is not a real transition, so ``step``
reports it as not ``valid`` and algorithms skip it. ``state_dict`` pickles the env itself
when its backend allows (gymnasium's sync envs, native vector envs), so a resumed run
continues mid-episode exactly; envs that cannot be pickled (subprocesses, emulators)
restart fresh episodes seeded by the step count.
"""

from __future__ import annotations

import pickle
from typing import Callable

import numpy as np

from omnigym.errors import OmnigymError


def check_finite_obs(obs, step: int):
    """NaN or inf in an observation would surface later as a NaN loss or a sampling error
    far from its cause; stop here and say where it came from."""
    if isinstance(obs, np.ndarray) and obs.dtype.kind == "f" and not np.isfinite(obs).all():
        bad = obs[~np.isfinite(obs)][0]
        raise OmnigymError(f"the env returned a non-finite observation ({bad}) at env step {step}; fix the env, "
                           "or wrap it (gymnasium.wrappers.TransformObservation) to replace such values")
    return obs


class EnvCursor:
    def __init__(self, envs, seed: int, prepare: Callable = lambda obs: obs):
        """``prepare`` turns a raw observation batch into what ``obs`` holds (e.g. normalized)."""
        self.envs, self.seed, self.prepare = envs, seed, prepare
        self.obs = prepare(check_finite_obs(envs.reset(seed=seed)[0], 0))
        self.autoreset = np.zeros(envs.num_envs, dtype=bool)
        self.steps = 0

    def step(self, actions):
        """One vector step. Returns ``(next_obs, rewards, terminated, truncated, info, valid)``
        with ``next_obs`` raw and ``valid`` False for the envs whose step was an autoreset."""
        next_obs, rewards, terminated, truncated, info = self.envs.step(actions)
        valid = ~self.autoreset
        self.steps += int(valid.sum())
        check_finite_obs(next_obs, self.steps)
        if not np.isfinite(rewards).all():
            raise OmnigymError(f"the env returned a non-finite reward ({rewards[~np.isfinite(rewards)][0]}) at env step "
                               f"{self.steps}; fix the env's reward, or clip it with a gymnasium wrapper")
        self.autoreset = terminated | truncated
        self.obs = self.prepare(next_obs)
        return next_obs, rewards, terminated, truncated, info, valid

    def state_dict(self) -> dict:
        try:
            snapshot = pickle.dumps(self.envs)
        except Exception:  # subprocess or emulator backends cannot be pickled
            snapshot = None
        return {"envs": snapshot, "obs": self.obs, "autoreset": self.autoreset, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = state["steps"]
        if state["envs"] is None:
            self.obs = self.prepare(self.envs.reset(seed=self.seed + self.steps)[0])
            self.autoreset = np.zeros(self.envs.num_envs, dtype=bool)
            return
        self.envs.close()
        self.envs = pickle.loads(state["envs"])
        self.obs, self.autoreset = state["obs"], state["autoreset"]

    def close(self) -> None:
        self.envs.close()
