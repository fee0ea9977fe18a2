"""Sampling for ``omnigym serve``: the base weights, or a training run's saved sampler weights
merged into them, through omnigym's inference engines.

The KV engine (``inference/kv.py``) is the fast CPU sampler but runs plain Hugging Face models
only, not peft-wrapped ones; so sampling does not use the training model at all. At start the
pool takes a *view* of the base model: its own module tree sharing every weight tensor with the
base (no copy of the weights). A saved adapter is merged into a second such view in which only
the adapted weight matrices are new tensors (``W + alpha / r * B @ A``); the last few merged
views are kept, since a sampling client samples from the same weights many times in a row.
"""

from __future__ import annotations

import copy
import os
from collections import OrderedDict
from pathlib import Path

import torch

from omnigym.inference import make_engine
from omnigym.inference.engine import SamplingParams
from omnigym.models.tokens import gathered_logprobs
from omnigym.serve.contract import RequestError, SampledSequence, SampleParams, SampleResult


def shared_view(model):
    """A module tree like ``model`` whose parameters *are* ``model``'s (buffers are copied)."""
    return copy.deepcopy(model, memo={id(p): p for p in model.parameters()})


class SamplerPool:
    def __init__(self, base, tokenizer, engine: str = "auto", keep: int = 2):
        self.base, self.tokenizer, self.engine, self.keep = shared_view(base), tokenizer, engine, keep
        self._merged: OrderedDict[tuple[str, str], torch.nn.Module] = OrderedDict()
        # seeds for requests that give none: every sample runs under a seed of its own (the
        # process's global RNG is put back after), so unseeded calls still differ from each other
        self._seeds = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)

    def forget(self, model_id: str, name: str | None = None) -> None:
        """Drop cached merges of ``model_id`` (its sampler weights ``name`` were written again,
        or the run was dropped)."""
        for key in [k for k in self._merged if k[0] == model_id and (name is None or k[1] == name)]:
            del self._merged[key]

    def model_for(self, model_id: str | None, name: str | None, load) -> torch.nn.Module:
        """The plain model to sample from: the base, or the base with ``load()``'s adapter merged."""
        if model_id is None:
            return self.base
        key = (model_id, name or "")
        if key in self._merged:
            self._merged.move_to_end(key)
            return self._merged[key]
        merged = self._merge(*load())
        self._merged[key] = merged
        while len(self._merged) > self.keep:
            self._merged.popitem(last=False)
        return merged

    @torch.no_grad()
    def _merge(self, tensors: dict[str, torch.Tensor], scaling: float):
        view = shared_view(self.base)
        for key, a in tensors.items():
            if not key.endswith(".lora_A"):
                continue
            path = key[:-len(".lora_A")]
            b = tensors.get(path + ".lora_B")
            try:
                module = view.get_submodule(path)
            except AttributeError:
                module = None
            weight = getattr(module, "weight", None)
            if b is None or weight is None or weight.shape != (b.shape[0], a.shape[1]):
                raise RequestError(f"the saved sampler weights do not fit this base model (at {path})")
            # a new Parameter (not an in-place add): the base's tensor stays as it is, and a tied
            # embedding is untied in this view only
            module.weight = torch.nn.Parameter(weight + scaling * (b.to(weight) @ a.to(weight)), requires_grad=False)
        return view

    def sample(self, model, prompt: list[int], n: int, params: SampleParams) -> SampleResult:
        engine = make_engine(model, self.tokenizer, self.engine)
        greedy = params.temperature == 0
        settings = SamplingParams(max_new_tokens=params.max_tokens, temperature=params.temperature or 1.0,
                                  top_p=params.top_p, top_k=max(params.top_k, 0), greedy=greedy,
                                  stop_ids=tuple(params.stop_tokens))
        with torch.random.fork_rng(devices=[]):
            seed = params.seed if params.seed is not None else \
                int(torch.randint(2**62, (), generator=self._seeds))
            torch.manual_seed(seed)
            samples = engine.generate([prompt], n, settings)[0]
        sequences = [self._cut(s.completion_ids, s.logprobs, s.finished, params) for s in samples]
        prompt_logprobs = self.prompt_logprobs(model, prompt) if params.prompt_logprobs else None
        return SampleResult(sequences, prompt_logprobs)

    def _cut(self, tokens: list[int], logprobs: list[float], finished: bool, params: SampleParams) -> SampledSequence:
        """End a completion at its first stop token or stop string and say why it ended (the
        engine stops at stop tokens itself but cuts no text); the stop token is kept, as
        Tinker's samplers keep it."""
        stops = set(params.stop_tokens)
        for i, token in enumerate(tokens):
            if token in stops:
                return SampledSequence(tokens[:i + 1], logprobs[:i + 1], "stop")
        if params.stop_strings and self._stops_in(tokens, params.stop_strings):
            # the shortest prefix whose text holds a stop string: a prefix's text grows with it, so
            # a binary search needs log2(len) decodes instead of one per token
            low, high = 1, len(tokens)
            while low < high:
                mid = (low + high) // 2
                low, high = (low, mid) if self._stops_in(tokens[:mid], params.stop_strings) else (mid + 1, high)
            return SampledSequence(tokens[:low], logprobs[:low], "stop")
        return SampledSequence(tokens, logprobs, "stop" if finished else "length")

    def _stops_in(self, tokens: list[int], stop_strings: list[str]) -> bool:
        text = self.tokenizer.decode(tokens)
        return any(stop in text for stop in stop_strings)

    @torch.no_grad()
    def prompt_logprobs(self, model, prompt: list[int]) -> list[float | None]:
        device = next(model.parameters()).device
        logits = model(torch.tensor([prompt], device=device)).logits[0].float()
        return [None] + gathered_logprobs(logits[:-1], torch.tensor(prompt[1:], device=device)[:, None])[:, 0].tolist()


def read_adapter(folder: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """The adapter tensors and settings saved in ``folder`` (``adapter.safetensors`` and
    ``adapter.json``)."""
    import json

    from safetensors.torch import load_file

    return load_file(str(folder / "adapter.safetensors")), json.loads((folder / "adapter.json").read_text())
