"""Losses shared by control and language: policy losses (one contract, one registry),
clipped value loss, KL estimators, negative log-likelihood.

A policy loss is called ``loss(new_logprobs, old_logprobs, advantages, mask, cfg,
behaviour_logprobs=None) -> (loss, stats)``: ``old_logprobs`` are the proximal policy's (the
one the ratio is taken against), ``behaviour_logprobs`` the sampler's, when it differs.

Every loss takes an optional ``mask`` (1 for steps or tokens that count, 0 for padding,
env-inserted tokens or the reset step of an autoresetting vector env).

The per-token objectives (``clipped_surrogate``, ``cispo_objective``, ``dro_objective``,
``sequence_ratio``, ``weighted_nll``) are the pieces the registered losses and the Tinker
server's losses (``serve/losses.py``) are both made of: they take the ratio's bounds as bounds
(Tinker's 0.8 and 1.2; ``ppo_clip`` turns its epsilons into them) and reduce nothing, so the
caller picks the reduction (``aggregate``; Tinker's is ``token-sum``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from omnigym.errors import OmnigymError

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "token-sum")


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None = None, dim=None) -> torch.Tensor:
    if mask is None:
        return x.mean() if dim is None else x.mean(dim)
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def aggregate(loss: torch.Tensor, mask: torch.Tensor | None, mode: str = "token-mean", normalizer: float | None = None):
    """Reduce a per-step (``[B]``) or per-token (``[B, L]``) loss to a scalar.

    ``token-mean``: every valid token weighs the same (DAPO); ``seq-mean-token-mean``: each
    sequence weighs the same (GRPO paper); ``seq-mean-token-sum-norm``: token sums divided by a
    constant (Dr. GRPO), so long and short answers are not re-weighted by their length;
    ``token-sum``: the plain sum over valid tokens (Tinker's losses: the loss of several
    calls before one optimizer step is then the loss of one call with all their data).
    """
    if mode == "token-sum":
        return loss.sum() if mask is None else (loss * mask.to(loss.dtype)).sum()
    if mode == "token-mean" or loss.dim() == 1:
        return masked_mean(loss, mask)
    if mode == "seq-mean-token-mean":
        return masked_mean(loss, mask, dim=-1).mean()
    if mode == "seq-mean-token-sum-norm":
        m = torch.ones_like(loss) if mask is None else mask.to(loss.dtype)
        return (loss * m).sum(-1).mean() / (normalizer or loss.shape[-1])
    raise OmnigymError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGGREGATIONS)}")


@dataclass
class PolicyLossConfig:
    clip_low: float = 0.2
    clip_high: float | None = None
    """upper clip of the ratio; above clip_low is DAPO's clip-higher (None: same as clip_low)"""
    aggregation: str = "token-mean"
    normalizer: float | None = None
    """the constant of seq-mean-token-sum-norm (default: the sequence width)"""
    behaviour_cap: float | None = None
    """truncated importance sampling: weight each step by min(pi_old / pi_behaviour, cap) when
    the samples came from another policy (an async generator, another engine)"""


POLICY_LOSSES: dict[str, Callable] = {}


def register_policy_loss(name: str):
    def wrap(fn):
        POLICY_LOSSES[name] = fn
        return fn

    return wrap


def get_policy_loss(name: str) -> Callable:
    if name not in POLICY_LOSSES:
        raise OmnigymError(f"unknown policy loss {name!r}; known: {', '.join(sorted(POLICY_LOSSES))}")
    return POLICY_LOSSES[name]


def _behaviour_corrected(loss, old_logprobs, behaviour_logprobs, cfg: PolicyLossConfig) -> torch.Tensor:
    """Decoupled PPO's correction, when the policy that sampled is not the proximal (old) one:
    each step's loss weighted by ``min(pi_old / pi_behaviour, cap)``."""
    if behaviour_logprobs is None or cfg.behaviour_cap is None:
        return loss
    return loss * (old_logprobs - behaviour_logprobs).exp().clamp(max=cfg.behaviour_cap).detach()


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, low: float | None = None,
                      high: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's per-token objective ``max(-A r, -A clip(r, low, high))`` with the ratio's bounds
    as bounds (0.8 and 1.2 for an epsilon of 0.2), and where the clipped term was the one taken
    (it gives no gradient there). Without bounds, the plain importance-weighted ``-A r``."""
    unclipped = -advantages * ratio
    if low is None and high is None:
        return unclipped, torch.zeros_like(ratio, dtype=torch.bool)
    clipped = -advantages * ratio.clamp(low, high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def cispo_objective(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, low: float,
                    high: float) -> torch.Tensor:
    """CISPO (MiniMax-M1) per token: ``-sg(clip(r, low, high)) * A * log pi``: the clipped ratio
    weighs a score-function gradient, so a clipped token still gives one."""
    weight = (new_logprobs - old_logprobs).exp().clamp(low, high).detach()
    return -weight * new_logprobs * advantages


def dro_objective(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                  beta: float) -> torch.Tensor:
    """DRO per token: ``-(A log pi - beta / 2 (log pi - log pi_old)^2)``, a score-function term
    held near the sampler by a quadratic penalty instead of a clip."""
    return -(new_logprobs * advantages - 0.5 * beta * (new_logprobs - old_logprobs) ** 2)


def sequence_ratio(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's token-level ratio: every token takes the value of the sequence ratio
    ``exp(mean over mask of (log pi - log pi_old))`` and the gradient of its own log-prob."""
    log_ratio = (new_logprobs.detach() - old_logprobs)[mask].mean() if bool(mask.any()) else \
        new_logprobs.new_zeros(())
    return (log_ratio + new_logprobs - new_logprobs.detach()).exp()


def weighted_nll(logprobs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-token negative log-likelihood, weighted (``nll_loss`` is its token mean under a 0/1 mask)."""
    return -weights * logprobs


@register_policy_loss("ppo_clip")
def ppo_clip(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    cfg: PolicyLossConfig = PolicyLossConfig(),
    behaviour_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate (Schulman et al., 2017), per step or token.

    Statistics: ``approx_kl`` (the k3 estimate of KL(old || new)); ``clip_fraction``, CleanRL's
    ``clipfrac``: the fraction of steps whose ratio is outside [1 - clip_low, 1 + clip_high], whatever
    the advantage's sign; ``clipped_objective_fraction``: the fraction whose loss took the clipped
    term, so that they give no gradient (the ratio past the bound the advantage pushes it to; TRL's
    GRPO logs it as ``clip_ratio/region_mean``)."""
    clip_high = cfg.clip_low if cfg.clip_high is None else cfg.clip_high
    log_ratio = new_logprobs - old_logprobs
    ratio = log_ratio.exp()
    per_token, took_clipped = clipped_surrogate(ratio, advantages, 1.0 - cfg.clip_low, 1.0 + clip_high)
    loss = _behaviour_corrected(per_token, old_logprobs, behaviour_logprobs, cfg)
    with torch.no_grad():
        stats = {
            "approx_kl": masked_mean((ratio - 1.0) - log_ratio, mask),
            "clip_fraction": masked_mean(((ratio < 1.0 - cfg.clip_low) | (ratio > 1.0 + clip_high)).float(), mask),
            "clipped_objective_fraction": masked_mean(took_clipped.float(), mask),
        }
    return aggregate(loss, mask, cfg.aggregation, cfg.normalizer), stats


@register_policy_loss("reinforce")
def reinforce(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    cfg: PolicyLossConfig = PolicyLossConfig(),
    behaviour_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The score-function gradient ``-advantage * log pi`` (Williams, 1992); no ratio, no clip."""
    loss = _behaviour_corrected(-advantages * new_logprobs, old_logprobs, behaviour_logprobs, cfg)
    return aggregate(loss, mask, cfg.aggregation, cfg.normalizer), {}


def value_loss(
    new_values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor | None = None,
    clip: float | None = None,
) -> torch.Tensor:
    """Half squared error to the returns; with ``clip``, PPO's pessimistic clipped variant."""
    unclipped = (new_values - returns) ** 2
    if clip is None:
        return 0.5 * masked_mean(unclipped, mask)
    clipped_values = old_values + (new_values - old_values).clamp(-clip, clip)
    clipped = (clipped_values - returns) ** 2
    return 0.5 * masked_mean(torch.maximum(unclipped, clipped), mask)


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-sample estimate of KL(policy || reference) from samples of the policy (Schulman's k1/k2/k3)."""
    log_ratio = logprobs - ref_logprobs
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    if kind == "k3":
        return (-log_ratio).exp() - 1.0 + log_ratio
    raise OmnigymError(f"unknown KL estimator {kind!r}; choose k1, k2 or k3")


def check_finite(loss: torch.Tensor, step: int) -> None:
    """Stop before a NaN/inf loss poisons the weights: no checkpoint is written after it (the
    CLI adds where the run's last checkpoint is, if any)."""
    if not torch.isfinite(loss):
        raise OmnigymError(f"loss became {loss.item()} at step {step}; lower the learning rate, or check the "
                           "env's observations and rewards")


def nll_loss(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the tokens under ``mask`` (supervised fine-tuning)."""
    return -(logprobs * mask).sum() / mask.sum().clamp(min=1)


# Preference losses: the reward model's Bradley-Terry loss and the DPO family. Each takes
# one value per pair and returns (loss, stats) with the metrics TRL users read.

PREFERENCE_LOSSES = ("sigmoid", "ipo", "hinge", "simpo")


def bradley_terry(chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None,
                  center_coef: float = 0.0) -> tuple[torch.Tensor, dict]:
    """``-log sigmoid(r_chosen - r_rejected - margin)``, plus ``center_coef`` times the mean of
    ``(r_chosen + r_rejected)^2``, which keeps the scores centred on 0 (Eisenstein et al.)."""
    difference = chosen - rejected - (margin if margin is not None else 0.0)
    loss = -torch.nn.functional.logsigmoid(difference).mean()
    if center_coef:
        loss = loss + center_coef * ((chosen + rejected) ** 2).mean()
    return loss, {"accuracy": (chosen > rejected).float().mean().detach(),
                  "margin": (chosen - rejected).mean().detach()}


def preference_loss(chosen_logps: torch.Tensor, rejected_logps: torch.Tensor, ref_chosen_logps: torch.Tensor | None,
                    ref_rejected_logps: torch.Tensor | None, kind: str = "sigmoid", beta: float = 0.1,
                    label_smoothing: float = 0.0, simpo_gamma: float = 0.5) -> tuple[torch.Tensor, dict]:
    """The DPO family on sequence log-probabilities (one per pair).

    With ``h = (log pi(y_c) - log ref(y_c)) - (log pi(y_r) - log ref(y_r))``:
    ``sigmoid`` (DPO, Rafailov et al.) ``-log sigmoid(beta h)``, with ``label_smoothing`` e the
    conservative cDPO ``-(1-e) log sigmoid(beta h) - e log sigmoid(-beta h)``; ``ipo`` (Azar et
    al.) ``(h - 1/(2 beta))^2`` (give it length-averaged log-probs, as IPO does); ``hinge``
    (SLiC) ``max(0, 1 - beta h)``; ``simpo`` (Meng et al., reference-free: no ref log-probs)
    ``-log sigmoid(beta (log pi(y_c) - log pi(y_r)) - gamma)`` on length-averaged log-probs.
    The implicit rewards are ``beta (log pi - log ref)`` (``beta log pi`` for SimPO)."""
    if kind not in PREFERENCE_LOSSES:
        raise OmnigymError(f"unknown preference loss {kind!r}; choose one of {', '.join(PREFERENCE_LOSSES)}")
    if kind == "simpo":
        chosen, rejected = chosen_logps, rejected_logps
        logits = beta * (chosen - rejected) - simpo_gamma
    else:
        if ref_chosen_logps is None or ref_rejected_logps is None:
            raise OmnigymError(f"the {kind} loss needs the reference model's log-probs (only simpo is reference-free)")
        chosen, rejected = chosen_logps - ref_chosen_logps, rejected_logps - ref_rejected_logps
        logits = beta * (chosen - rejected)
    logsigmoid = torch.nn.functional.logsigmoid
    if kind in ("sigmoid", "simpo"):
        losses = -(1 - label_smoothing) * logsigmoid(logits) - label_smoothing * logsigmoid(-logits)
    elif kind == "ipo":
        losses = (chosen - rejected - 1 / (2 * beta)) ** 2
    else:
        losses = torch.relu(1 - logits)
    chosen_rewards, rejected_rewards = (beta * chosen).detach(), (beta * rejected).detach()
    return losses.mean(), {"rewards/chosen": chosen_rewards.mean(), "rewards/rejected": rejected_rewards.mean(),
                           "rewards/accuracy": (chosen_rewards > rejected_rewards).float().mean(),
                           "rewards/margin": (chosen_rewards - rejected_rewards).mean()}
