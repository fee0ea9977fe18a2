"""The training-backend seam: an algorithm says what to compute, a backend says where.

What crosses it::

    backend.forward_backward(batch, loss_fn) -> stats   # loss_fn(model, batch) -> (loss, stats)
    backend.optim_step() -> {"grad_norm": float}
    backend.state_dict() / backend.load_state_dict(state)
    backend.model   # the trained module, for passes that take no gradient (log-probs of old samples)

``forward_backward`` may be called several times before one ``optim_step`` (gradient
accumulation). ``LocalBackend`` (``local.py``) is the single-process implementation;
data-parallel backends (DDP, FSDP2, DeepSpeed ZeRO) implement the same members, so an
algorithm file does not change when it is scaled out.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

LossFn = Callable[[torch.nn.Module, Any], "tuple[torch.Tensor, dict]"]


class TrainingBackend(Protocol):
    model: torch.nn.Module

    def forward_backward(self, batch, loss_fn: LossFn) -> dict: ...

    def optim_step(self) -> dict: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...
