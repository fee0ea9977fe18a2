"""Training backends behind one contract (``base.py``): where an algorithm's steps run."""

from __future__ import annotations

from contextlib import nullcontext

BACKENDS = ("local", "ddp", "fsdp2", "deepspeed")


def make_backend(cfg, model, make_optimizer, max_grad_norm: float | None = None):
    """``local``: this process; ``ddp`` / ``fsdp2``: data-parallel over the processes torchrun
    started; ``deepspeed``: ZeRO through DeepSpeed's engine and ``--deepspeed-config``.
    ``make_optimizer(model)`` is called after the model is wrapped (FSDP2 shards the
    parameters the optimizer must hold)."""
    from omnigym.models.precision import compute_in

    # every forward of the model in --precision, before a wrapper shares it (a reference made by
    # frozen_copy is a copy of the hooked model: it scores in the policy's precision)
    model = compute_in(model, getattr(cfg, "precision", "fp32"))
    backend = getattr(cfg, "training_backend", "local")
    if backend == "local":
        from omnigym.backends.local import LocalBackend

        return LocalBackend(model, make_optimizer(model), max_grad_norm)
    if backend == "deepspeed":
        from omnigym.backends.deepspeed import DeepSpeedBackend

        return DeepSpeedBackend(model, make_optimizer, max_grad_norm, cfg.deepspeed_config)
    from omnigym.backends.data_parallel import DataParallelBackend

    return DataParallelBackend(model, make_optimizer, max_grad_norm, backend)


def whole_weights(model):
    """A context in which ``model``'s weights are whole in this process, for a reader that takes
    them without calling the model's forward (the KV-cache sampler). Only DeepSpeed ZeRO-3
    partitions them at rest (its parameters carry ``ds_id``): gathered for the block, partitioned
    again after; every process must enter it (a collective). Elsewhere: nothing to do."""
    params = [p for p in model.parameters() if hasattr(p, "ds_id")]
    if not params:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params)
