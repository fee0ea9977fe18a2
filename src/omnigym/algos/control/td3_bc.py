"""TD3+BC (Fujimoto & Gu, 2021), offline, as CORL's td3_bc.py does it.

TD3 on a fixed dataset (a Minari dataset in the replay buffer; no env steps) with one change to
the actor: it also regresses onto the dataset's actions, and the Q term is scaled so that the two
weigh alike whatever the reward scale,

    actor_loss = -lambda * mean Q_1(s, mu(s)) + mean (mu(s) - a)^2,    lambda = alpha / mean |Q_1(s, mu(s))|

(lambda is not differentiated). The twin Q-functions step toward TD3's smoothed clipped double-Q
target every gradient step; the actor and the target networks every ``policy_frequency``.
Observations are standardized by the dataset's mean and std. Defaults are CORL's (the paper's).
Online (``--resume-online``, offline/online.py): the same losses, acting with ``mu(s)`` plus
Gaussian noise of ``exploration_noise`` (TD3's 0.1) times the action scale.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from omnigym.config import require_non_negative, require_positive
from omnigym.errors import require
from omnigym.models.continuous import DeterministicActor, QNetwork
from omnigym.offline.datasets import OfflineConfig
from omnigym.offline.online import OnlineFlags, online_settings, train_online
from omnigym.offline.training import (UpdateFlags, network_obs_dim, offline_policy, start_offline_run, train_offline,
                                      update_objective)
from omnigym.optim import Adam
from omnigym.process import scoped_run


@dataclass
class TD3BCConfig(UpdateFlags, OnlineFlags, OfflineConfig):
    learning_rate: float = 3e-4
    """learning rate of the actor and the Q-networks"""
    tau: float = 0.005
    """target network update rate (polyak averaging)"""
    policy_noise: float = 0.2
    """std of the target policy smoothing noise, in units of the action scale"""
    noise_clip: float = 0.5
    """the smoothing noise is clipped to +-noise_clip (in units of the action scale)"""
    policy_frequency: int = 2
    """Q steps between actor (and target network) updates"""
    alpha: float = 2.5
    """weight of the Q term against behaviour cloning (lambda = alpha / mean |Q|)"""
    exploration_noise: float = 0.1
    """online (--resume-online): std of the Gaussian noise added to mu(s), in units of the action scale"""

    RESUME_FIXED = OfflineConfig.RESUME_FIXED + OnlineFlags.RESUME_FIXED

    def check(self) -> None:
        super().check()
        self.check_online()
        self.check_update()
        require_positive(self, "learning_rate", "policy_frequency")
        require_non_negative(self, "policy_noise", "noise_clip", "alpha", "exploration_noise")
        require(0 < self.tau <= 1, f"--tau must be in (0, 1], got {self.tau}")


CONFIG = TD3BCConfig


def td3_bc_actor_loss(q: torch.Tensor, pi: torch.Tensor, actions: torch.Tensor, alpha: float):
    """``-lambda * mean q + mean (pi - actions)^2`` with ``lambda = alpha / mean |q|`` (not
    differentiated), and lambda."""
    lmbda = alpha / q.abs().mean().detach()
    return -lmbda * q.mean() + F.mse_loss(pi, actions), lmbda


@scoped_run
def train(cfg: TD3BCConfig) -> dict:
    cfg, source = online_settings(cfg, "td3_bc")  # --resume-online: the offline run's settings, checked
    data, evaluator, run = start_offline_run(cfg, "td3_bc")
    device = torch.device(cfg.device)
    obs_dim, action_dim = data.observation_space.shape[0], data.action_space.shape[0]
    actor = DeterministicActor(obs_dim, data.action_space, cfg.hidden).to(device)
    qf = QNetwork(obs_dim, action_dim, cfg.hidden, n=2).to(device)  # the twin Q-functions, one batched module
    actor_target, qf_target = copy.deepcopy(actor), copy.deepcopy(qf)
    q_optimizer = Adam(qf.parameters(), lr=cfg.learning_rate)
    actor_optimizer = Adam(actor.parameters(), lr=cfg.learning_rate)
    components = {"actor": actor, "qf": qf, "actor_target": actor_target, "qf_target": qf_target,
                  "q_optimizer": q_optimizer, "actor_optimizer": actor_optimizer}
    low, high = (torch.as_tensor(x, dtype=torch.float32, device=device)
                 for x in (data.action_space.low, data.action_space.high))
    scale = actor.action_scale
    online, targets = (list(actor.parameters()) + list(qf.parameters()),
                       list(actor_target.parameters()) + list(qf_target.parameters()))
    losses: dict[str, torch.Tensor] = {}

    def critic_objective(batch: dict, noise: torch.Tensor) -> tuple[torch.Tensor, dict]:
        # The twin Q-functions toward the smoothed clipped double-Q target (TD3's).
        with torch.no_grad():
            next_actions = torch.minimum(torch.maximum(actor_target(batch["next_obs"]) + noise * scale, low), high)
            next_q = qf_target(batch["next_obs"], next_actions).min(0).values
            target = batch["rewards"] + cfg.gamma * (1.0 - batch["terminated"]) * next_q
        q = qf(batch["obs"], batch["actions"])
        q_loss = F.mse_loss(q[0], target) + F.mse_loss(q[1], target)
        return q_loss, {"losses/qf_loss": q_loss.detach(), "losses/qf1_values": q[0].detach().mean()}

    def actor_objective(batch: dict) -> tuple[torch.Tensor, dict]:
        # The actor on Q_1 plus behaviour cloning.
        pi = actor(batch["obs"])
        actor_loss, lmbda = td3_bc_actor_loss(qf.q1(batch["obs"], pi, frozen=True), pi, batch["actions"], cfg.alpha)
        return actor_loss, {"losses/actor_loss": actor_loss.detach(), "losses/lambda": lmbda,
                            "losses/bc_mse": F.mse_loss(pi.detach(), batch["actions"])}

    critic_objective, actor_objective = (update_objective(cfg, f) for f in (critic_objective, actor_objective))

    def update(batch: dict, step: int) -> dict:
        # 1. The critics. The smoothing noise is drawn here, outside a compiled objective, whose
        # random numbers would come from another generator than the seeded one eager draws from.
        noise = (torch.randn_like(batch["actions"]) * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
        q_loss, metrics = critic_objective(batch, noise)
        q_optimizer.zero_grad()
        q_loss.backward()
        q_optimizer.step()
        losses.update(metrics)

        # 2. Every policy_frequency steps: the actor, then the targets follow.
        if (step + 1) % cfg.policy_frequency == 0:
            actor_loss, metrics = actor_objective(batch)
            actor_optimizer.zero_grad()
            actor_loss.backward()  # the actor's alone: Q_1 was read frozen
            actor_optimizer.step()
            losses.update(metrics)
            with torch.no_grad():
                torch._foreach_lerp_(targets, online, cfg.tau)
        return losses

    if cfg.resume_online:
        def explore(obs):
            mu = actor(obs)
            return mu + torch.randn_like(mu) * (scale * cfg.exploration_noise)

        return train_online(cfg, "td3_bc", run, data, evaluator, components, update, actor, explore, source)
    return train_offline(cfg, "td3_bc", run, data, evaluator, components, update, actor)


def load_policy(cfg: TD3BCConfig, components: dict, envs, greedy: bool = True):
    """The trained actor on standardized observations, ``obs (numpy batch) -> actions (numpy)``."""
    return offline_policy(DeterministicActor(network_obs_dim(envs), envs.single_action_space,
                                             tuple(cfg.hidden)), components)
