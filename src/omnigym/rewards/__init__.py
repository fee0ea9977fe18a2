"""Rewards: batched callables ``(completions, examples) -> tensor`` in one registry.

A reward takes a list of completions and the list of examples they answer and returns
one float per completion as a 1-D tensor. A verifier written for one completion becomes
a batched reward with ``per_sample``; a learned reward model is a reward like any other
(it scores the whole batch in one forward pass). Rewards are registered by name and must
be picklable (module-level functions or objects, no lambdas), so that they can be sent
to another process; any state they need travels with the example or the object, never in
a module-global cache.

``WeightedSum({"math": 1.0, "format": 0.1})`` is the weighted sum of several rewards and
also reports each part, so each can be logged as its own metric (``reward/math``, ...).
"""

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


def get_reward(name: str) -> Reward:
    _load_builtins()
    if name not in REWARDS:
        raise OmnigymError(f"unknown reward {name!r}; known: {', '.join(sorted(REWARDS))}")
    return REWARDS[name]


class WeightedSum:
    """``sum_i weight_i * reward_i``; ``components`` gives each reward's own values."""

    def __init__(self, weights: dict[str, float]):
        self.weights = dict(weights)
        self.parts = {name: get_reward(name) for name in self.weights}

    def components(self, completions: Sequence[str], examples: Sequence[dict]) -> dict[str, torch.Tensor]:
        return {name: reward(completions, examples).double() for name, reward in self.parts.items()}

    def total(self, components: dict[str, torch.Tensor]) -> torch.Tensor:
        values = list(components.items())
        out = torch.zeros_like(values[0][1])
        for name, value in values:
            out = out + self.weights[name] * value
        return out

    def __call__(self, completions: Sequence[str], examples: Sequence[dict]) -> torch.Tensor:
        return self.total(self.components(completions, examples))


def parse_weights(spec: str) -> WeightedSum:
    """``"math:1.0,format:0.1"`` as a ``WeightedSum``; every name must be a known reward."""
    try:
        weights = {name.strip(): float(weight) for name, weight in (part.split(":") for part in spec.split(","))}
    except ValueError:
        raise OmnigymError(f"--rewards must look like 'math:1.0,format:0.1', got {spec!r}") from None
    return WeightedSum(weights)


def _load_builtins() -> None:
    from omnigym.rewards import code, reasoning_gym, text  # noqa: F401  (registration happens on import)
