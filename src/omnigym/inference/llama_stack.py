"""A Llama-family decoder stack, run from its weights: written once for the two samplers that
run the model themselves, ``inference/kv.py`` (a batch of prompts with a KV cache) and
``serve/multilora.py`` (many requests, each with its own LoRA adapter).

Each layer's projections are fused (q|k|v one matrix, gate|up one) so a layer is three matrix
products and a down projection. What differs between the samplers is passed in: how a
projection is computed (``linear``: plain, or with each request's adapter delta on its rows)
and how attention reads and writes the cache (``attend``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


@dataclass
class LayerWeights:
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


def fused_layers(model, dtype: torch.dtype | None = None) -> list[LayerWeights]:
    """The fused projection weights of ``model``'s layers as they are now; ``dtype``: the
    projections (not the norms, which run in float32 under autocast) in it, each written once
    (a cast after the concatenation read and wrote them twice more: ~0.3 s a call on SmolLM2)."""
    def fused(*tensors):
        if tensors[0] is None:
            return None
        if dtype is None or tensors[0].dtype == dtype:
            return torch.cat(tensors) if len(tensors) > 1 else tensors[0]
        out = torch.empty((sum(t.shape[0] for t in tensors), *tensors[0].shape[1:]), dtype=dtype,
                          device=tensors[0].device)
        return torch.cat(tensors, out=out)

    layers = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        layers.append(LayerWeights(
            layer.input_layernorm.weight,
            fused(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight),
            fused(a.q_proj.bias, a.k_proj.bias, a.v_proj.bias),
            a.q_norm.weight if hasattr(a, "q_norm") else None, a.k_norm.weight if hasattr(a, "k_norm") else None,
            fused(a.o_proj.weight), fused(a.o_proj.bias),
            layer.post_attention_layernorm.weight,
            fused(m.gate_proj.weight, m.up_proj.weight), fused(m.gate_proj.bias, m.up_proj.bias),
            fused(m.down_proj.weight), fused(m.down_proj.bias)))
    return layers


@dataclass(frozen=True)
class Dimensions:
    heads: int
    kv_heads: int
    head_dim: int
    eps: float

    @classmethod
    def of(cls, config) -> "Dimensions":
        heads = config.num_attention_heads
        return cls(heads, getattr(config, "num_key_value_heads", None) or heads,
                   getattr(config, "head_dim", None) or config.hidden_size // heads, config.rms_norm_eps)


def rotary_tables(backbone, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary cos and sin of positions ``0 .. length - 1``, once: a position's angles depend
    on it alone."""
    weight = backbone.embed_tokens.weight
    cos, sin = backbone.rotary_emb(torch.zeros(1, 1, dtype=weight.dtype, device=weight.device),
                                   torch.arange(length, device=weight.device)[None])
    return cos[0], sin[0]


Linear = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", int, str], torch.Tensor]
"""(input, weight, bias, layer index, which fused product: qkv, out, gate_up or down) -> output"""

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(layer index, queries, keys, values, each [rows, heads, width, head_dim]) -> attention output
of the queries' shape; it writes the keys and values into its cache"""


def plain_linear(x, weight, bias, layer: int, kind: str) -> torch.Tensor:
    return F.linear(x, weight, bias)


def decoder_stack(x: torch.Tensor, layers: list[LayerWeights], cos: torch.Tensor, sin: torch.Tensor,
                  dims: Dimensions, attend: Attend, linear: Linear = plain_linear) -> torch.Tensor:
    """The hidden states after the last layer (before the final norm) of the embedded tokens
    ``x`` ``[rows, width, hidden]``, at the positions whose rotary ``cos`` and ``sin`` are given."""
    heads, kv_heads, head_dim, eps = dims.heads, dims.kv_heads, dims.head_dim, dims.eps
    cos, sin, half = cos.unsqueeze(2), sin.unsqueeze(2), head_dim // 2  # broadcast over heads
    for i, w in enumerate(layers):
        h = F.rms_norm(x, (x.shape[-1],), w.input_norm, eps)
        qkv = linear(h, w.qkv, w.qkv_bias, i, "qkv").unflatten(-1, (heads + 2 * kv_heads, head_dim))
        qk, v = qkv[:, :, :heads + kv_heads], qkv[:, :, heads + kv_heads:]
        if w.q_norm is not None:
            qk = torch.cat([F.rms_norm(qk[:, :, :heads], (head_dim,), w.q_norm, eps),
                            F.rms_norm(qk[:, :, heads:], (head_dim,), w.k_norm, eps)], 2)
        qk = qk * cos + torch.cat([-qk[..., half:], qk[..., :half]], -1) * sin
        attn = attend(i, qk[:, :, :heads].transpose(1, 2), qk[:, :, heads:].transpose(1, 2), v.transpose(1, 2))
        x = x + linear(attn.transpose(1, 2).flatten(2), w.out, w.out_bias, i, "out")
        h = F.rms_norm(x, (x.shape[-1],), w.post_norm, eps)
        gate, up = linear(h, w.gate_up, w.gate_up_bias, i, "gate_up").chunk(2, -1)
        x = x + linear(F.silu(gate) * up, w.down, w.down_bias, i, "down")
    return x
