"""Rewards are plain callables ``(completion, example) -> float`` in one registry.

``combine({"math": 1.0, "format": 0.1})`` builds a weighted sum that also reports each
part, so each reward can be logged as its own metric (``reward/math``, ``reward/format``).
"""

from __future__ import annotations

from typing import Callable

from omnigym.errors import OmnigymError

Reward = Callable[[str, dict], float]
REWARDS: dict[str, Reward] = {}


def register_reward(name: str):
    def wrap(fn: Reward) -> Reward:
        REWARDS[name] = fn
        return fn

    return wrap


def get_reward(name: str) -> Reward:
    _load_builtins()
    if name not in REWARDS:
        raise OmnigymError(f"unknown reward {name!r}; known: {', '.join(sorted(REWARDS))}")
    return REWARDS[name]


def combine(weights: dict[str, float]) -> Callable[[str, dict], tuple[float, dict[str, float]]]:
    parts = {name: get_reward(name) for name in weights}

    def score(completion: str, example: dict) -> tuple[float, dict[str, float]]:
        values = {name: float(fn(completion, example)) for name, fn in parts.items()}
        return sum(weights[n] * v for n, v in values.items()), values

    return score


def _load_builtins() -> None:
    from omnigym.rewards import code, text  # noqa: F401  (registration happens on import)
    from omnigym.tasks import reasoning_gym  # noqa: F401
