"""Advantage estimators: one contract, one registry, shared by control and language.

Every estimator is called the same way::

    advantages, returns = estimator(rewards, mask, group_ids=None, values=None, cfg=AdvantageConfig(), ends=None,
                                    steps=None)

- ``rewards`` ``[B, T]``: per-step (control: B envs, T steps) or per-token (language: B
  sequences, T tokens; an outcome reward sits on the last completion token);
- ``mask`` ``[B, T]``: 1 where a step or token counts (0 on padding, on tokens the env
  inserted, on the autoreset step of a vector env); outputs are 0 where it is 0;
- ``group_ids`` ``[B]``: which prompt each sequence answers (group estimators need it);
- ``values`` ``[B, T]``: the critic's values, where there is a critic;
- ``ends``: where episodes end inside a row (control). Without it, each row is one episode
  that terminates at its last valid step, as a completion does;
- ``steps`` ``[B, T]``: process rewards inside a sequence, on the tokens that end its steps,
  NaN elsewhere (GRPO's ``--step-rewards``; they are in ``rewards`` too). Only ``process``
  reads them apart; the others see them as part of ``rewards``.

``gae`` and ``returns`` as functions are the time-step estimators control PPO, REINFORCE and
RLHF call with their critic. In the registry (what ``--advantage`` names for GRPO, which has no
critic) ``gae`` is ``turn_gae``: GAE where a step is one of the model's turns.

Time-step estimators (``gae``, ``returns``) bootstrap from ``ends.bootstrap_values[b, t]``,
the critic's value of the observation after step ``t``, on a truncated step and at the end
of the rollout, never on a terminated one. Group estimators (``grpo``, ``dr_grpo``,
``rloo``, ``reinforce_pp``) score each sequence by the sum of its rewards and give every
valid token of it the same advantage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from omnigym.errors import OmnigymError

ADVANTAGE_ESTIMATORS: dict[str, Callable] = {}


@dataclass
class AdvantageConfig:
    gamma: float = 1.0
    lam: float = 1.0


@dataclass
class EpisodeEnds:
    """Where episodes end inside the rows of a control rollout, all ``[B, T]``."""
    terminated: torch.Tensor
    truncated: torch.Tensor
    bootstrap_values: torch.Tensor


def register_advantage(name: str):
    def wrap(fn):
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return wrap


def get_advantage(name: str) -> Callable:
    if name not in ADVANTAGE_ESTIMATORS:
        raise OmnigymError(f"unknown advantage estimator {name!r}; known: {', '.join(sorted(ADVANTAGE_ESTIMATORS))}")
    return ADVANTAGE_ESTIMATORS[name]


def _sequence_ends(mask: torch.Tensor, values: torch.Tensor | None) -> EpisodeEnds:
    """Each row one episode, terminated at its last valid step (steps after it count as ended;
    masked steps before it, such as tokens a tool inserted, stay inside the episode)."""
    valid = mask.long()
    ended = valid.cumsum(-1) == valid.sum(-1, keepdim=True)  # the last valid step and all after it
    bootstrap = torch.zeros(mask.shape, device=mask.device) if values is None else \
        torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], 1)
    return EpisodeEnds(ended, torch.zeros_like(ended), bootstrap)


def gae(rewards, mask, group_ids=None, values=None, cfg: AdvantageConfig = AdvantageConfig(), ends=None, steps=None):
    """Generalized advantage estimation (Schulman et al., 2016); no critic means values of 0."""
    values = torch.zeros_like(rewards) if values is None else values
    ends = ends or _sequence_ends(mask, values)
    not_terminated = 1.0 - ends.terminated.float()
    not_done = 1.0 - (ends.terminated | ends.truncated).float()
    deltas = rewards + cfg.gamma * not_terminated * ends.bootstrap_values - values
    # The backward recursion runs in numpy, time-major: a step of it is three numpy calls on
    # a row (~2 us) where torch took ~25 us, which on a 2048-step MuJoCo rollout was 50 ms.
    d = deltas.detach().float().T.cpu().numpy().copy()
    carry = (cfg.gamma * cfg.lam * not_done).float().T.cpu().numpy().copy()
    running = np.zeros_like(d[0])
    for t in reversed(range(len(d))):
        running = d[t] + carry[t] * running
        d[t] = running
    advantages = torch.from_numpy(d).T.to(device=rewards.device, dtype=rewards.dtype)
    mask = mask.to(rewards.dtype)
    return advantages * mask, (advantages + values) * mask


@register_advantage("returns")
def discounted_returns(rewards, mask, group_ids=None, values=None, cfg: AdvantageConfig = AdvantageConfig(),
                       ends=None, steps=None):
    """Monte-Carlo discounted returns, bootstrapped only at truncation and at the rollout's end.

    With ``values`` the advantage is ``return - value`` (a learned baseline); without, it is
    the return itself (plain REINFORCE)."""
    ends = ends or _sequence_ends(mask, values)
    not_terminated = 1.0 - ends.terminated.float()
    not_done = 1.0 - (ends.terminated | ends.truncated).float()
    bootstrap = ends.bootstrap_values
    returns = torch.zeros_like(rewards)
    # After a truncation, the tail of the episode is replaced by the critic's estimate.
    running = bootstrap[:, -1] * not_terminated[:, -1]
    for t in reversed(range(rewards.shape[1])):
        cut = not_done[:, t]
        tail = cut * running + (1 - cut) * not_terminated[:, t] * bootstrap[:, t]
        running = rewards[:, t] + cfg.gamma * tail
        returns[:, t] = running
    advantages = returns - values if values is not None else returns.clone()
    mask = mask.to(rewards.dtype)
    return advantages * mask, returns * mask


def normalize(x: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit std over the valid entries (all entries when no mask is given). Without a
    mask, one entry has no spread to scale by (its std is nan) and is returned as it is."""
    if mask is None:
        return x if x.numel() < 2 else (x - x.mean()) / (x.std() + eps)
    mask = mask.to(x.dtype)
    n = mask.sum().clamp(min=1)
    mean = (x * mask).sum() / n
    var = (((x - mean) * mask) ** 2).sum() / (n - 1).clamp(min=1)
    return (x - mean) / (var.sqrt() + eps) * mask


# Group estimators: one score per sequence, one advantage per sequence.


def _per_group(scores: torch.Tensor, group_ids: torch.Tensor | None, fn) -> torch.Tensor:
    """Apply ``fn`` to ``[groups, size]`` matrices of the scores of each group. Groups of the
    same size go through ``fn`` together; a group of one gets advantage 0 (nothing to compare)."""
    if group_ids is None:
        raise OmnigymError("a group advantage estimator needs group_ids (which prompt each sample answers)")
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    sizes = counts[inverse]
    out = torch.zeros_like(scores)
    for size in sizes.unique().tolist():
        if size < 2:
            continue
        members = torch.nonzero(sizes == size).squeeze(1)
        members = members[torch.argsort(inverse[members], stable=True)]  # each group's members adjacent
        out[members] = fn(scores[members].reshape(-1, size)).reshape(-1)
    return out


def _outcome(fn):
    """Wrap ``fn(scores, group_ids) -> [B]`` into the token-level contract."""

    def estimator(rewards, mask, group_ids=None, values=None, cfg: AdvantageConfig = AdvantageConfig(), ends=None,
                  steps=None):
        mask = mask.to(rewards.dtype)
        scores = (rewards * mask).sum(-1)
        return fn(scores, group_ids)[:, None] * mask, scores[:, None] * mask

    estimator.__name__, estimator.__doc__ = fn.__name__, fn.__doc__
    return estimator


@register_advantage("grpo")
@_outcome
def group_normalized(scores, group_ids):
    """GRPO (Shao et al., 2024): reward minus its group's mean, over the group's std."""
    return _per_group(scores, group_ids, _standardized)


def _standardized(g: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    return (g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + eps)


@register_advantage("dr_grpo")
@_outcome
def group_centered(scores, group_ids):
    """Dr. GRPO (Liu et al., 2025): the group mean is subtracted, nothing is divided."""
    return _per_group(scores, group_ids, lambda g: g - g.mean(1, keepdim=True))


@register_advantage("rloo")
@_outcome
def leave_one_out(scores, group_ids):
    """RLOO (Ahmadian et al., 2024): reward minus the mean of the *other* samples of its group."""
    return _per_group(scores, group_ids, lambda g: g - (g.sum(1, keepdim=True) - g) / (g.shape[1] - 1))


@register_advantage("reinforce_pp")
@_outcome
def batch_normalized(scores, group_ids, eps: float = 1e-8):
    """REINFORCE++ (Hu, 2025): rewards standardized over the whole batch, not per group."""
    return (scores - scores.mean()) / (scores.std() + eps)


# Multi-turn credit: a language episode's steps are the model's turns.


def turn_spans(mask_row: torch.Tensor) -> list[tuple[int, int]]:
    """The model's turns in one row: each maximal run of mask-1 tokens, ``(start, end)``.
    Turns are told apart by the tokens the env or the template inserted between them (mask 0);
    two replies with nothing inserted between them read as one turn."""
    valid = mask_row.bool().tolist()
    spans, start = [], None
    for t, v in enumerate(valid + [False]):
        if v and start is None:
            start = t
        elif not v and start is not None:
            spans.append((start, t))
            start = None
    return spans


def turn_gae(rewards, mask, group_ids=None, values=None, cfg: AdvantageConfig = AdvantageConfig(), ends=None,
             steps=None):
    """GAE over the turns of each episode (one row), every token of a turn given its turn's advantage.

    Turn ``k``'s reward ``r_k`` is the sum of the rewards from its first token up to the next
    turn's first token (an env's step reward for it, on the tokens it inserted after it; the
    final reward on the last turn's last token). ``G_k = r_k + gamma G_{k+1}`` is its return.
    The value of turn ``k`` is ``values`` at its first token when a critic gives them; without
    one (GRPO) it is the mean of ``G_k`` over the episodes of the same group that reached a
    k-th turn (all rows when ``group_ids`` is None). After the last turn the value is 0. Then
    ``delta_k = r_k + gamma V_{k+1} - V_k`` and ``A_k = sum_l (gamma lam)^l delta_{k+l}``: with
    ``lam`` 1, ``A_k = G_k - V_k``; a single-turn episode gets reward minus its group's mean
    (Dr. GRPO's advantage). Returns ``(advantages, returns)``, both 0 off the mask."""
    spans = [turn_spans(row) for row in mask]
    turn_rewards = []
    for b, row in enumerate(spans):
        bounds = [start for start, _ in row[1:]] + [rewards.shape[1]]
        turn_rewards.append([float(rewards[b, start:bound].sum()) for (start, _), bound in zip(row, bounds)])
    returns = []
    for rs in turn_rewards:
        g, out = 0.0, []
        for r in reversed(rs):
            g = r + cfg.gamma * g
            out.append(g)
        returns.append(out[::-1])
    if values is not None:
        turn_values = [[float(values[b, start]) for start, _ in row] for b, row in enumerate(spans)]
    else:  # the group's mean return at each turn index, among the episodes that reached it
        groups = [0] * len(spans) if group_ids is None else [int(g) for g in group_ids]
        totals: dict[tuple[int, int], list[float]] = {}
        for group, gs in zip(groups, returns):
            for k, g in enumerate(gs):
                totals.setdefault((group, k), []).append(g)
        turn_values = [[sum(totals[group, k]) / len(totals[group, k]) for k in range(len(gs))]
                       for group, gs in zip(groups, returns)]
    advantages, token_returns = torch.zeros_like(rewards), torch.zeros_like(rewards)
    for b, row in enumerate(spans):
        running = 0.0
        for k in reversed(range(len(row))):
            following = turn_values[b][k + 1] if k + 1 < len(row) else 0.0
            delta = turn_rewards[b][k] + cfg.gamma * following - turn_values[b][k]
            running = delta + cfg.gamma * cfg.lam * running
            start, end = row[k]
            advantages[b, start:end] = running
            token_returns[b, start:end] = returns[b][k]
    return advantages, token_returns


register_advantage("gae")(turn_gae)


# Process rewards: steps inside one reply.


@register_advantage("process")
def process_supervision(rewards, mask, group_ids=None, values=None, cfg: AdvantageConfig = AdvantageConfig(),
                        ends=None, steps=None):
    """Outcome and step rewards together: DeepSeekMath's process supervision (Shao et al., 2024,
    section 4.1.3) with the outcome kept beside it, as PRIME (Cui et al., 2025) keeps it.

    The outcome (a row's rewards off its step ends) gets GRPO's advantage, the same on every
    token. Each step reward is centred on the mean of the step rewards of its group (all
    replies to the prompt, all their steps), and a token's process advantage is the sum of the
    centred rewards of the step it is in and of the steps after it: a wrong step lowers the
    tokens that led to it, not the right steps after it. Centred, not divided by the std, so
    the weight in --step-rewards sets the process part's scale against the outcome's. Without
    ``steps`` this is GRPO. Returns ``(advantages, returns)``: the returns are the outcome
    plus the step rewards still to come, 0 off the mask."""
    mask = mask.to(rewards.dtype)
    steps = torch.full(mask.shape, float("nan"), device=mask.device) if steps is None else steps
    at_step = ~torch.isnan(steps)
    step_values = torch.nan_to_num(steps, nan=0.0).to(rewards.dtype)
    outcome = ((rewards - step_values) * mask).sum(-1)
    advantages = _per_group(outcome, group_ids, _standardized)[:, None] * mask  # refuses a missing group_ids
    centred = torch.zeros_like(step_values)
    for group in group_ids.unique().tolist():
        members = (group_ids == group)[:, None] & at_step
        if members.any():
            centred[members] = step_values[members] - step_values[members].mean()
    to_go = centred.flip(-1).cumsum(-1).flip(-1)
    advantages = advantages + to_go * mask
    return advantages, (outcome[:, None] + step_values.flip(-1).cumsum(-1).flip(-1)) * mask


def outcome_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sequence rewards ``[B]`` as token rewards ``[B, T]``: each on its sequence's last valid token
    (a batch with no tokens at all, every episode failed before its first reply, has nowhere to
    put them: zeros ``[B, 0]``)."""
    valid = mask.bool()
    if mask.shape[1] == 0:
        return torch.zeros(mask.shape, dtype=scores.dtype, device=mask.device)
    last = (valid.long() * torch.arange(1, mask.shape[1] + 1, device=mask.device)).argmax(-1)
    rewards = torch.zeros(mask.shape, dtype=scores.dtype, device=mask.device)
    rows = torch.nonzero(valid.any(-1)).squeeze(1)
    rewards[rows, last[rows]] = scores[rows]
    return rewards
