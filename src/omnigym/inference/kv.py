"""A lean sampler for Llama-family models (Llama, Mistral, Qwen2, Qwen3): a preallocated
KV cache and one plain forward per token, straight on the Hugging Face model's weights.

Small models on a CPU spend most of a decoding step in Python: ``generate`` walks the
module tree, builds masks, updates cache objects and runs logits processors, about 2.3 ms a
token for a 1M-parameter Llama whose matrix products take 0.3 ms. This loop does the same
arithmetic in a few dozen tensor ops. The weights are read from the live model at every
``generate`` call, so a policy trained in between is always the one sampled. Rotary
embeddings come from the model's own ``rotary_emb`` module, so every RoPE scaling variant
Hugging Face implements is covered. Anything else (LoRA-wrapped models, sliding windows,
other architectures) goes to ``HFEngine``: ``omnigym.inference.make_engine`` picks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from omnigym.backends import whole_weights
from omnigym.errors import OmnigymError
from omnigym.inference.engine import BatchedEngine, SamplingParams, decode
from omnigym.inference.llama_stack import Dimensions, decoder_stack, fused_layers, rotary_tables
from omnigym.models.precision import autocast_for, precision_of
from omnigym.models.tokens import distinct_rows, left_pad

FAMILY = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def unsupported_reason(model) -> str | None:
    """Why ``LlamaFamilyEngine`` cannot run ``model``, or None if it can."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in FAMILY:
        return f"model type {kind!r} is not one of {sorted(FAMILY)}"
    if not hasattr(model, "model") or not hasattr(model.model, "rotary_emb"):
        return "not a plain causal LM (wrapped, e.g. by peft)"
    if any(hasattr(p, "full_tensor") for p in model.parameters()):
        return "its weights are sharded (FSDP2): only the model's own forward gathers them"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    if getattr(config, "sliding_window", None) and (kind == "mistral" or getattr(config, "use_sliding_window", False)):
        return "sliding-window attention"
    if getattr(config, "attn_logit_softcapping", None) or getattr(config, "final_logit_softcapping", None):
        return "logit soft-capping"
    return None


class LlamaFamilyEngine(BatchedEngine):
    def __init__(self, model, tokenizer, batch_size: int = 256):
        reason = unsupported_reason(model)
        if reason:
            raise OmnigymError(f"--engine kv cannot run this model: {reason}; use --engine hf")
        super().__init__(model, tokenizer, batch_size)

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams):
        # DeepSpeed ZeRO-3 partitions the weights at rest: gathered for the batch; --precision bf16:
        # the products in bfloat16 as the trainer's forward computes them (models/precision.py)
        with whole_weights(self.model), autocast_for(self.model):
            return self._sample(prompts, params)

    def _sample(self, prompts: list[list[int]], params: SamplingParams):
        backbone = self.model.model
        device = backbone.embed_tokens.weight.device
        dims = Dimensions.of(self.model.config)
        kv_heads, head_dim = dims.kv_heads, dims.head_dim
        bf16 = precision_of(self.model) == "bf16"
        # fused once per call in bf16: autocast would cast these non-leaf tensors again at every token
        layers = fused_layers(self.model, torch.bfloat16 if bf16 else None)
        batch, width = len(prompts), max(map(len, prompts))
        total = width + params.max_new_tokens

        # A prompt sampled n times is read once: prefill the distinct prompts, then give each
        # row a copy of its prompt's cache.
        distinct, rows = distinct_rows(prompts)
        tokens, prompt_mask = left_pad(distinct, width, self.pad_id)
        valid = torch.zeros((len(distinct), total), dtype=torch.bool)  # keys a query may attend to
        valid[:, :width] = prompt_mask.bool()
        tokens, valid, rows = tokens.to(device), valid.to(device), rows.to(device)
        positions = (valid[:, :width].long().cumsum(-1) - 1).clamp(min=0)
        dtype = torch.bfloat16 if bf16 else backbone.embed_tokens.weight.dtype
        cache_k = [torch.zeros(len(distinct), kv_heads, total, head_dim, dtype=dtype, device=device)
                   for _ in layers]
        cache_v = [torch.zeros_like(c) for c in cache_k]
        shared = SharedPrompts(rows, valid[:, :width], kv_heads, (batch, kv_heads, params.max_new_tokens, head_dim),
                               len(layers), dtype) if reads_prompts_once(batch, len(distinct), width) else None
        # Prefill mask: causal and not padding; each query also sees itself, so that the
        # rows of left-padding positions stay finite (their outputs are never used).
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
        mask = (causal & valid[:, None, None, :width]) | torch.eye(width, dtype=torch.bool, device=device)

        cos_table, sin_table = rotary_tables(backbone, total)

        def forward(ids: torch.Tensor, start: int, pos: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
            end = start + ids.shape[1]

            def attend(i, q, k, v):
                if shared is not None and start >= width:  # a decoding step of rows that share their prompts
                    shared.keys[i][:, :, start - width], shared.values[i][:, :, start - width] = k[:, :, 0], v[:, :, 0]
                    return shared.attend(q, i, start - width + 1, cache_k[i][:, :, :width], cache_v[i][:, :, :width])
                cache_k[i][:, :, start:end], cache_v[i][:, :, start:end] = k, v
                return F.scaled_dot_product_attention(q, cache_k[i][:, :, :end], cache_v[i][:, :, :end],
                                                      attn_mask=attn_mask, enable_gqa=dims.heads != kv_heads)

            x = decoder_stack(backbone.embed_tokens(ids), layers, cos_table[pos], sin_table[pos], dims, attend)
            x = F.rms_norm(x[:, -1], (x.shape[-1],), backbone.norm.weight, dims.eps)
            return self.model.lm_head(x).float()

        logits = forward(tokens, 0, positions, mask)[rows]
        if shared is None:  # each row gets a copy of its prompt's cache, and decodes on after it
            for i in range(len(layers)):
                cache_k[i], cache_v[i] = cache_k[i][rows], cache_v[i][rows]
        valid, position = valid[rows], positions[rows, -1:]

        def next_logits(token, t):
            nonlocal position
            valid[:, width + t] = True
            position = position + 1
            return forward(token[:, None], width + t, position,
                           None if shared is not None else valid[:, None, None, :width + t + 1])

        generated, logprobs = decode(logits, next_logits, params, self.pad_id, self.eos_id)
        return self._samples(prompts, generated.cpu(), logprobs.cpu(), params.stop_ids)


# Below this many prompt tokens in a batch (rows x padded prompt width), decoding attends with one
# SDPA call over each row's own copy of its prompt's cache: the dozen smaller ops of SharedPrompts
# cost a small batch more than the copies they save (bench/grpo_vs_trl.py's 16 rows of 19 tokens).
SHARED_PROMPT_MIN_TOKENS = 4096


def reads_prompts_once(batch: int, distinct: int, width: int) -> bool:
    """Whether decoding reads each distinct prompt's keys and values once for all its rows
    (``SharedPrompts``) rather than one copy per row."""
    return distinct < batch and batch * width >= SHARED_PROMPT_MIN_TOKENS


class SharedPrompts:
    """Decoding attention for rows that sample the same prompts (GRPO's groups: 8 samples of each).
    One SDPA call over per-row copies of the prompt cache reads ``rows x prompt`` keys and values
    from memory at every token, and that memory traffic, not arithmetic, was 40% of the demo's
    sampling (128 rows of a 162-token prompt). Here each distinct prompt's keys are read once by
    a matrix product with all its rows' queries, each row's own generated keys separately, and
    one softmax runs over both parts: the same attention, rounded differently from SDPA's
    (the prefill and the first token are unchanged)."""

    def __init__(self, rows: torch.Tensor, prompt_mask: torch.Tensor, kv_heads: int, shape: tuple, layers: int,
                 dtype: torch.dtype):
        distinct = prompt_mask.shape[0]
        counts = torch.bincount(rows, minlength=distinct)
        self.distinct, self.group, self.kv_heads = distinct, int(counts.max()), kv_heads
        order = torch.argsort(rows, stable=True)
        rank = torch.empty_like(rows)
        rank[order] = torch.arange(len(rows), device=rows.device) - (counts.cumsum(0) - counts)[rows[order]]
        self.slot = rows * self.group + rank  # each row's place among its prompt's queries
        self.in_place = len(rows) == distinct * self.group and bool((self.slot == torch.arange(len(rows),
                                                                                              device=rows.device)).all())
        # the prompt's left padding is never attended to
        self.bias = torch.zeros(prompt_mask.shape, dtype=dtype, device=rows.device).masked_fill(
            ~prompt_mask, float("-inf"))[:, None, None]
        self.keys = [torch.zeros(shape, dtype=dtype, device=rows.device) for _ in range(layers)]
        self.values = [torch.zeros_like(k) for k in self.keys]

    def _to_groups(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, kv_heads, rep, F]`` per row -> ``[distinct, kv_heads, group * rep, F]`` per prompt."""
        if not self.in_place:
            grouped = x.new_zeros(self.distinct * self.group, *x.shape[1:])
            grouped[self.slot] = x
            x = grouped
        return x.reshape(self.distinct, self.group, *x.shape[1:]).transpose(1, 2).flatten(2, 3)

    def _to_rows(self, x: torch.Tensor, rep: int) -> torch.Tensor:
        x = x.unflatten(2, (self.group, rep)).transpose(1, 2).flatten(0, 1)
        return x if self.in_place else x[self.slot]

    def attend(self, q: torch.Tensor, layer: int, length: int, prompt_k: torch.Tensor,
               prompt_v: torch.Tensor) -> torch.Tensor:
        """``q`` ``[B, heads, 1, head_dim]`` -> ``[B, heads, 1, head_dim]``: attention over the row's
        prompt and its first ``length`` generated tokens."""
        batch, heads, _, head_dim = q.shape
        rep, width = heads // self.kv_heads, prompt_k.shape[2]
        q = q.reshape(batch, self.kv_heads, rep, head_dim) * head_dim ** -0.5  # query head h reads kv head h // rep
        scores = torch.cat([self._to_rows(self._to_groups(q) @ prompt_k.transpose(-1, -2) + self.bias, rep),
                            q @ self.keys[layer][:, :, :length].transpose(-1, -2)], -1)
        weights = scores.float().softmax(-1).to(q.dtype)
        out = self._to_rows(self._to_groups(weights[..., :width]) @ prompt_v, rep) + \
            weights[..., width:] @ self.values[layer][:, :, :length]
        return out.view(batch, heads, 1, head_dim)


