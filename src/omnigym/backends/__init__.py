"""Training backends behind one contract (``base.py``): where an algorithm's steps run."""

from __future__ import annotations

BACKENDS = ("local", "ddp", "fsdp2", "deepspeed")


def make_backend(cfg, model, make_optimizer, max_grad_norm: float | None = None):
    """``local``: this process; ``ddp`` / ``fsdp2``: data-parallel over the processes torchrun
    started; ``deepspeed``: ZeRO through DeepSpeed's engine and ``--deepspeed-config``.
    ``make_optimizer(model)`` is called after the model is wrapped (FSDP2 shards the
    parameters the optimizer must hold)."""
    backend = getattr(cfg, "training_backend", "local")
    if backend == "local":
        from omnigym.backends.local import LocalBackend

        return LocalBackend(model, make_optimizer(model), max_grad_norm)
    if backend == "deepspeed":
        from omnigym.backends.deepspeed import DeepSpeedBackend

        return DeepSpeedBackend(model, make_optimizer, max_grad_norm, cfg.deepspeed_config)
    from omnigym.backends.data_parallel import DataParallelBackend

    return DataParallelBackend(model, make_optimizer, max_grad_norm, backend)
