"""The ``tinker`` SDK's built-in losses, on one datum's target log-probs: names, inputs and
defaults of Tinker's, arithmetic of ``rl/losses.py`` (the per-token objectives every trainer's
losses are made of), called with Tinker's conventions: the ratio's bounds as bounds
(``clip_low_threshold``, ``clip_high_threshold``; 0.8 and 1.2 by default, Tinker's epsilon of
0.2) and the ``token-sum`` reduction (no mean). The hub sums a call's data too, so that the
gradients of several calls before one ``optim_step`` add up exactly as one call with all the
data would.

Each loss is ``fn(logprobs, inputs, config) -> (loss, elementwise, metrics)``: ``logprobs`` the
model's log-probs of ``target_tokens`` (one per position, with gradient), ``inputs`` the
datum's other ``loss_fn_inputs`` as float tensors shaped like ``logprobs``, ``config`` the
request's ``loss_fn_config`` with defaults filled in.

The definitions follow Tinker's loss documentation (tinker-docs.thinkingmachines.ai, "Loss
Functions"): ``q`` is the sampler's log-prob (``logprobs`` input), ``A`` the advantage,
``r = exp(logp - q)``.

- ``cross_entropy``: ``-sum(weights * logp)`` (weights default to 1; the SDK's custom losses
  arrive as this with ``weights = -dC/dlogp``); ``target_tokens`` may be ``(N, K)`` with
  ``(N, K)`` weights (top-k distillation).
- ``importance_sampling``: ``-sum(r * A)``.
- ``ppo``: ``-sum(min(r * A, clip(r, low, high) * A))``.
- ``cispo``: ``-sum(sg(clip(r, low, high)) * logp * A)``.
- ``dro``: ``-sum(logp * A - beta / 2 * (logp - q)^2)``.
- ``gspo`` (the token-level variant): PPO's objective on ``rl.losses.sequence_ratio``, over the
  ``sequence_ratio_mask`` (default: the positions with a non-zero advantage).
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Callable

import torch

from omnigym.rl.losses import (aggregate, cispo_objective, clipped_surrogate, dro_objective, sequence_ratio,
                               weighted_nll)
from omnigym.serve.contract import RequestError

DEFAULT_CLIP = MappingProxyType({"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
TINKER_REDUCTION = "token-sum"


def _ratio_bounds(config: dict) -> tuple[float, float]:
    low, high = config["clip_low_threshold"], config["clip_high_threshold"]
    if not 0 <= low <= 1 <= high:
        raise RequestError(f"loss_fn_config: clip_low_threshold ({low}) and clip_high_threshold ({high}) are "
                           "bounds of the probability ratio: 0 <= low <= 1 <= high (e.g. 0.8 and 1.2)")
    return low, high


def _summed(elementwise: torch.Tensor, metrics: dict | None = None):
    return aggregate(elementwise, None, TINKER_REDUCTION), elementwise, metrics or {}


def cross_entropy(logp, inputs, config):
    return _summed(weighted_nll(logp, inputs["weights"]))


def importance_sampling(logp, inputs, config):
    elementwise, _ = clipped_surrogate((logp - inputs["logprobs"]).exp(), inputs["advantages"])
    return _summed(elementwise)


def ppo(logp, inputs, config):
    elementwise, took_clip = clipped_surrogate((logp - inputs["logprobs"]).exp(), inputs["advantages"],
                                               *_ratio_bounds(config))
    return _summed(elementwise, {"clip_fraction:mean": float(took_clip.float().mean())})


def cispo(logp, inputs, config):
    return _summed(cispo_objective(logp, inputs["logprobs"], inputs["advantages"], *_ratio_bounds(config)))


def dro(logp, inputs, config):
    return _summed(dro_objective(logp, inputs["logprobs"], inputs["advantages"], config["beta"]))


def gspo(logp, inputs, config):
    low, high = _ratio_bounds(config)
    if "sequence_ratio_mask" in inputs:
        in_ratio = inputs["sequence_ratio_mask"] != 0
    else:
        # the cookbook's RL data put zero advantage (and a zero sampler log-prob) on prompt
        # positions: leaving them out keeps the prompt's log-probs out of the sequence ratio
        in_ratio = inputs["advantages"] != 0
    elementwise, _ = clipped_surrogate(sequence_ratio(logp, inputs["logprobs"], in_ratio), inputs["advantages"],
                                       low, high)
    return _summed(elementwise)


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
