"""Generation engines: prompts in, ``n`` samples each, token ids and log-probs out.

``HFEngine`` uses Hugging Face ``generate`` (batched, left padding, KV cache) and runs any
causal LM on CPU or GPU; ``LlamaFamilyEngine`` (``kv_decode``) samples Llama-family models
with far less per-token overhead. A vLLM engine implements the same two methods;
algorithms only see this interface and get theirs from ``make_engine``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from omnigym.errors import OmnigymError


@dataclass
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False


@dataclass
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    """generated tokens, up to and including the end-of-sequence token if one was made"""
    logprobs: list[float]
    """log-probability of each generated token under the sampling distribution"""
    finished: bool


def left_pad(sequences, width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, width]`` token ids, right-aligned, and the mask of real tokens."""
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        if seq:
            ids[i, width - len(seq):] = torch.tensor(seq)
            mask[i, width - len(seq):] = 1
    return ids, mask


def distinct_rows(sequences) -> tuple[list[tuple[int, ...]], torch.Tensor]:
    """The distinct sequences, in first-seen order, and each input's index among them."""
    keys = [tuple(seq) for seq in sequences]
    distinct = list(dict.fromkeys(keys))
    index = {seq: i for i, seq in enumerate(distinct)}
    return distinct, torch.tensor([index[key] for key in keys], dtype=torch.long)


class GenerationEngine(Protocol):
    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Sample]]: ...

    def sync_weights(self, model) -> None: ...


class BatchedEngine:
    """Flattens prompts x n into batches of at most ``batch_size`` rows; subclasses sample a
    batch of left-padded prompts in ``_generate_batch``."""

    def __init__(self, model, tokenizer, batch_size: int = 256):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id

    def sync_weights(self, model) -> None:
        self.model = model  # same process, same weights

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

    def _samples(self, prompts: list[list[int]], new_tokens: torch.Tensor, logprobs: torch.Tensor) -> list[Sample]:
        """Cut each row after its end-of-sequence token."""
        samples = []
        for i, p in enumerate(prompts):
            tokens = new_tokens[i].tolist()
            finished = self.eos_id in tokens
            length = tokens.index(self.eos_id) + 1 if finished else len(tokens)
            samples.append(Sample(p, tokens[:length], logprobs[i, :length].tolist(), finished))
        return samples


class HFEngine(BatchedEngine):
    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[Sample]:
        device = next(self.model.parameters()).device
        width = max(map(len, prompts))
        input_ids, attention = left_pad(prompts, width, self.pad_id)
        sampling = {} if params.greedy else {"temperature": params.temperature, "top_p": params.top_p,
                                             "top_k": params.top_k}
        out = self.model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                                  max_new_tokens=params.max_new_tokens, eos_token_id=self.eos_id,
                                  pad_token_id=self.pad_id, use_cache=True, return_dict_in_generate=True,
                                  output_logits=True, do_sample=not params.greedy, **sampling)
        new_tokens = out.sequences[:, width:].cpu()
        temperature = 1.0 if params.greedy else params.temperature
        logits = torch.stack(out.logits, 1).float().cpu() / temperature
        logprobs = torch.log_softmax(logits, -1).gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        return self._samples(prompts, new_tokens, logprobs)


def make_engine(model, tokenizer, kind: str = "auto", batch_size: int = 256) -> BatchedEngine:
    """``hf``: Hugging Face ``generate``; ``kv``: the lean Llama-family sampler
    (``kv_decode``); ``auto``: ``kv`` where the model allows it, else ``hf``."""
    from omnigym.systems.kv_decode import LlamaFamilyEngine, unsupported_reason

    if kind not in ("auto", "hf", "kv"):
        raise OmnigymError(f"unknown engine {kind!r}; choose auto, hf or kv")
    if kind == "hf" or (kind == "auto" and unsupported_reason(model)):
        return HFEngine(model, tokenizer, batch_size)
    return LlamaFamilyEngine(model, tokenizer, batch_size)  # says why if it cannot run the model
