"""Adam for small control networks, on torch's own functional Adam kernel.

``torch.optim.Optimizer`` imports ``torch._dynamo`` on first use, which costs about one
second here (measured, torch 2.13) -- longer than training CartPole takes. This class
keeps the optimizer state itself and calls ``torch.optim.adam.adam``, the same kernel
``torch.optim.Adam`` runs, so the numbers are identical (tests/test_optim.py checks it).
It exposes ``param_groups[0]["lr"]``, ``zero_grad`` and ``state_dict`` like torch's.
"""

from __future__ import annotations

import torch
from torch.optim.adam import adam


class Adam:
    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0):
        self.params = [p for p in params if p.requires_grad]
        self.param_groups = [{"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}]
        self.exp_avgs = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sqs = [torch.zeros_like(p) for p in self.params]
        self.steps = [torch.tensor(0.0) for _ in self.params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        live = [i for i, p in enumerate(self.params) if p.grad is not None]
        adam([self.params[i] for i in live], [self.params[i].grad for i in live], [self.exp_avgs[i] for i in live],
             [self.exp_avg_sqs[i] for i in live], [], [self.steps[i] for i in live], foreach=True, amsgrad=False,
             beta1=group["betas"][0], beta2=group["betas"][1], lr=group["lr"], weight_decay=group["weight_decay"],
             eps=group["eps"], maximize=False)

    def state_dict(self) -> dict:
        return {"param_groups": [dict(g) for g in self.param_groups], "exp_avgs": self.exp_avgs,
                "exp_avg_sqs": self.exp_avg_sqs, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.param_groups = [dict(g) for g in state["param_groups"]]
        for name in ("exp_avgs", "exp_avg_sqs", "steps"):
            for mine, saved in zip(getattr(self, name), state[name]):
                mine.copy_(saved)
