"""Behaviour cloning, offline, as CORL's any_percent_bc.py does it.

A deterministic tanh actor regressed onto the dataset's actions, ``mean (mu(s) - a)^2``, one
gradient step per batch of the Minari dataset. With ``top_fraction`` below 1 only the best episodes
by return are kept ("10% BC" is 0.1): a baseline that tells how much of an offline algorithm's
score is filtering the data. Observations are standardized by the (kept) data's mean and std.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from omnigym.config import require_positive
from omnigym.errors import require
from omnigym.models.continuous import DeterministicActor
from omnigym.offline.datasets import OfflineConfig
from omnigym.offline.training import (UpdateFlags, network_obs_dim, offline_policy, start_offline_run, train_offline,
                                      update_objective)
from omnigym.optim import Adam
from omnigym.process import scoped_run


@dataclass
class BCConfig(UpdateFlags, OfflineConfig):
    learning_rate: float = 3e-4
    top_fraction: float = 1.0
    """clone the best episodes by return only, this fraction of them (1: all; CORL's 10% BC: 0.1)"""

    RESUME_FIXED = OfflineConfig.RESUME_FIXED + ("top_fraction",)

    def check(self) -> None:
        super().check()
        self.check_update()
        require_positive(self, "learning_rate")
        require(0 < self.top_fraction <= 1, f"--top-fraction must be in (0, 1], got {self.top_fraction}")


CONFIG = BCConfig


@scoped_run
def train(cfg: BCConfig) -> dict:
    data, evaluator, run = start_offline_run(cfg, "bc", top_fraction=cfg.top_fraction)
    actor = DeterministicActor(data.observation_space.shape[0], data.action_space, cfg.hidden).to(cfg.device)
    actor_optimizer = Adam(actor.parameters(), lr=cfg.learning_rate)

    def objective(batch: dict) -> tuple[torch.Tensor, dict]:
        actor_loss = F.mse_loss(actor(batch["obs"]), batch["actions"])
        return actor_loss, {"losses/actor_loss": actor_loss.detach()}

    objective = update_objective(cfg, objective)  # --precision, --compile

    def update(batch: dict, step: int) -> dict:
        actor_loss, metrics = objective(batch)
        actor_optimizer.zero_grad()
        actor_loss.backward()
        actor_optimizer.step()
        return metrics

    return train_offline(cfg, "bc", run, data, evaluator, {"actor": actor, "actor_optimizer": actor_optimizer},
                         update, actor)


def load_policy(cfg: BCConfig, components: dict, envs, greedy: bool = True):
    """The cloned actor on standardized observations, ``obs (numpy batch) -> actions (numpy)``."""
    return offline_policy(DeterministicActor(network_obs_dim(envs), envs.single_action_space,
                                             tuple(cfg.hidden)), components)
