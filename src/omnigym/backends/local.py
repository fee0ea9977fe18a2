"""The training backend of one process on one device."""

from __future__ import annotations

import copy

import torch


class LocalBackend:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float | None = None):
        self.model, self.optimizer, self.max_grad_norm = model, optimizer, max_grad_norm

    def local_part(self, rows, weights=None) -> tuple[list, float]:
        """One process trains every row of the batch."""
        return list(rows), 1.0

    def forward_backward(self, batch, loss_fn, share: float | None = None) -> dict:
        """``share``: the batch's part of the step's whole batch (1 or None: all of it; less for a
        micro-batch). The loss and the scalar statistics are weighed by it (``base.py``)."""
        loss, stats = loss_fn(self.model, batch)
        if share is None or share == 1.0:
            loss.backward()
            return {"loss": loss.detach(), **stats}
        (loss * share).backward()
        return {k: v * share if torch.is_tensor(v) and v.numel() == 1 else v
                for k, v in {"loss": loss.detach(), **stats}.items()}

    def optim_step(self) -> dict:
        grad_norm = None
        if self.max_grad_norm is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return {} if grad_norm is None else {"grad_norm": grad_norm}

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def full_model(self) -> torch.nn.Module:
        return self.model

    def frozen_copy(self) -> torch.nn.Module:
        """A copy of the model as it is now, for passes that never train it (a reference)."""
        return frozen(copy.deepcopy(self.model))


def frozen(model: torch.nn.Module) -> torch.nn.Module:
    from omnigym.models.precision import store_frozen

    model.eval()
    model.requires_grad_(False)
    return store_frozen(model)  # --precision bf16: its weights cast once, not at every forward
