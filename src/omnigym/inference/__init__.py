"""Inference engines behind one contract (``engine.py``): ``hf`` and ``kv`` in the trainer's
process on its model (``recurrent`` for an LSTM LM), ``vllm`` (the ``[vllm]`` extra, a CUDA GPU)
on vLLM's own copy."""

from __future__ import annotations

from omnigym.errors import OmnigymError

ENGINES = ("auto", "hf", "kv", "vllm")


def make_engine(model, tokenizer, kind: str = "auto", batch_size: int = 256):
    """``hf``: Hugging Face ``generate``; ``kv``: the lean Llama-family sampler (``kv.py``);
    ``vllm``: vLLM loaded from the model's ``name_or_path``, fed the trainer's weights by
    ``update_weights`` (``vllm.py``); ``auto``: ``kv`` where the model allows it, else ``hf``; a
    recurrent LM (``--model lstm``) only ``recurrent.py``'s sampler, which ``auto`` picks."""
    from omnigym.inference.hf import HFEngine
    from omnigym.inference.kv import LlamaFamilyEngine, unsupported_reason

    if kind not in ENGINES:
        raise OmnigymError(f"unknown engine {kind!r}; choose auto, hf, kv or vllm")
    if getattr(model, "is_recurrent", False):  # an LSTM LM (--model lstm): no attention, its own sampler
        from omnigym.inference.recurrent import RecurrentEngine

        if kind != "auto":
            raise OmnigymError(f"--engine {kind} cannot run a recurrent (LSTM) policy; leave --engine at auto")
        return RecurrentEngine(model, tokenizer, batch_size)
    if kind == "vllm":
        from omnigym.inference.vllm import VLLMEngine

        return VLLMEngine.for_model(model, tokenizer)  # vLLM batches itself: no batch_size
    if kind == "hf" or (kind == "auto" and unsupported_reason(model)):
        return HFEngine(model, tokenizer, batch_size)
    return LlamaFamilyEngine(model, tokenizer, batch_size)  # says why if it cannot run the model


def check_engine_available(kind: str, lora_r: int = 0) -> None:
    """Before a run starts: ``--engine vllm`` has its extra and full weights to load. Said when the
    engine was built, it came after GRPO's warm-up had run (minutes) and left its stage behind."""
    if kind == "vllm":
        from omnigym.inference.vllm import LORA_REFUSED, import_vllm

        import_vllm()
        if lora_r:
            raise OmnigymError(LORA_REFUSED)


def engine_on_own_copy(engine):
    """An engine like ``engine`` on its own copy of the policy, so that it can sample in a thread
    while the trainer changes the original (``update_weights`` then copies the trainer's tensors
    in, between two batches). An engine that holds its own weights already (vLLM) is returned as
    it is. The copy costs the policy's size in memory once more."""
    import copy

    from omnigym.inference.engine import BatchedEngine

    if not isinstance(engine, BatchedEngine):
        return engine
    clone = copy.copy(engine)
    clone.model = copy.deepcopy(engine.model)
    return clone
