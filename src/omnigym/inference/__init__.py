"""Inference engines behind one contract (``engine.py``): ``hf`` and ``kv`` today."""

from __future__ import annotations

from omnigym.errors import OmnigymError

ENGINES = ("auto", "hf", "kv")


def make_engine(model, tokenizer, kind: str = "auto", batch_size: int = 256):
    """``hf``: Hugging Face ``generate``; ``kv``: the lean Llama-family sampler (``kv.py``);
    ``auto``: ``kv`` where the model allows it, else ``hf``."""
    from omnigym.inference.hf import HFEngine
    from omnigym.inference.kv import LlamaFamilyEngine, unsupported_reason

    if kind not in ENGINES:
        raise OmnigymError(f"unknown engine {kind!r}; choose auto, hf or kv")
    if kind == "hf" or (kind == "auto" and unsupported_reason(model)):
        return HFEngine(model, tokenizer, batch_size)
    return LlamaFamilyEngine(model, tokenizer, batch_size)  # says why if it cannot run the model
