"""The ``tinker`` SDK's built-in losses, on one datum's target log-probs.

Each loss is ``fn(logprobs, inputs, config) -> (loss, elementwise, metrics)``: ``logprobs`` the
model's log-probs of ``target_tokens`` (one per position, with gradient), ``inputs`` the
datum's other ``loss_fn_inputs`` as float tensors shaped like ``logprobs``, ``config`` the
request's ``loss_fn_config`` with defaults filled in. ``loss`` is a scalar: Tinker **sums** over
tokens (no mean), and the hub sums it over the data of a call, so that gradients of several
calls before one ``optim_step`` add up exactly as one call with all the data would.

The definitions follow Tinker's loss documentation (tinker-docs.thinkingmachines.ai, "Loss
Functions"): ``q`` is the sampler's log-prob (``logprobs`` input), ``A`` the advantage.

- ``cross_entropy``: ``-sum(weights * logp)`` (weights default to 1; the SDK's custom losses
  arrive as this with ``weights = -dC/dlogp``); ``target_tokens`` may be ``(N, K)`` with
  ``(N, K)`` weights (top-k distillation).
- ``importance_sampling``: ``-sum(exp(logp - q) * A)``.
- ``ppo``: ``-sum(min(r * A, clip(r, low, high) * A))``, ``r = exp(logp - q)``; ``low``/``high``
  are ratio bounds (``clip_low_threshold``, ``clip_high_threshold``; 0.8 and 1.2 by default:
  Tinker's epsilon of 0.2).
- ``cispo``: ``-sum(sg(clip(r, low, high)) * logp * A)``.
- ``dro``: ``-sum(logp * A - beta / 2 * (logp - q)^2)``.
- ``gspo`` (the token-level variant): every token takes the sequence ratio's value
  ``exp(mean over the ratio mask of (logp - q))`` and its own log-prob's gradient, then PPO's
  clipped objective.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Callable

import torch

from omnigym.serve.contract import RequestError

DEFAULT_CLIP = MappingProxyType({"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})


def _ratio_bounds(config: dict) -> tuple[float, float]:
    low, high = config["clip_low_threshold"], config["clip_high_threshold"]
    if not 0 <= low <= 1 <= high:
        raise RequestError(f"loss_fn_config: clip_low_threshold ({low}) and clip_high_threshold ({high}) are "
                           "bounds of the probability ratio: 0 <= low <= 1 <= high (e.g. 0.8 and 1.2)")
    return low, high


def cross_entropy(logp, inputs, config):
    elementwise = -inputs["weights"] * logp
    return elementwise.sum(), elementwise, {}


def importance_sampling(logp, inputs, config):
    ratio = (logp - inputs["logprobs"]).exp()
    elementwise = -ratio * inputs["advantages"]
    return elementwise.sum(), elementwise, {}


def _clipped_objective(ratio, advantages, low, high):
    """Per-token ``-min(r A, clip(r) A)`` and whether the clipped term was taken (it gives no
    gradient there)."""
    unclipped = ratio * advantages
    clipped = ratio.clamp(low, high) * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def ppo(logp, inputs, config):
    low, high = _ratio_bounds(config)
    elementwise, took_clip = _clipped_objective((logp - inputs["logprobs"]).exp(), inputs["advantages"], low, high)
    return elementwise.sum(), elementwise, {"clip_fraction:mean": float(took_clip.float().mean()) if len(logp) else 0.0}


def cispo(logp, inputs, config):
    low, high = _ratio_bounds(config)
    weight = (logp - inputs["logprobs"]).exp().clamp(low, high).detach()
    elementwise = -weight * logp * inputs["advantages"]
    return elementwise.sum(), elementwise, {}


def dro(logp, inputs, config):
    beta = config["beta"]
    elementwise = -(logp * inputs["advantages"] - 0.5 * beta * (logp - inputs["logprobs"]) ** 2)
    return elementwise.sum(), elementwise, {}


def gspo(logp, inputs, config):
    low, high = _ratio_bounds(config)
    if "sequence_ratio_mask" in inputs:
        in_ratio = inputs["sequence_ratio_mask"] != 0
    else:
        # the cookbook's RL data put zero advantage (and a zero sampler log-prob) on prompt
        # positions: leaving them out keeps the prompt's log-probs out of the sequence ratio
        in_ratio = inputs["advantages"] != 0
    log_ratio = (logp.detach() - inputs["logprobs"])[in_ratio].mean() if bool(in_ratio.any()) else logp.new_zeros(())
    ratio = (log_ratio + logp - logp.detach()).exp()
    elementwise, _ = _clipped_objective(ratio, inputs["advantages"], low, high)
    return elementwise.sum(), elementwise, {}


class LossSpec:
    def __init__(self, fn: Callable, required: tuple[str, ...], optional: tuple[str, ...] = (),
                 defaults: dict | None = None):
        self.fn, self.required, self.optional = fn, required, optional
        self.defaults = dict(defaults or {})


RL_INPUTS = ("target_tokens", "logprobs", "advantages")
LOSSES = MappingProxyType({
    "cross_entropy": LossSpec(cross_entropy, ("target_tokens",), ("weights",)),
    "importance_sampling": LossSpec(importance_sampling, RL_INPUTS, ("weights", "mask")),
    "ppo": LossSpec(ppo, RL_INPUTS, ("weights", "mask"), DEFAULT_CLIP),
    "cispo": LossSpec(cispo, RL_INPUTS, ("weights", "mask"), DEFAULT_CLIP),
    "dro": LossSpec(dro, RL_INPUTS, ("weights", "mask"), {"beta": 0.05}),
    "gspo": LossSpec(gspo, RL_INPUTS, ("weights", "mask", "sequence_ratio_mask"), DEFAULT_CLIP),
})
"""the losses this server computes; ``weights``/``mask`` are accepted on RL losses and unused,
as Tinker's RL losses weigh tokens by their advantages alone"""

REFUSED = MappingProxyType({
    "stable_reinforce": "needs the stability information a Tinker sampler records per sequence "
                        "(record_stability_info, sequence_id), which this server does not record",
})


def loss_spec(name: str, config: dict | None) -> tuple[LossSpec, dict]:
    """The loss called ``name`` and its config with defaults, or a ``RequestError`` naming the
    losses there are / the config keys it takes."""
    known = ", ".join(sorted(LOSSES))
    if name in REFUSED:
        raise RequestError(f"loss {name!r} is not supported by this server: {REFUSED[name]}; use one of {known}")
    if name not in LOSSES:
        raise RequestError(f"unknown loss {name!r}; this server has {known} (and custom losses through "
                           "forward_backward_custom)")
    spec = LOSSES[name]
    given = dict(config or {})
    unknown = sorted(set(given) - set(spec.defaults))
    if unknown:
        takes = ", ".join(sorted(spec.defaults)) or "no settings"
        raise RequestError(f"loss_fn_config for {name!r}: unknown key(s) {', '.join(unknown)}; it takes {takes}")
    merged = {**spec.defaults}
    for key, value in given.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RequestError(f"loss_fn_config[{key!r}] must be a finite number, got {value!r}")
        merged[key] = float(value)
    return spec, merged
