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

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from omnigym.backends import whole_weights
from omnigym.errors import OmnigymError
from omnigym.inference.engine import BatchedEngine, SamplingParams, drawn_logprobs, processed_logits
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


@dataclass
class _Layer:
    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    out: torch.Tensor
    out_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None


def _cat(*tensors):
    return None if tensors[0] is None else torch.cat(tensors)


class LlamaFamilyEngine(BatchedEngine):
    def __init__(self, model, tokenizer, batch_size: int = 256):
        reason = unsupported_reason(model)
        if reason:
            raise OmnigymError(f"--engine kv cannot run this model: {reason}; use --engine hf")
        super().__init__(model, tokenizer, batch_size)

    def _snapshot(self) -> list[_Layer]:
        """Fused projection weights (q|k|v and gate|up) of the model as it is now."""
        layers = []
        for layer in self.model.model.layers:
            a, m = layer.self_attn, layer.mlp
            layers.append(_Layer(
                layer.input_layernorm.weight,
                torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                _cat(a.q_proj.bias, a.k_proj.bias, a.v_proj.bias),
                a.q_norm.weight if hasattr(a, "q_norm") else None, a.k_norm.weight if hasattr(a, "k_norm") else None,
                a.o_proj.weight, a.o_proj.bias,
                layer.post_attention_layernorm.weight,
                torch.cat([m.gate_proj.weight, m.up_proj.weight]), _cat(m.gate_proj.bias, m.up_proj.bias),
                m.down_proj.weight, m.down_proj.bias))
        return layers

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams):
        with whole_weights(self.model):  # DeepSpeed ZeRO-3 partitions them at rest: gathered for the batch
            return self._sample(prompts, params)

    def _sample(self, prompts: list[list[int]], params: SamplingParams):
        config, backbone = self.model.config, self.model.model
        device = backbone.embed_tokens.weight.device
        heads, kv_heads = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or \
            config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        eps = config.rms_norm_eps
        layers = self._snapshot()
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
        dtype = backbone.embed_tokens.weight.dtype
        cache_k = [torch.zeros(len(distinct), kv_heads, total, head_dim, dtype=dtype, device=device)
                   for _ in layers]
        cache_v = [torch.zeros_like(c) for c in cache_k]
        shared = SharedPrompts(rows, valid[:, :width], kv_heads, (batch, kv_heads, params.max_new_tokens, head_dim),
                               len(layers), dtype) if reads_prompts_once(batch, len(distinct), width) else None
        # Prefill mask: causal and not padding; each query also sees itself, so that the
        # rows of left-padding positions stay finite (their outputs are never used).
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
        mask = (causal & valid[:, None, None, :width]) | torch.eye(width, dtype=torch.bool, device=device)

        # The rotary angles of every position, once: a position's cos and sin depend on it alone.
        cos_table, sin_table = (t[0] for t in backbone.rotary_emb(
            torch.zeros(1, 1, dtype=dtype, device=device), torch.arange(total, device=device)[None]))

        def forward(ids: torch.Tensor, start: int, pos: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
            x = backbone.embed_tokens(ids)
            cos, sin = cos_table[pos].unsqueeze(2), sin_table[pos].unsqueeze(2)  # broadcast over heads
            end, q_width = start + ids.shape[1], heads * head_dim
            for i, w in enumerate(layers):
                h = F.rms_norm(x, (x.shape[-1],), w.input_norm, eps)
                qkv = F.linear(h, w.qkv, w.qkv_bias).unflatten(-1, (heads + 2 * kv_heads, head_dim))
                qk, v = qkv[:, :, :heads + kv_heads], qkv[:, :, heads + kv_heads:]
                if w.q_norm is not None:
                    qk = torch.cat([F.rms_norm(qk[:, :, :heads], (head_dim,), w.q_norm, eps),
                                    F.rms_norm(qk[:, :, heads:], (head_dim,), w.k_norm, eps)], 2)
                half = head_dim // 2
                qk = qk * cos + torch.cat([-qk[..., half:], qk[..., :half]], -1) * sin
                q = qk[:, :, :heads].transpose(1, 2)
                if shared is not None and start >= width:  # a decoding step of rows that share their prompts
                    shared.keys[i][:, :, start - width] = qk[:, 0, heads:]
                    shared.values[i][:, :, start - width] = v[:, 0]
                    attn = shared.attend(q, i, start - width + 1, cache_k[i][:, :, :width], cache_v[i][:, :, :width])
                else:
                    cache_k[i][:, :, start:end] = qk[:, :, heads:].transpose(1, 2)
                    cache_v[i][:, :, start:end] = v.transpose(1, 2)
                    attn = F.scaled_dot_product_attention(q, cache_k[i][:, :, :end], cache_v[i][:, :, :end],
                                                          attn_mask=attn_mask, enable_gqa=heads != kv_heads)
                x = x + F.linear(attn.transpose(1, 2).reshape(*x.shape[:2], q_width), w.out, w.out_bias)
                h = F.rms_norm(x, (x.shape[-1],), w.post_norm, eps)
                gate, up = F.linear(h, w.gate_up, w.gate_up_bias).chunk(2, -1)
                x = x + F.linear(F.silu(gate) * up, w.down, w.down_bias)
            x = F.rms_norm(x[:, -1], (x.shape[-1],), backbone.norm.weight, eps)
            return self.model.lm_head(x).float()

        logits = forward(tokens, 0, positions, mask)[rows]
        if shared is None:  # each row gets a copy of its prompt's cache, and decodes on after it
            for i in range(len(layers)):
                cache_k[i], cache_v[i] = cache_k[i][rows], cache_v[i][rows]
        valid, position = valid[rows], positions[rows, -1:]
        generated = torch.full((batch, params.max_new_tokens), self.pad_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((batch, params.max_new_tokens), device=device)
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        ends = torch.tensor(sorted({self.eos_id, *params.stop_ids}), device=device)
        for t in range(params.max_new_tokens):
            processed = processed_logits(logits, params)  # what is drawn from is what is recorded
            token = processed.argmax(-1) if params.greedy else draw(processed)
            token = torch.where(done, self.pad_id, token)
            generated[:, t] = token
            logprobs[:, t] = drawn_logprobs(processed, token)
            done |= torch.isin(token, ends)
            if t == params.max_new_tokens - 1 or bool(done.all()):
                break
            valid[:, width + t] = True
            position = position + 1
            logits = forward(token[:, None], width + t, position,
                             None if shared is not None else valid[:, None, None, :width + t + 1])
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


def draw(processed: torch.Tensor) -> torch.Tensor:
    """One token per row from the distribution ``processed_logits`` gives (cut tokens at -inf)."""
    # argmax of p / Exp(1) noise is a draw from p, and cheaper than torch.multinomial
    probs = processed.softmax(-1)
    return (probs / torch.empty_like(probs).exponential_()).argmax(-1)
