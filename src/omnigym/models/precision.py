"""``--precision bf16``: a language model's matrix products in bfloat16, its weights, optimizer
state and gradients kept in float32 (mixed precision, as TRL's ``bf16=True`` and verl's bf16
actor give; no loss scaling, which bf16's float32 range does not need).

One seam: the model itself. ``compute_in(model, "bf16")`` hooks its forward so that every call,
wherever it comes from (the trainer's step, a reference or old-log-prob pass, ``generate``, a
copy made with ``deepcopy``, a DDP or FSDP2 wrapper), runs under ``torch.autocast``. The
samplers that run a model from its weights instead of its forward (``inference/kv.py``) ask
``precision_of`` and enter ``autocast_for`` themselves. Log-probabilities are still taken in
float32 (``models.tokens`` casts the logits up before the softmax).

Why a forward hook and not an ``autocast`` around each call site: thirty-odd places call a
model; a forgotten one would quietly run in float32, or a reference in another precision from
its policy. The hook's exit runs even when the forward raises (``always_call``), so autocast
never stays on for the code after it.

On a CPU with AMX (Sapphire Rapids and later) a bf16 matrix product is several times faster
than float32; without AVX512-BF16 it is emulated and slower: ``bench/grpo_vs_trl.py
--precision bf16`` measures it on the machine at hand.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from omnigym.errors import OmnigymError

PRECISIONS = ("fp32", "bf16")
_MARK = "_omnigym_precision"


def compute_in(model: torch.nn.Module, precision: str) -> torch.nn.Module:
    """``model`` with every forward in ``precision`` (``fp32``: as it is). Its weights stay float32."""
    if precision == "fp32" or getattr(model, _MARK, "fp32") == precision:
        return model
    if precision != "bf16":  # a run's config.json edited, or from a newer version: eval loads it with this
        raise OmnigymError(f"unknown precision {precision!r}; choose {' or '.join(PRECISIONS)}")
    model.register_forward_pre_hook(_enter)
    model.register_forward_hook(_leave, always_call=True)
    setattr(model, _MARK, precision)
    config = getattr(model, "config", None)
    if _device_type(model) == "cpu" and hasattr(model, "set_attn_implementation") and \
            getattr(config, "_attn_implementation", None) == "sdpa":
        # PyTorch's CPU SDPA kernel is slow backward in bf16. SmolLM2-135M, a forward and backward
        # of 16 replies, median of 5 on a quiet machine: bf16 with SDPA 5.1 s, eager 4.3 (float32
        # with SDPA 5.9). The same arithmetic, another kernel.
        model.set_attn_implementation("eager")
    return model


def store_frozen(model: torch.nn.Module) -> torch.nn.Module:
    """A model that never trains again (a reference, a teacher), hooked for bf16: its linear
    layers' weights stored in bf16 once, where autocast would cast the float32 ones at every
    forward (a frozen weight is not in autocast's cache, which keeps only trained ones). The
    products are the same: autocast rounds each weight to bf16 either way. A weight the input
    embedding shares (a tied head) stays float32, as the embedding lookup reads it."""
    if precision_of(model) != "bf16":
        return model
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    tied = getattr(embedding, "weight", None)
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight is not tied:
            module.weight.data = module.weight.data.to(torch.bfloat16)
            if module.bias is not None:
                module.bias.data = module.bias.data.to(torch.bfloat16)
    return model


def precision_of(model) -> str:
    """``bf16`` for a model ``compute_in`` hooked (a wrapper's inner model counts), else ``fp32``."""
    for candidate in (model, getattr(model, "module", None), getattr(model, "base_model", None)):
        if candidate is not None and getattr(candidate, _MARK, "fp32") != "fp32":
            return getattr(candidate, _MARK)
    return "fp32"


def autocast_for(model):
    """A context in which ``model``'s products run in its precision: for a sampler that reads the
    weights without calling the forward, or one region around many forwards (``generate``: the
    float32 weights are cast once for the region, not once a token)."""
    if precision_of(model) != "bf16":
        return nullcontext()
    return torch.autocast(_device_type(model), dtype=torch.bfloat16)


def _device_type(model) -> str:
    parameter = next(model.parameters(), None)
    return parameter.device.type if parameter is not None else "cpu"


def _enter(module, args):
    region = torch.autocast(_device_type(module), dtype=torch.bfloat16)
    region.__enter__()
    module.__dict__.setdefault("_omnigym_regions", []).append(region)


def _leave(module, args, output):
    regions = module.__dict__.get("_omnigym_regions")
    if regions:
        regions.pop().__exit__(None, None, None)
