"""Sampling for ``omnigym serve``: the base weights, or a training run's saved sampler weights.

On a Llama-family base (what ``inference/kv.py`` runs) every request goes to one decoding
thread that batches all the requests waiting or in flight, across sampling clients and across
adapters, one forward per token (``serve/multilora.py``: the base matrix products shared, each
request's LoRA delta, attention, seed and settings its own), with a prefix cache per sampling
session. A request joins the batch at the next token and leaves it when it is done.

Other models take the path below, one request at a time:

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
import queue
import threading
from collections import OrderedDict
from pathlib import Path

import torch

from omnigym.inference import make_engine
from omnigym.inference.engine import SamplingParams
from omnigym.models.tokens import gathered_logprobs
from omnigym.serve.contract import RequestError, SampledSequence, SampleParams, SampleResult
from omnigym.serve.multilora import Job, LoRADeltas, MultiLoRAEngine, PrefixCache, can_batch

ADAPTERS_KEPT = 64
"""saved adapters held unmerged for the batched path (a few LoRA tensors each, not a model)"""
GREEDY_BELOW = 1e-5
"""temperatures under this sample as temperature 0 does (greedy), as vLLM's do: float32 logits
divided by one under ~1e-37 overflow, and every sample was token 0 with NaN log-probs"""


def shared_view(model):
    """A module tree like ``model`` whose parameters *are* ``model``'s (buffers are copied)."""
    return copy.deepcopy(model, memo={id(p): p for p in model.parameters()})


class SamplerPool:
    def __init__(self, base, tokenizer, engine: str = "auto", keep: int = 2, prefix_cache_bytes: int = 256 * 2**20,
                 max_rows: int = 256):
        self.base, self.tokenizer, self.engine, self.keep = shared_view(base), tokenizer, engine, keep
        self._merged: OrderedDict[tuple[str, str], torch.nn.Module] = OrderedDict()
        # seeds for requests that give none: every sample runs under a seed of its own (the
        # process's global RNG is put back after), so unseeded calls still differ from each other
        self._seeds = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        self._lock = threading.Lock()  # requests come from several threads; the worker forgets
        self.global_rng = threading.Lock()
        """held while the one-at-a-time path samples, seeding torch's process-wide RNG (Hugging
        Face's generate draws from it), and by whatever else seeds that RNG on another thread
        (a new run's LoRA init on the worker thread): neither may draw from the other's stream"""
        self.batched = engine in ("auto", "kv") and can_batch(self.base)
        self.max_rows = max_rows
        self.cache = PrefixCache(prefix_cache_bytes) if self.batched else None
        self.batcher = None
        if self.batched:
            eos = tokenizer.eos_token_id
            self.batcher = MultiLoRAEngine(self.base, tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                                           else eos, eos, self.cache)
        self._adapters: OrderedDict[tuple[str, str], LoRADeltas] = OrderedDict()
        self._versions: dict[tuple[str, str], int] = {}
        """bumped when weights are written again: prefix-cache keys of the old weights never match"""
        self._inbox: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def forget(self, model_id: str, name: str | None = None) -> None:
        """Drop cached merges, adapters and prefixes of ``model_id`` (its sampler weights
        ``name`` were written again, or the run was dropped)."""
        def hit(key):
            return key[0] == model_id and (name is None or key[1] == (name or ""))

        with self._lock:
            for key in [k for k in self._merged if hit(k)]:
                del self._merged[key]
            for key in [k for k in self._adapters if hit(k)]:
                del self._adapters[key]
            for key in list(self._versions):
                if hit(key):
                    self._versions[key] += 1
            if name is not None:
                self._versions.setdefault((model_id, name), 1)
        if self.cache is not None:
            self.cache.forget(lambda key: hit(key[1:3]))

    def stop(self) -> None:
        if self._thread is not None:
            self._inbox.put(None)
            self._thread.join(timeout=60)
            self._thread = None

    # -- the batched path ------------------------------------------------------------------------

    def _deltas(self, model_id: str, name: str | None, load, version: int | None = None) -> LoRADeltas:
        """``load()``'s adapter, kept for the next request unless the weights were written again
        since ``version`` (default: now) was read: a save on the worker thread can land while
        this thread reads the files, and what it read then must not outlive that request."""
        key = (model_id, name or "")
        with self._lock:
            if version is None:
                version = self._versions.get(key, 0)
            if key in self._adapters:
                self._adapters.move_to_end(key)
                return self._adapters[key]
        tensors, scaling = load()
        deltas = self.batcher.deltas(tensors, scaling)
        with self._lock:
            if self._versions.get(key, 0) != version:
                return deltas
            self._adapters[key] = deltas
            while len(self._adapters) > ADAPTERS_KEPT:
                self._adapters.popitem(last=False)
        return deltas

    def _seed(self, params: SampleParams) -> int:
        if params.seed is not None:
            return int(params.seed)
        with self._lock:
            return int(torch.randint(2**62, (), generator=self._seeds))

    def sample_from(self, model_id: str | None, name: str | None, load, prompt: list[int], n: int,
                    params: SampleParams, session: str | None = None) -> SampleResult:
        """``n`` samples of ``prompt`` from the base (``model_id`` None) or from ``load()``'s
        adapter; blocks this thread until they are drawn (other threads' requests join the same
        batch meanwhile). ``session`` keys the prefix cache (None: not cached)."""
        if not self.batched:  # one at a time: this path seeds the process's global RNG
            with self.global_rng:
                return self.sample(self.model_for(model_id, name, load), prompt, n, params)
        # the version before the files are read: prefixes computed with weights that a save
        # replaced meanwhile go under the old version, which no later request asks for
        with self._lock:
            version = self._versions.get((model_id, name or ""), 0)
        lora = None if model_id is None else self._deltas(model_id, name, load, version)
        key = None if session is None else (session, model_id, name or "", version)
        job = Job(list(prompt), n, self._settings(params), self._seed(params), lora, key, bool(params.prompt_logprobs))
        self._submit(job)
        rows = self._rows(job, job.done.result())
        sequences = [self._cut(tokens, logprobs, finished, params) for tokens, logprobs, finished in rows]
        return SampleResult(sequences, job.prompt_scores)

    def _submit(self, job: Job) -> None:
        self._start()
        self._inbox.put(job)

    def _start(self) -> None:
        """The decoding thread, started on the first request."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="omnigym-serve-sampler", daemon=True)
                self._thread.start()

    def _rows(self, job: Job, _) -> list[tuple[list[int], list[float], bool]]:
        """Each row cut after its end-of-sequence or stop token, as the engines cut them."""
        ends = {self.batcher.eos_id, *job.params.stop_ids}
        out = []
        tokens, logprobs = job.tokens[:, :job.step].tolist(), job.logprobs[:, :job.step].tolist()
        for row, scores in zip(tokens, logprobs):
            end = next((j for j, t in enumerate(row) if t in ends), None)
            length = len(row) if end is None else end + 1
            out.append((row[:length], scores[:length], end is not None))
        return out

    def _loop(self) -> None:
        """The decoding thread: admit what waits (as many rows as fit), one token for all, repeat."""
        active: list[Job] = []
        waiting: list[Job] = []
        while True:
            try:
                while True:
                    job = self._inbox.get() if not active and not waiting else self._inbox.get_nowait()
                    if job is None:
                        return
                    waiting.append(job)
            except queue.Empty:
                pass
            rows = sum(j.n for j in active)
            while waiting and (not active or rows + waiting[0].n <= self.max_rows):
                job = waiting.pop(0)
                if job.done.set_running_or_notify_cancel():
                    try:
                        self.batcher.prefill(job)
                    except Exception as exc:  # this request's fault or not, it fails alone
                        job.done.set_exception(exc)
                        continue
                    active.append(job)
                    rows += job.n
            active = self._done_or_left(active)
            if not active:
                continue
            try:
                self.batcher.decode(active)
            except Exception as exc:  # a failed forward fails the requests that were in it
                for job in active:
                    job.done.set_exception(exc)
                active = []
                continue
            active = self._done_or_left(active)

    def _done_or_left(self, active: list[Job]) -> list[Job]:
        left = []
        for job in active:
            if job.over:
                self.batcher.finish(job)
                job.done.set_result(None)
            else:
                left.append(job)
        return left

    # -- one request at a time (models the batched path does not run) ------------------------------

    @staticmethod
    def _settings(params: SampleParams) -> SamplingParams:
        return SamplingParams(max_new_tokens=params.max_tokens, temperature=params.temperature or 1.0,
                              top_p=params.top_p, top_k=max(params.top_k, 0), greedy=params.temperature < GREEDY_BELOW,
                              stop_ids=tuple(params.stop_tokens))

    def model_for(self, model_id: str | None, name: str | None, load) -> torch.nn.Module:
        """The plain model to sample from: the base, or the base with ``load()``'s adapter merged."""
        if model_id is None:
            return self.base
        key = (model_id, name or "")
        with self._lock:
            version = self._versions.get(key, 0)
            if key in self._merged:
                self._merged.move_to_end(key)
                return self._merged[key]
        merged = self._merge(*load())
        with self._lock:
            if self._versions.get(key, 0) != version:  # saved again while read: not kept (see _deltas)
                return merged
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
        settings = self._settings(params)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self._seed(params))
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
