"""The frozen reference policy that KL penalties and DPO measure the policy against.

With LoRA the reference is the policy's own base model with the adapters switched off
(peft's ``disable_adapter``), so no second copy of the weights is held; otherwise it is a
frozen copy of the policy as it was when the reference was made. Either way it is read
through ``reference.run(fn, batch)`` with gradients off, and it checkpoints like any
component (the copy's weights; nothing for the shared base).
"""

from __future__ import annotations

import copy

import torch


class FrozenReference:
    def __init__(self, policy):
        self.shared = hasattr(policy, "disable_adapter")
        if self.shared:
            self.model = policy
        else:
            self.model = copy.deepcopy(policy).eval()
            self.model.requires_grad_(False)

    @torch.no_grad()
    def run(self, fn, batch):
        """``fn(model, batch)`` on the reference model."""
        if not self.shared:
            return fn(self.model, batch)
        was_training = self.model.training
        self.model.eval()
        try:
            with self.model.disable_adapter():
                return fn(self.model, batch)
        finally:
            self.model.train(was_training)

    def state_dict(self) -> dict:
        return {} if self.shared else self.model.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if not self.shared:
            self.model.load_state_dict(state)
