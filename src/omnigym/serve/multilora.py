"""Batched multi-LoRA sampling for ``omnigym serve``: the sampling requests of many clients, over
the base model or over different runs' saved adapters, decoded together, one forward per token.

Multi-adapter servers (S-LoRA, Punica, vLLM's LoRA) do the same: every linear layer's base
matrix product runs once over the rows of all requests, and each request's rows get their own
adapter's low-rank delta, ``x @ A.T @ (alpha / r * B).T``, computed on their slice alone. The
adapter is never merged into a copy of the weights, so a new checkpoint costs its few LoRA
tensors, not a model.

What stays each request's own, so that what one client sends never reaches another's result:

- its rows' attention, over its own KV cache (one prompt sampled ``n`` times: no padding, and
  no other request's keys are ever in the same attention call);
- its adapter's deltas, computed on its rows only;
- its seed: a ``torch.Generator`` of its own draws its noise, ``[n, vocab]`` per token, as it
  would alone, whatever else runs beside it;
- its sampling settings (temperature, top-k, top-p, stop tokens, ``max_tokens``).

Only the base matrix products see other requests' rows, and a row of a matrix product does not
depend on the other rows' values; whether the BLAS kernel rounds a row the same way for a
different number of rows is the kernel's choice. On the CPU (MKL sgemm) a row comes out bit for
bit the same for any row count from some threshold up, and below it takes another kernel that
rounds differently. The threshold is the machine's and the shape's: 4 rows on an AMD Zen 3 for the
tiny model; on an Intel Xeon with AVX-512, 5 rows for an input width of 96, 6 for 128, 11 for 256,
16 from 512 (measured). So each weight's threshold is measured once, by the first product with it
(``rows_from``: a probe of row counts against a larger batch), and a product of fewer rows is
padded to it (``_product``); each request's tokens and log-probs are then bit-identical to it run
alone (``tests/test_serve_batching.py``). A weight whose rows still differ at ``PROBE_ROWS`` is
padded to that and is exact only as far as the probe saw. On a GPU, cuBLAS picks its algorithm by
shape too: there expect the same tokens at a fixed seed and log-probs equal to float rounding.

The prefix cache (``PrefixCache``) keeps the keys and values of what a sampling session
prefilled (the prompt, and for a one-sample request the prompt with its completion), bounded
in bytes and evicted least recently used first; a multi-turn conversation's next call prefills
only the tokens after the longest cached prefix. Entries are keyed by session and weights, and
dropped when those weights are saved again.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from omnigym.inference.engine import SamplingParams, draw, drawn_logprobs, processed_logits
from omnigym.inference.kv import unsupported_reason
from omnigym.inference.llama_stack import Dimensions, decoder_stack, fused_layers, rotary_tables
from omnigym.serve.contract import RequestError

_ADAPTED = re.compile(r"model\.layers\.(\d+)\.(?:self_attn|mlp)\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|"
                      r"down_proj)\.lora_A")
_HEAD = "lm_head"
PROBE_ROWS = 64
"""the largest row count a weight's threshold is probed up to (see the module's docstring)"""
_THRESHOLDS: dict[tuple, int] = {}
_THRESHOLDS_LOCK = threading.Lock()


def rows_from(weight: torch.Tensor, with_bias: bool) -> int:
    """The fewest rows from which ``F.linear`` with ``weight`` rounds every row as it does in a
    batch of ``2 x PROBE_ROWS`` rows: measured on random rows the first time a shape is seen
    (the kernel is chosen by shape, dtype and device, not by the values)."""
    key = (tuple(weight.shape), weight.dtype, weight.device.type, with_bias)
    with _THRESHOLDS_LOCK:
        if key not in _THRESHOLDS:
            generator = torch.Generator().manual_seed(0)
            x = torch.randn(2 * PROBE_ROWS, weight.shape[1], generator=generator).to(weight)
            bias = torch.randn(weight.shape[0], generator=generator).to(weight) if with_bias else None
            with torch.no_grad():
                full = F.linear(x, weight, bias)
                differ = [rows for rows in range(1, PROBE_ROWS + 1)
                          if not torch.equal(F.linear(x[:rows], weight, bias), full[:rows])]
            _THRESHOLDS[key] = min(max(differ, default=0) + 1, PROBE_ROWS)
        return _THRESHOLDS[key]


def can_batch(model) -> bool:
    """Whether ``MultiLoRAEngine`` runs this model (a plain Llama-family causal LM)."""
    return unsupported_reason(model) is None


class LoRADeltas:
    """One saved adapter as per-layer ``(A, scaled B)`` pairs, checked against the base."""

    def __init__(self, tensors: dict[str, torch.Tensor], scaling: float, shapes: dict[tuple, tuple], device, dtype):
        self.pairs: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        for key, a in tensors.items():
            if not key.endswith(".lora_A"):
                continue
            path = key[:-len(".lora_A")]
            b = tensors.get(path + ".lora_B")
            match = _ADAPTED.fullmatch(key)
            where = (_HEAD,) if path == _HEAD else (int(match.group(1)), match.group(2)) if match else None
            if b is None or where not in shapes or shapes[where] != (b.shape[0], a.shape[1]) or a.shape[0] != b.shape[1]:
                raise RequestError(f"the saved sampler weights do not fit this base model (at {path})")
            self.pairs[where] = (a.to(device, dtype), (scaling * b).to(device, dtype))
        self.nbytes = sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.pairs.values())
        self.fused: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        """(layer, fused product) -> one (A, B) pair for all its projections: the A's stacked,
        the B's placed block-diagonally at their output columns (2 products a layer's q|k|v
        instead of 6; the zeros add nothing)"""

    def fuse(self, splits: dict, layers: int) -> "LoRADeltas":
        for layer in range(layers):
            for kind, parts in splits.items():
                found = [(self.pairs[(layer, name)], offset) for name, offset, _ in parts if (layer, name) in self.pairs]
                if not found:
                    continue
                width = parts[-1][1] + (parts[-1][2] or found[-1][0][1].shape[0])
                a = torch.cat([pair[0] for pair, _ in found])
                b = a.new_zeros(width, a.shape[0])
                rank = 0
                for (pa, pb), offset in found:
                    b[offset:offset + pb.shape[0], rank:rank + pa.shape[0]] = pb
                    rank += pa.shape[0]
                self.fused[(layer, kind)] = (a, b)
        return self


@dataclass
class Job:
    """One sampling request: ``n`` samples of ``prompt`` through ``lora`` (None: the base)."""
    prompt: list[int]
    n: int
    params: SamplingParams
    seed: int
    lora: LoRADeltas | None = None
    cache_key: tuple | None = None
    """the prefix cache's key (session and weights); None: not cached"""
    prompt_logprobs: bool = False
    done: Future = field(default_factory=Future)
    # decoding state, set by prefill
    generator: torch.Generator | None = None
    keys: list = field(default_factory=list)
    values: list = field(default_factory=list)
    position: int = 0
    step: int = 0
    logits: torch.Tensor | None = None
    tokens: torch.Tensor | None = None
    logprobs: torch.Tensor | None = None
    finished: torch.Tensor | None = None
    prompt_scores: list | None = None

    @property
    def over(self) -> bool:
        return self.step >= self.params.max_new_tokens or bool(self.finished.all())


class PrefixCache:
    """Keys and values of prefilled token prefixes, per (session, weights) key, at most
    ``max_bytes`` in all, least recently used evicted first."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[tuple, tuple[list, list, int]] = OrderedDict()
        self._lock = threading.Lock()

    def longest(self, key: tuple, prompt: list[int]) -> tuple[int, list, list]:
        """The longest cached prefix of ``prompt`` that leaves at least one token to prefill:
        its length and its per-layer keys and values ``[kv_heads, length, head_dim]``."""
        best, found = 0, None
        with self._lock:
            for entry_key, entry in self._entries.items():
                (k, tokens) = entry_key
                if k != key:
                    continue
                usable = min(len(tokens), len(prompt) - 1)
                if usable > best and list(tokens[:usable]) == prompt[:usable]:
                    best, found = usable, entry_key
            if found is None:
                return 0, [], []
            self._entries.move_to_end(found)
            keys, values, _ = self._entries[found]
        return best, [k[:, :best] for k in keys], [v[:, :best] for v in values]

    def put(self, key: tuple, tokens: list[int], keys: list, values: list) -> None:
        nbytes = sum(t.numel() * t.element_size() for t in keys + values)
        if nbytes > self.max_bytes or not tokens:
            return
        tokens = tuple(tokens)
        with self._lock:
            # an entry that is a prefix of this one is covered by it
            for old in [e for e in self._entries if e[0] == key and e[1] == tokens[:len(e[1])]]:
                self.bytes -= self._entries.pop(old)[2]
            self._entries[(key, tokens)] = (keys, values, nbytes)
            self.bytes += nbytes
            while self.bytes > self.max_bytes:
                self.bytes -= self._entries.popitem(last=False)[1][2]

    def forget(self, match) -> None:
        """Drop the entries whose key ``match(key)`` accepts (their weights changed)."""
        with self._lock:
            for old in [e for e in self._entries if match(e[0])]:
                self.bytes -= self._entries.pop(old)[2]

    def __len__(self) -> int:
        return len(self._entries)


class MultiLoRAEngine:
    """The decoding arithmetic of ``inference/kv.py``'s Llama-family sampler, for many
    requests at once, each with its own adapter, cache, seed and settings."""

    def __init__(self, model, pad_id: int, eos_id: int, prefix_cache: PrefixCache | None = None):
        self.model, self.pad_id, self.eos_id = model, pad_id, eos_id
        self.cache = prefix_cache
        config = model.config
        self.dims = Dimensions.of(config)
        self.heads, self.kv_heads, self.head_dim, self.eps = (self.dims.heads, self.dims.kv_heads, self.dims.head_dim,
                                                              self.dims.eps)
        self.prefilled_tokens = 0
        """prompt tokens run through the model (not those taken from the prefix cache)"""
        self.largest_batch = 0
        """the most rows decoded in one forward so far"""
        backbone = model.model
        self.device, self.dtype = backbone.embed_tokens.weight.device, backbone.embed_tokens.weight.dtype
        with torch.no_grad():
            self.layers = fused_layers(model)
            self.cos, self.sin = rotary_tables(backbone, int(getattr(config, "max_position_embeddings", 0) or 4096))
        inner = backbone.layers[0].mlp.gate_proj.weight.shape[0]
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        # where each projection's output sits in the fused products (None: the whole output)
        self.splits = {"qkv": (("q_proj", 0, q), ("k_proj", q, kv), ("v_proj", q + kv, kv)),
                       "out": (("o_proj", 0, None),), "gate_up": (("gate_proj", 0, inner), ("up_proj", inner, inner)),
                       "down": (("down_proj", 0, None),)}

    def deltas(self, tensors: dict[str, torch.Tensor], scaling: float) -> LoRADeltas:
        """A saved adapter's tensors, checked against this base and fused as its products are."""
        return LoRADeltas(tensors, scaling, self.shapes(), self.device, self.dtype).fuse(self.splits, len(self.layers))

    def shapes(self) -> dict[tuple, tuple]:
        """(layer, projection) -> its weight's shape, and the head's: what an adapter must fit."""
        out = {(_HEAD,): tuple(self.model.lm_head.weight.shape)}
        for i, layer in enumerate(self.model.model.layers):
            for part in (layer.self_attn, layer.mlp):
                for name, module in part.named_children():
                    if name.endswith("_proj"):
                        out[(i, name)] = tuple(module.weight.shape)
        return out

    # -- the forward pass over segments of rows, each with its own adapter ------------------------

    @staticmethod
    def _product(x, weight, bias=None):
        """``F.linear`` with at least ``rows_from(weight)`` rows (zeros added, then cut off): the
        kernel that rounds each row as it does in any larger batch."""
        rows, least = x.shape[:-1].numel(), rows_from(weight, bias is not None)
        if rows >= least:
            return F.linear(x, weight, bias)
        flat = torch.cat([x.reshape(rows, x.shape[-1]), x.new_zeros(least - rows, x.shape[-1])])
        return F.linear(flat, weight, bias)[:rows].reshape(*x.shape[:-1], weight.shape[0])

    def _linear(self, x, weight, bias, segments, layer: int, kind: str):
        y = self._product(x, weight, bias)
        for start, end, lora in segments:
            if lora is None:
                continue
            pair = lora.fused.get((layer, kind))
            if pair is not None:
                y[start:end] += F.linear(F.linear(x[start:end], pair[0]), pair[1])
        return y

    def _stack(self, ids, positions, segments, attend) -> torch.Tensor:
        """The hidden states after the last layer, ``[rows, width, hidden]``; ``attend(layer, q,
        k, v)`` writes the keys and values into each request's cache and returns its attention."""
        def linear(x, weight, bias, layer: int, kind: str):
            return self._linear(x, weight, bias, segments, layer, kind)

        return decoder_stack(self.model.model.embed_tokens(ids), self.layers, self.cos[positions], self.sin[positions],
                             self.dims, attend, linear)

    def _head(self, x, segments) -> torch.Tensor:
        x = F.rms_norm(x, (x.shape[-1],), self.model.model.norm.weight, self.eps)
        head = self.model.lm_head
        logits = self._product(x, head.weight, head.bias)
        for start, end, lora in segments:
            pair = lora.pairs.get((_HEAD,)) if lora is not None else None
            if pair is not None:
                logits[start:end] += F.linear(F.linear(x[start:end], pair[0]), pair[1])
        return logits.float()

    # -- one request's prompt ----------------------------------------------------------------------

    @torch.no_grad()
    def prefill(self, job: Job) -> None:
        """Run the prompt (after its longest cached prefix) and set up the job's caches, one
        copy per sample, and its first logits."""
        prompt, params = job.prompt, job.params
        cached, cached_k, cached_v = 0, [], []
        if self.cache is not None and job.cache_key is not None and not job.prompt_logprobs:
            cached, cached_k, cached_v = self.cache.longest(job.cache_key, prompt)
        total = len(prompt) + params.max_new_tokens
        shape = (1, self.kv_heads, total, self.head_dim)
        keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        values = [torch.zeros_like(k) for k in keys]
        for i in range(len(self.layers)) if cached else ():
            keys[i][0, :, :cached], values[i][0, :, :cached] = cached_k[i], cached_v[i]
        new = torch.tensor([prompt[cached:]], device=self.device)
        end = len(prompt)
        queries = torch.arange(cached, end, device=self.device)
        mask = torch.arange(end, device=self.device)[None] <= queries[:, None]  # causal, over cache and new

        def attend(i, q, k, v):
            keys[i][:, :, cached:end], values[i][:, :, cached:end] = k, v
            return F.scaled_dot_product_attention(q, keys[i][:, :, :end], values[i][:, :, :end], attn_mask=mask,
                                                  enable_gqa=self.heads != self.kv_heads)

        segments = [(0, 1, job.lora)]
        x = self._stack(new, queries[None], segments, attend)
        self.prefilled_tokens += end - cached
        if job.prompt_logprobs:
            logits = self._head(x, segments)[0]
            picked = drawn_logprobs(logits[:-1], torch.tensor(prompt[1:], device=self.device))
            job.prompt_scores = [None] + picked.tolist()
            last = logits[-1:]
        else:
            last = self._head(x[:, -1:], segments)[:, 0]
        if self.cache is not None and job.cache_key is not None:
            self.cache.put(job.cache_key, prompt, [k[0, :, :end].clone() for k in keys],
                           [v[0, :, :end].clone() for v in values])
        job.keys = [k.expand(job.n, -1, -1, -1).clone() for k in keys]
        job.values = [v.expand(job.n, -1, -1, -1).clone() for v in values]
        job.logits = last.expand(job.n, -1)
        job.position = end
        job.generator = torch.Generator(device=self.device).manual_seed(job.seed)
        job.tokens = torch.full((job.n, params.max_new_tokens), self.pad_id, dtype=torch.long, device=self.device)
        job.logprobs = torch.zeros((job.n, params.max_new_tokens), device=self.device)
        job.finished = torch.zeros(job.n, dtype=torch.bool, device=self.device)
        self._draw(job)

    def _draw(self, job: Job) -> None:
        """The job's next token per row, from its logits, with its own settings and generator."""
        params, t = job.params, job.step
        processed = processed_logits(job.logits, params)
        token = processed.argmax(-1) if params.greedy else draw(processed, job.generator)
        token = torch.where(job.finished, self.pad_id, token)
        job.tokens[:, t] = token
        job.logprobs[:, t] = drawn_logprobs(processed, token)
        ends = torch.tensor(sorted({self.eos_id, *params.stop_ids}), device=self.device)
        job.finished |= torch.isin(token, ends)
        job.step = t + 1

    # -- many requests, one token each -------------------------------------------------------------

    @torch.no_grad()
    def decode(self, jobs: list[Job]) -> None:
        """One token more for every row of every job, in one forward (jobs not ``over``)."""
        segments, start = [], 0
        for job in jobs:
            segments.append((start, start + job.n, job.lora))
            start += job.n
        self.largest_batch = max(self.largest_batch, start)
        ids = torch.cat([job.tokens[:, job.step - 1:job.step] for job in jobs])
        positions = torch.cat([torch.full((job.n, 1), job.position, device=self.device) for job in jobs])

        def attend(i, q, k, v):
            out = []
            for (s, e, _), job in zip(segments, jobs):
                p = job.position
                job.keys[i][:, :, p:p + 1], job.values[i][:, :, p:p + 1] = k[s:e], v[s:e]
                out.append(F.scaled_dot_product_attention(q[s:e], job.keys[i][:, :, :p + 1],
                                                          job.values[i][:, :, :p + 1],
                                                          enable_gqa=self.heads != self.kv_heads))
            return torch.cat(out)

        logits = self._head(self._stack(ids, positions, segments, attend)[:, -1], segments)
        for (s, e, _), job in zip(segments, jobs):
            job.position += 1
            job.logits = logits[s:e]
            self._draw(job)

    def finish(self, job: Job) -> None:
        """Keep a one-sample request's prompt and completion in the prefix cache (the next turn of
        a conversation starts with them)."""
        if self.cache is None or job.cache_key is None or job.n != 1 or job.step < 2:
            return
        fed = job.position  # positions whose keys and values were computed
        tokens = job.prompt + job.tokens[0, :fed - len(job.prompt)].tolist()
        self.cache.put(job.cache_key, tokens, [k[0, :, :fed].clone() for k in job.keys],
                       [v[0, :, :fed].clone() for v in job.values])

    def run_alone(self, job: Job) -> Job:
        """Prefill and decode ``job`` by itself (what a batch must equal, row for row)."""
        self.prefill(job)
        while not job.over:
            self.decode([job])
        self.finish(job)
        return job
