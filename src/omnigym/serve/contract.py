"""The seam between ``omnigym serve``'s HTTP layer and its compute.

What crosses it (plain Python and torch; no HTTP, no pydantic, no ``tinker`` types)::

    hub = ModelHub(base_model: str, root: Path, ...)        # loads the base weights once
    hub.create_model(model_id, lora_rank, seed, train_mlp, train_attn, train_unembed) -> None
    hub.forward_backward(model_id, data: list[DatumIn], loss_fn: str,
                         loss_fn_config: dict | None, forward_only: bool) -> ForwardResult
    hub.optim_step(model_id, adam: AdamStep) -> dict[str, float]
    hub.save(model_id, name, kind) -> None        # kind: "state" (weights + optimizer) or "sampler"
    hub.load(model_id, source_model_id, name, with_optimizer: bool) -> None
    hub.sample(source: SamplerSource, prompt: list[int], n: int, params: SampleParams)
        -> SampleResult
    hub.drop(model_id) -> None                     # frees an adapter and its optimizer
    hub.vocab_size, hub.max_length, hub.base_model

The HTTP layer owns identities and paths: it decides who may touch which model id and maps a
``tinker://`` path onto (model id, kind, name) after checking the caller owns it; the hub gets
only those validated parts (never a path a request wrote) and keeps its files under ``root``.
Every hub call but ``sample`` runs on one worker thread (the HTTP layer's queue); ``sample``
runs on sampling threads beside it, so what it shares with ``save`` (the checkpoint folders,
the sampler's caches) is locked.
A mistake in a request is a ``RequestError`` (HTTP 400 with its message; ``status`` may say
404 or 413); anything else is the server's own fault (500).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from omnigym.errors import OmnigymError


class RequestError(OmnigymError):
    """A request the server refuses: the message says what was wrong and goes to the client."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class DatumIn:
    tokens: list[int]
    """the model input, its chunks concatenated (text chunks only)"""
    inputs: dict[str, torch.Tensor]
    """``loss_fn_inputs`` by name, each shaped as sent (``target_tokens``, ``weights``,
    ``logprobs``, ``advantages``, ...), one row per input position"""


@dataclass
class ForwardResult:
    outputs: list[dict[str, torch.Tensor]]
    """one per datum: ``logprobs`` (the targets' log-probs under the model, float32, one per
    position) and ``elementwise_loss`` where the loss has one"""
    metrics: dict[str, float] = field(default_factory=dict)
    """``loss:sum`` and whatever else the loss reports, with the SDK's ``name:reduction`` keys"""


@dataclass
class AdamStep:
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


@dataclass
class SamplerSource:
    """Where sampling weights come from: the base model alone (``model_id`` None), or the
    weights one training run saved for sampling under ``name``."""
    model_id: str | None = None
    name: str | None = None
    session: str | None = None
    """the sampling session (or caller) the request belongs to: the prefix cache's key, so one
    client's conversation is never read from another's cache entries (None: not cached)"""


@dataclass
class SampleParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_tokens: list[int] = field(default_factory=list)
    stop_strings: list[str] = field(default_factory=list)
    prompt_logprobs: bool = False


@dataclass
class SampledSequence:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str
    """"stop" (an end or stop token/string) or "length" (``max_tokens`` reached)"""


@dataclass
class SampleResult:
    sequences: list[SampledSequence]
    prompt_logprobs: list[float | None] | None = None
    """the prompt tokens' log-probs (None for the first), when asked"""
