"""Running mean and variance (Chan et al.'s parallel update), for observation normalization and
reward scaling."""

from __future__ import annotations

import math

import numpy as np


class RunningMeanStd:
    def __init__(self, shape: tuple = (), epsilon: float = 1e-4):
        self.mean = np.zeros(shape, dtype=np.float64)
        self.var = np.ones(shape, dtype=np.float64)
        self.count = epsilon

    def update(self, batch: np.ndarray) -> None:
        if batch.shape[0] == 1:  # one env: the same numbers without mean/var's overhead (~70 us a step)
            self._update_one(batch[0])
            return
        self.combine(*mean_var(batch), batch.shape[0])

    def combine(self, batch_mean, batch_var, batch_count) -> None:
        """Fold in the statistics of other observations (a batch, or another process's)."""
        delta = batch_mean - self.mean
        total = self.count + batch_count
        self.mean = self.mean + delta * batch_count / total
        m2 = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.var = m2 / total
        self.count = total

    def _update_one(self, row: np.ndarray) -> None:
        # The batch update above with batch_var = 0 and batch_count = 1, term by term.
        delta = row - self.mean
        total = self.count + 1
        self.mean = self.mean + delta / total
        self.var = (self.var * self.count + delta**2 * self.count / total) / total
        self.count = total

    def normalize(self, x: np.ndarray, clip: float = 10.0) -> np.ndarray:
        out = (x - self.mean) / np.sqrt(self.var + 1e-8)
        # np.clip's numbers through two ufuncs, without its Python wrapper (~10 us a call)
        np.maximum(out, -clip, out=out)
        return np.minimum(out, clip, out=out).astype(np.float32)

    def state_dict(self) -> dict:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = state["mean"], state["var"], state["count"]


def mean_var(batch: np.ndarray):
    """``(batch.mean(0), batch.var(0))``, bit for bit: numpy's own steps (numpy/_core/_methods.py)
    without the Python around them, which costs more than the sums on a rollout's few rows."""
    if batch.dtype not in (np.float32, np.float64):
        return batch.mean(0), batch.var(0)
    count = np.intp(batch.shape[0])
    total = np.add.reduce(batch, 0, keepdims=True)
    mean = np.true_divide(total, count, out=total, casting="unsafe")
    x = np.subtract(batch, mean)
    np.square(x, out=x)
    squares = np.add.reduce(x, 0)
    if batch.ndim == 1:  # numpy scalars, as numpy's own scalar branch makes them
        return mean[0], squares.dtype.type(squares / count)
    return mean[0], np.true_divide(squares, count, out=squares, casting="unsafe")


class RewardScaler:
    """Rewards divided by the running standard deviation of the discounted return, then clipped:
    what gymnasium's ``NormalizeReward`` and ``TransformReward(clip)`` do in CleanRL's continuous
    PPO, here outside the env so the episode statistics keep the true rewards. Autoreset steps
    (``valid`` False) neither count nor change the return."""

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0):
        self.gamma, self.clip = gamma, clip
        self.returns = np.zeros(num_envs)
        self.rms = RunningMeanStd(())

    def __call__(self, rewards: np.ndarray, terminated: np.ndarray, valid: np.ndarray) -> np.ndarray:
        # As gymnasium's wrapper: a terminating step's reward starts the return afresh.
        advanced = self.returns * self.gamma * (1 - terminated) + rewards
        if valid.all():  # the common step: np.where and the boolean index would keep every entry
            self.returns = advanced
            self.rms.update(advanced)
        else:
            self.returns = np.where(valid, advanced, self.returns)
            if valid.any():
                self.rms.update(self.returns[valid])
        scaled = rewards / math.sqrt(float(self.rms.var) + 1e-8)
        scaled = np.minimum(np.maximum(scaled, -self.clip), self.clip)  # np.clip without its wrapper
        return scaled.astype(np.float32, copy=False)

    def state_dict(self) -> dict:
        return {"returns": self.returns, "rms": self.rms.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.returns = state["returns"]
        self.rms.load_state_dict(state["rms"])
