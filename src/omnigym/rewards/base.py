"""The reward registry: what every reward module imports (``__init__`` adds lookup and sums)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

import math
import numbers

from omnigym.errors import OmnigymError
from omnigym.user_code import call_user_code

MAX_REWARD = 1e15
"""The largest reward a user's code may hand back (an agent's return, a skyrl env's step): rewards
become float32 tensors and a group's advantages square them, so past this a finite Python float
turns into inf or nan there (1e300 is finite here and inf in float32)."""


def reward_value(value) -> float | None:
    """``value`` as the float a reward is, or None where it is none: a real number (a bool is 0 or
    1), finite and at most ``MAX_REWARD`` in size. Converted once and the conversion checked: an
    int of 400 digits was an OverflowError in ``isfinite``, and a float subclass checked as 0.5 could
    answer ``float()`` with 1e300."""
    if not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError):
        return None
    return number if type(number) is float and math.isfinite(number) and abs(number) <= MAX_REWARD else None


def shown_reward(value, width: int = 80) -> str:
    """A rejected reward as a refusal names it: its repr, cut short (an int of 5,000 digits has no
    repr at all: Python refuses to write it)."""
    try:
        shown = repr(value)
    except Exception:  # noqa: BLE001 - ValueError past sys.get_int_max_str_digits, or the object's own __repr__
        return f"a {type(value).__name__} that cannot be written out"
    return shown[:width] + "..." if len(shown) > width else shown


def usable_reward(value) -> bool:
    """A real number, finite, at most ``MAX_REWARD`` in size (a bool counts as 0 or 1)."""
    return reward_value(value) is not None

class Reward:
    """The reward seam: what every reward declares, and all that callers use of one.

    - ``reward(completions, examples) -> Tensor[B]``: one float per completion (float64);
    - ``reward.score(completions, examples) -> (Tensor[B], {name: Tensor[B]})``: the score
      checked (one finite float per completion; an error in your code is one line) and the
      named parts it adds up, logged as ``reward/<name>`` (none for a reward of one part);
    - ``reward.accuracy() -> Reward``: the reward that says whether an answer is right
      (scores >= 1): a weighted sum's first part, else the reward itself;
    - ``reward.to(device) -> Reward``: where a reward that holds a model runs (others ignore it).

    A subclass implements ``__call__``; any other callable becomes a ``Reward`` by ``as_reward``."""

    label = "reward"
    """names the reward in errors (``reward <label> returned ...``)"""

    def __call__(self, completions: Sequence[str], examples: Sequence[dict]) -> torch.Tensor:
        raise NotImplementedError

    def score(self, completions: Sequence[str], examples: Sequence[dict]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        values = call_user_code(f"reward {self.label}", self, completions, examples)
        return checked(self.label, values, len(completions)), {}

    def score_notes(self, completions: Sequence[str],
                    examples: Sequence[dict]) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, list[float]]]:
        """``score``'s totals and parts, and notes: ``{name: one number per completion}`` that
        the reward observed beside its score (the code reward: ``sandbox_blocked``, attempts the
        sandbox stopped), for each trajectory's info; none by default."""
        totals, parts = self.score(completions, examples)
        return totals, parts, {}

    def accuracy(self) -> "Reward":
        return self

    def to(self, device: str) -> "Reward":
        return self


class CallableReward(Reward):
    """A callable of your own, ``(completions, examples) -> values``, as a ``Reward``."""

    def __init__(self, fn: Callable, label: str):
        self.fn, self.label = fn, label

    def __call__(self, completions: Sequence[str], examples: Sequence[dict]) -> torch.Tensor:
        return self.fn(completions, examples)


def as_reward(reward, label: str) -> Reward:
    """``reward`` itself when it is a ``Reward``, else the callable wrapped as one (``label``
    names it in errors)."""
    if isinstance(reward, Reward):
        return reward
    if not callable(reward):
        raise OmnigymError(f"reward {label} is not callable; a reward is (completions, examples) -> tensor")
    return CallableReward(reward, label)


REWARDS: dict[str, Callable] = {}


def register_reward(name: str):
    def wrap(reward: Reward) -> Reward:
        REWARDS[name] = reward
        return reward

    return wrap


class per_sample(Reward):
    """A batched reward from ``fn(completion, example) -> float`` (values kept in float64)."""

    def __init__(self, fn: Callable[[str, dict], float]):
        self.fn = fn
        self.label = getattr(fn, "__name__", type(fn).__name__)
        self.__doc__ = fn.__doc__

    def __call__(self, completions: Sequence[str], examples: Sequence[dict]) -> torch.Tensor:
        if len(completions) != len(examples):
            raise OmnigymError(f"{len(completions)} completions but {len(examples)} examples")
        return torch.tensor([self.number(self.fn(c, e)) for c, e in zip(completions, examples)], dtype=torch.float64)

    def number(self, value) -> float:
        """One completion's reward as a float: "1.0" was read as 1.0 (and trained on), None raised in
        float() as if the reward's own code had."""
        if isinstance(value, (numbers.Real, np.bool_)) or (isinstance(value, torch.Tensor) and value.numel() == 1):
            return float(value)
        if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "biuf":  # np.where(ok, 1.0, 0.0)
            return float(value)
        raise OmnigymError(f"reward {self.label} returned {value!r:.60} for a completion; a reward is a number")

    def score_notes(self, completions, examples):
        """A function with ``with_notes(completion, example) -> (float, {name: number})`` (the code
        reward) gives its notes; any other, none."""
        if not hasattr(self.fn, "with_notes"):
            return super().score_notes(completions, examples)
        if len(completions) != len(examples):
            raise OmnigymError(f"{len(completions)} completions but {len(examples)} examples")
        scored = [self.fn.with_notes(c, e) for c, e in zip(completions, examples)]
        notes = {name: [float(own.get(name, 0.0)) for _, own in scored] for name in dict.fromkeys(
            name for _, own in scored for name in own)}
        return checked(self.label, [value for value, _ in scored], len(completions)), {}, notes


def checked(name: str, values, n: int) -> torch.Tensor:
    """A reward's output as float64, refused in one line unless it is one finite number per completion."""
    try:
        values = torch.as_tensor(values, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise OmnigymError(f"reward {name} returned {type(values).__name__}; a reward returns one float per "
                           "completion (a 1-D tensor; wrap a per-example function with per_sample)") from None
    if values.shape != (n,):
        raise OmnigymError(f"reward {name} returned shape {tuple(values.shape)} for {n} completions; a reward returns "
                           "one float per completion (wrap a per-example function with per_sample)")
    if not torch.isfinite(values).all():
        raise OmnigymError(f"reward {name} returned a non-finite value ({values[~torch.isfinite(values)][0].item()})")
    if not usable_totals(values):  # finite in float64, inf once the trainer takes it as float32
        raise OmnigymError(f"reward {name} returned {values[values.abs().argmax()].item()!r}; a reward is at most "
                           f"{MAX_REWARD:g} in size")  # (:g showed 1.0000001e15 as 1e+15, the limit itself)
    return values


def usable_totals(values: torch.Tensor) -> bool:
    """Every value finite and at most ``MAX_REWARD`` in size."""
    return bool(torch.isfinite(values).all() and (values.abs() <= MAX_REWARD).all())
