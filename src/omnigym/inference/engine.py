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

from dataclasses import dataclass
from typing import Iterable, Protocol

import torch


@dataclass
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    stop_ids: tuple[int, ...] = ()
    """token ids that end a sample as the end-of-sequence token does (kept in the sample)"""


@dataclass
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    """generated tokens, up to and including the end-of-sequence token if one was made"""
    logprobs: list[float]
    """log-probability of each generated token under the sampling distribution"""
    finished: bool


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
