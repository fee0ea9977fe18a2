"""Advantage estimators, in one registry shared by control and language algorithms.

Time-step estimators (GAE, discounted returns) take tensors shaped ``[T, N]`` (time,
envs). ``bootstrap_values[t]`` is the critic's value of the observation that followed
step ``t``; on a truncated step it is the value of the episode's final observation, so
the estimate bootstraps from it, and on a terminated step it is ignored.
"""

from __future__ import annotations

from typing import Callable

import torch

from omnigym.errors import OmnigymError

ADVANTAGE_ESTIMATORS: dict[str, Callable] = {}


def register_advantage(name: str):
    def wrap(fn):
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return wrap


def get_advantage(name: str) -> Callable:
    if name not in ADVANTAGE_ESTIMATORS:
        raise OmnigymError(f"unknown advantage estimator {name!r}; known: {', '.join(sorted(ADVANTAGE_ESTIMATORS))}")
    return ADVANTAGE_ESTIMATORS[name]


@register_advantage("gae")
def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float = 0.99,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation. Returns ``(advantages, returns)``, both ``[T, N]``."""
    not_terminated = 1.0 - terminated.float()
    not_done = 1.0 - (terminated | truncated).float()
    deltas = rewards + gamma * not_terminated * bootstrap_values - values
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        running = deltas[t] + gamma * lam * not_done[t] * running
        advantages[t] = running
    return advantages, advantages + values


@register_advantage("returns")
def discounted_returns(
    rewards: torch.Tensor,
    values: torch.Tensor | None,
    bootstrap_values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float = 0.99,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Monte-Carlo discounted returns (bootstrapped only at truncation and at the rollout's end).

    With ``values`` given the advantage is ``return - value`` (a learned baseline); without,
    the advantage is the return itself (plain REINFORCE).
    """
    not_terminated = 1.0 - terminated.float()
    not_done = 1.0 - (terminated | truncated).float()
    returns = torch.zeros_like(rewards)
    # After a truncation, the tail of the episode is replaced by the critic's estimate.
    running = bootstrap_values[-1] * not_terminated[-1]
    for t in reversed(range(rewards.shape[0])):
        cut = not_done[t]
        tail = cut * running + (1 - cut) * not_terminated[t] * bootstrap_values[t]
        running = rewards[t] + gamma * tail
        returns[t] = running
    advantages = returns - values if values is not None else returns.clone()
    return advantages, returns


def normalize(x: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit std over the valid entries (all entries when no mask is given)."""
    if mask is None:
        return (x - x.mean()) / (x.std() + eps)
    mask = mask.to(x.dtype)
    n = mask.sum().clamp(min=1)
    mean = (x * mask).sum() / n
    var = (((x - mean) * mask) ** 2).sum() / (n - 1).clamp(min=1)
    return (x - mean) / (var.sqrt() + eps) * mask


# Group estimators for language: ``rewards`` is ``[num_prompts * group_size]``, samples of
# one prompt adjacent. Each returns one advantage per sample (broadcast over its tokens).


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.numel() % group_size:
        raise OmnigymError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    return rewards.reshape(-1, group_size)


@register_advantage("grpo")
def group_normalized(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """GRPO (Shao et al., 2024): reward minus its group's mean, over the group's std."""
    g = _groups(rewards, group_size)
    return ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + eps)).reshape(-1)


@register_advantage("dr_grpo")
def group_centered(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dr. GRPO (Liu et al., 2025): the group mean is subtracted, nothing is divided."""
    g = _groups(rewards, group_size)
    return (g - g.mean(1, keepdim=True)).reshape(-1)


@register_advantage("rloo")
def leave_one_out(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO (Ahmadian et al., 2024): reward minus the mean of the *other* samples of its group."""
    if group_size < 2:
        raise OmnigymError("RLOO needs at least 2 samples per prompt")
    g = _groups(rewards, group_size)
    others = (g.sum(1, keepdim=True) - g) / (group_size - 1)
    return (g - others).reshape(-1)


@register_advantage("reinforce_pp")
def batch_normalized(rewards: torch.Tensor, group_size: int = 1, eps: float = 1e-8) -> torch.Tensor:
    """REINFORCE++ (Hu, 2025): rewards standardized over the whole batch, not per group."""
    return (rewards - rewards.mean()) / (rewards.std() + eps)
