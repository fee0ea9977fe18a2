"""The training backend of one process on one device."""

from __future__ import annotations

import torch


class LocalBackend:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float | None = None):
        self.model, self.optimizer, self.max_grad_norm = model, optimizer, max_grad_norm

    def forward_backward(self, batch, loss_fn) -> dict:
        loss, stats = loss_fn(self.model, batch)
        loss.backward()
        return {"loss": loss.detach(), **stats}

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
