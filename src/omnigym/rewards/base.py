"""The reward registry: what every reward module imports (``__init__`` adds lookup and sums)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from omnigym.errors import OmnigymError

Reward = Callable[[Sequence[str], Sequence[dict]], torch.Tensor]
REWARDS: dict[str, Reward] = {}


def register_reward(name: str):
    def wrap(reward: Reward) -> Reward:
        REWARDS[name] = reward
        return reward

    return wrap


class per_sample:
    """A batched reward from ``fn(completion, example) -> float`` (values kept in float64)."""

    def __init__(self, fn: Callable[[str, dict], float]):
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __call__(self, completions: Sequence[str], examples: Sequence[dict]) -> torch.Tensor:
        if len(completions) != len(examples):
            raise OmnigymError(f"{len(completions)} completions but {len(examples)} examples")
        return torch.tensor([float(self.fn(c, e)) for c, e in zip(completions, examples)], dtype=torch.float64)


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
    return values
