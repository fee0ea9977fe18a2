"""The training-backend seam: an algorithm says what to compute, a backend says where.

What crosses it::

    backend.local_part(rows, weights=None) -> (rows, share)   # this process's rows of a global batch
    backend.forward_backward(batch, loss_fn, share) -> stats   # loss_fn(model, batch) -> (loss, stats)
    backend.optim_step() -> {"grad_norm": float}
    backend.state_dict() / backend.load_state_dict(state)      # whole tensors, one layout for all
    backend.model        # the trained module, for passes that take no gradient (log-probs of old samples)
    backend.full_model() # the whole trained module in the first process (to export it)
    backend.frozen_copy()  # a plain copy of the model now, in every process (a reference model)

``forward_backward`` may be called several times before one ``optim_step`` (gradient
accumulation): it scales the loss by ``share`` and returns the scalar statistics weighed by
it, so the passes over ``micro_batches`` of a batch add up to one pass over the whole of it. ``local_part`` hands each process its contiguous part of a global batch and
that part's ``share``: its fraction of ``weights`` (one per row: the rows' loss tokens for a
token-mean loss; none: every row weighs 1). Passing that share to ``forward_backward`` makes
the step equal one process's on the whole batch, so the algorithm does no arithmetic of its
own about processes. ``LocalBackend`` (``local.py``) is the single-process implementation;
``DataParallelBackend`` (DDP, FSDP2) and ``DeepSpeedBackend`` (ZeRO) implement the same
members, so an algorithm file does not change when it is scaled out (``make_backend``).

Several adapters on one base model (``AdapterBackends``, ``lora.py``: the Tinker server's
training runs) extend the seam: each adapter is a ``TrainingBackend`` of its own, whose
passes go through a model of its own over the shared weights (so passes of different adapters
may run at once, on different threads), holds an optimizer over its own parameters only,
and whose ``state_dict`` is its adapter's tensors (``load_state_dict`` takes
``"optimizer": None`` for the weights with a fresh optimizer). It adds ``forward(batch,
loss_fn)``, a pass without gradient through its adapter (for a single model,
``backend.model`` serves). The base weights are frozen and held once.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import torch

LossFn = Callable[[torch.nn.Module, Any], "tuple[torch.Tensor, dict]"]


class TrainingBackend(Protocol):
    model: torch.nn.Module

    def local_part(self, rows: Sequence, weights: Sequence[float] | None = None) -> tuple[list, float]: ...

    def forward_backward(self, batch, loss_fn: LossFn, share: float | None = None) -> dict: ...

    def optim_step(self) -> dict: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def full_model(self) -> torch.nn.Module | None: ...

    def frozen_copy(self) -> torch.nn.Module: ...


class AdapterBackends(Protocol):
    model: torch.nn.Module
    """the base model, whose weights every adapter's model shares"""

    def add(self, name: str, rank: int, alpha: float, targets: list[str], seed: int,
            make_optimizer: Callable[[list], torch.optim.Optimizer],
            max_grad_norm: float | None = None) -> TrainingBackend: ...

    def remove(self, name: str) -> None: ...


def part_of_process(rows: Sequence, weights: Sequence[float] | None, rank: int, world_size: int) -> tuple[list, float]:
    """Process ``rank``'s contiguous part of ``rows`` and its share of their total weight."""
    begin, end = len(rows) * rank // world_size, len(rows) * (rank + 1) // world_size
    if weights is None:
        return list(rows[begin:end]), (end - begin) / max(len(rows), 1)
    return list(rows[begin:end]), sum(weights[begin:end]) / max(sum(weights), 1)


def micro_batches(weights: Sequence[float], rows_per_pass: int, world_size: int = 1) -> list[tuple[list, float]]:
    """A batch of ``len(weights)`` rows in micro-batches of about ``rows_per_pass`` rows a process
    (0: the whole batch in one), each with its share of the batch's total weight. Split into
    near-equal contiguous parts, every process gets the same number of them, and each part has
    a row for every process."""
    rows = len(weights)
    parts = 1 if rows_per_pass <= 0 else -(-rows // (rows_per_pass * world_size))
    parts = max(1, min(parts, rows // world_size))
    total = max(sum(weights), 1)
    bounds = [rows * i // parts for i in range(parts + 1)]
    return [(list(range(begin, end)), sum(weights[begin:end]) / total) for begin, end in zip(bounds, bounds[1:])]
