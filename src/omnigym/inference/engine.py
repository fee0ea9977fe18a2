"""The inference-engine seam: prompts in, ``n`` samples each, token ids and log-probs out.

What crosses it::

    engine.generate(prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Sample]]
    engine.update_weights(named_tensors: Iterable[tuple[str, Tensor]], version: int) -> None
    engine.version -> int   # the policy version the next samples come from (read-only)

``update_weights`` with no tensors moves the version only (the trainer's step changed nothing).

Engines today run in the trainer's process on the trainer's model (``hf``: Hugging Face
``generate``; ``kv``: a lean sampler for Llama-family models), so ``update_weights`` only
copies what is not already shared and advances the version. An engine in another process
(vLLM, a Ray actor) implements the same three members; algorithms only see this
interface and get theirs from ``omnigym.inference.make_engine``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Iterable, Protocol

import numpy as np
import torch

from omnigym.errors import OmnigymError
from omnigym.models.lm import learned_position_limit


@dataclass
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    stop_ids: tuple[int, ...] = ()
    """token ids that end a sample as the end-of-sequence token does (kept in the sample)"""

    def __post_init__(self):
        # The commands check their flags; this is for Python callers: the kv engine drew token 0
        # with NaN log-probs at temperature 0 or nan, and took a negative top_k in silence.
        # (ValueError, as transformers' generate raises for the same values.)
        if not (whole(self.max_new_tokens) and self.max_new_tokens >= 0):
            raise ValueError(f"max_new_tokens must be a whole number, 0 or more, got {self.max_new_tokens!r}")
        if not self.greedy and not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number above 0 (greedy=True for greedy decoding), got "
                             f"{self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not (whole(self.top_k) and self.top_k >= 0):
            raise ValueError(f"top_k must be a whole number, 0 (no cut) or more, got {self.top_k!r}")


def whole(value) -> bool:
    """An integer of any kind (numpy's too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def check_samples_asked(n: int) -> None:
    """``generate``'s ``n``: a negative one gave an empty group (hf) or was taken in silence (kv)."""
    if not (whole(n) and n >= 1):
        raise ValueError(f"n (samples per prompt) must be a whole number, 1 or more, got {n!r}")


def check_positions(prompts: list[list[int]], params: "SamplingParams", limit: int | None) -> None:
    """One line, not an ``IndexError`` deep in the model, when the longest prompt and its new
    tokens need positions a learned table does not have (``learned_position_limit``)."""
    longest = max((len(p) for p in prompts), default=0)
    if limit is not None and longest + params.max_new_tokens > limit:
        raise OmnigymError(f"a prompt of {longest} tokens and up to {params.max_new_tokens} new ones need more "
                           f"than the model's {limit} positions (its position embeddings are learned and end "
                           "there): give shorter prompts, fewer --max-new-tokens or a model with a longer context")


@dataclass
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    """generated tokens, up to and including the end-of-sequence token if one was made"""
    logprobs: list[float]
    """log-probability of each generated token under the distribution it was drawn from: the
    model's logits divided by the temperature, then cut by top-k and top-p (``processed_logits``);
    a greedy sample's are the model's own (temperature 1, nothing cut)"""
    finished: bool


def processed_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The logits of the distribution a token is drawn from, ``[..., V]``: divided by the
    temperature, then top-k, then top-p (nucleus) — Hugging Face's order and tie rules, and
    vLLM's ``processed_logprobs`` — with what is cut set to -inf. Its log-softmax is what an
    engine records for the token it drew, so an importance ratio against it is a true one (a
    ``top_k=1`` sample's log-probs are all 0). Greedy decoding keeps the model's logits."""
    if params.greedy:
        return logits
    if params.temperature != 1.0:  # untouched at 1: the same bits as an unscaled forward
        logits = logits / params.temperature
    if params.top_k > 0:
        kth_largest = logits.topk(min(params.top_k, logits.shape[-1]), -1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if params.top_p < 1.0:
        # cut the least likely tokens while the mass they hold together stays within 1 - top_p;
        # the most likely token always stays
        ascending, order = logits.sort(-1)
        mass_up_to = ascending.softmax(-1).cumsum(-1)
        cut = mass_up_to <= 1 - params.top_p
        cut[..., -1] = False
        logits = logits.masked_fill(cut.scatter(-1, order, cut), float("-inf"))
    return logits


def drawn_logprobs(processed: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(token) under ``processed_logits``: ``[...]`` for ``tokens`` ``[...]``."""
    return processed.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - processed.logsumexp(-1)


# Up to this many tokens, a row is drawn by an exponential race; above, by its inverse CDF.
RACE_MAX_VOCABULARY = 4096


def draw(processed: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row from the distribution ``processed_logits`` gives (cut tokens at -inf).

    A small vocabulary (the built-in models') runs a race: the argmax of p / Exp(1) noise, one
    random number per token, cheaper than ``torch.multinomial``. A large one is drawn by its
    inverse CDF with one random number per row: CPU exponentials cost ~13 ms a step for 16
    rows of SmolLM2's 49,152 tokens, the cumulative sum ~1 ms. Both are exact draws from p;
    they use the random stream differently, so the built-in models' seeded runs keep theirs."""
    probs = processed.softmax(-1)
    if probs.shape[-1] <= RACE_MAX_VOCABULARY:
        return (probs / torch.empty_like(probs).exponential_(generator=generator)).argmax(-1)
    cdf = probs.double().cumsum(-1)  # float64: no token's share is lost to rounding
    below = cdf[..., -1:] * torch.rand(cdf.shape[:-1] + (1,), generator=generator, dtype=cdf.dtype,
                                       device=cdf.device)
    # the first token whose cumulative mass passes the draw: a cut token (mass 0) never does
    token = torch.searchsorted(cdf, below, right=True).squeeze(-1)
    past_the_end = token == cdf.shape[-1]
    if bool(past_the_end.any()):  # the product rounded up to the total itself (odds ~2^-53)
        token = torch.where(past_the_end, probs.argmax(-1), token)
    return token


def decode(logits: torch.Tensor, next_logits, params: SamplingParams, pad_id: int, eos_id: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """An engine's decoding loop: from the last prompt position's ``logits`` ``[B, V]``, draw a
    token per row (or take the argmax), record its log-prob under the distribution it was drawn
    from, and ask ``next_logits(token [B], t)`` for the next position's, until every row has
    ended (EOS or a stop id; an ended row gets padding) or ``max_new_tokens``. Returns the
    tokens and their log-probs, ``[B, max_new_tokens]`` each, on the logits' device."""
    batch, device = logits.shape[0], logits.device
    generated = torch.full((batch, params.max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((batch, params.max_new_tokens), device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    ends = torch.tensor(sorted({eos_id, *params.stop_ids}), device=device)
    for t in range(params.max_new_tokens):
        processed = processed_logits(logits, params)  # what is drawn from is what is recorded
        token = processed.argmax(-1) if params.greedy else draw(processed)
        token = torch.where(done, pad_id, token)
        generated[:, t] = token
        logprobs[:, t] = drawn_logprobs(processed, token)
        done |= torch.isin(token, ends)
        if t == params.max_new_tokens - 1 or bool(done.all()):
            break
        logits = next_logits(token, t)
    return generated, logprobs


class InferenceEngine(Protocol):
    version: int

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Sample]]: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None: ...


class BatchedEngine:
    """Flattens prompts x n into batches of at most ``batch_size`` rows; subclasses sample a
    batch of left-padded prompts in ``_generate_batch``."""

    def __init__(self, model, tokenizer, batch_size: int = 256):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id
        self.version = 0
        self.position_limit = learned_position_limit(model)

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy the tensors the engine's model does not already share (in-process engines
        usually share all of them), and sample as ``version`` from now on."""
        own = dict(self.model.named_parameters())
        for name, tensor in named_tensors:
            if own[name].data_ptr() != tensor.data_ptr():
                own[name].copy_(tensor)
        self.version = version

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Sample]]:
        check_samples_asked(n)
        check_positions(prompts, params, self.position_limit)
        flat = [p for p in prompts for _ in range(n)]
        samples: list[Sample] = []
        was_training = self.model.training
        self.model.eval()
        for begin in range(0, len(flat), self.batch_size):
            samples += self._generate_batch(flat[begin:begin + self.batch_size], params)
        self.model.train(was_training)
        return [samples[i * n:(i + 1) * n] for i in range(len(prompts))]

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[Sample]:
        raise NotImplementedError

    def _samples(self, prompts: list[list[int]], new_tokens: torch.Tensor, logprobs: torch.Tensor,
                 stop_ids: tuple[int, ...] = ()) -> list[Sample]:
        """Cut each row after its end-of-sequence (or other stop) token."""
        ends = {self.eos_id, *stop_ids}
        samples = []
        for i, p in enumerate(prompts):
            tokens = new_tokens[i].tolist()
            end = next((j for j, t in enumerate(tokens) if t in ends), None)
            finished = end is not None
            length = end + 1 if finished else len(tokens)
            samples.append(Sample(p, tokens[:length], logprobs[i, :length].tolist(), finished))
        return samples
