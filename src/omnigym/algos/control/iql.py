"""Implicit Q-Learning (Kostrikov, Nair & Levine, 2021), offline, as CORL's iql.py does it.

IQL never asks the Q-function about actions outside the dataset. Each gradient step on a batch
``(s, a, r, s', terminated)`` of the Minari dataset:

1. ``V(s)`` toward an upper expectile of ``min_i Q_target_i(s, a)`` over the dataset's actions:
   ``L_V = mean |expectile - 1(u < 0)| * u^2`` with ``u = Q_target(s, a) - V(s)``;
2. the twin ``Q_i(s, a)`` toward ``r + gamma * (1 - terminated) * V(s')``, and the target
   Q-networks follow at rate ``tau``;
3. the actor by advantage-weighted regression: ``-mean exp(beta * u) * log pi(a | s)``, the weight
   clipped at ``exp_adv_max``, its learning rate on a cosine schedule over the run.

The actor is a Gaussian with a tanh mean and a state-independent std; evaluations play its mean.
Observations are standardized by the dataset's mean and std; with ``normalize_reward`` rewards
are scaled by ``1000 / (max episode return - min episode return)``, as CORL does on Gym-MuJoCo.
Defaults are CORL's. Online (``--resume-online``, offline/online.py): the same losses, acting with
actions sampled from the Gaussian, rewards scaled as the dataset's; the actor's cosine schedule goes
on from where the offline run left it, as in CORL's finetune/iql.py.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from omnigym.config import require_fraction, require_positive
from omnigym.errors import require
from omnigym.models.continuous import GaussianActor, QNetwork, StateValueNetwork
from omnigym.offline.datasets import OfflineConfig
from omnigym.offline.online import OnlineFlags, online_settings, train_online
from omnigym.offline.training import (UpdateFlags, network_obs_dim, offline_policy, start_offline_run, train_offline,
                                      update_objective)
from omnigym.optim import Adam
from omnigym.process import scoped_run


@dataclass
class IQLConfig(UpdateFlags, OnlineFlags, OfflineConfig):
    learning_rate: float = 3e-4
    """learning rate of the value function, the Q-networks and (at the start of its schedule) the actor"""
    tau: float = 0.005
    """target network update rate (polyak averaging)"""
    expectile: float = 0.7
    """the expectile V(s) learns of Q(s, a) (0.5: the mean; toward 1: the best action in the data)"""
    beta: float = 3.0
    """inverse temperature of the advantage weights exp(beta * advantage)"""
    exp_adv_max: float = 100.0
    """the advantage weights are clipped to at most this"""
    normalize_reward: bool = True
    """scale rewards by 1000 / (max - min episode return) in the dataset (CORL, Gym-MuJoCo)"""

    RESUME_FIXED = OfflineConfig.RESUME_FIXED + OnlineFlags.RESUME_FIXED + ("normalize_reward",)

    def check(self) -> None:
        super().check()
        self.check_online()
        self.check_update()
        require_positive(self, "learning_rate", "exp_adv_max")
        require_fraction(self, "expectile")
        require(0 < self.tau <= 1, f"--tau must be in (0, 1], got {self.tau}")
        # a negative inverse temperature weights the worst actions most (--beta -3 trained in silence)
        require(self.beta >= 0,
                f"--beta must be 0 or more (the advantage weights' inverse temperature), got {self.beta}")


CONFIG = IQLConfig


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """``mean |expectile - 1(diff < 0)| * diff^2``: positive errors weigh ``expectile``, negative
    ones ``1 - expectile`` (IQL's asymmetric L2 on ``Q - V``)."""
    weight = torch.abs(expectile - (diff < 0).float())
    return (weight * diff.square()).mean()


@scoped_run
def train(cfg: IQLConfig) -> dict:
    cfg, source = online_settings(cfg, "iql")  # --resume-online: the offline run's settings, checked
    data, evaluator, run = start_offline_run(cfg, "iql")
    reward_scale = 1.0
    if cfg.normalize_reward:  # once, on the loaded buffer: the dataset itself is not changed
        spread = float(data.returns.max() - data.returns.min())
        if spread > 0:
            reward_scale = 1000.0 / spread
            data.buffer.rewards *= reward_scale
    device = torch.device(cfg.device)
    obs_dim, action_dim = data.observation_space.shape[0], data.action_space.shape[0]
    actor = GaussianActor(obs_dim, data.action_space, cfg.hidden).to(device)
    qf = QNetwork(obs_dim, action_dim, cfg.hidden, n=2).to(device)  # the twin Q-functions, one batched module
    vf = StateValueNetwork(obs_dim, cfg.hidden).to(device)
    qf_target = copy.deepcopy(qf)
    v_optimizer = Adam(vf.parameters(), lr=cfg.learning_rate)
    q_optimizer = Adam(qf.parameters(), lr=cfg.learning_rate)
    actor_optimizer = Adam(actor.parameters(), lr=cfg.learning_rate)
    actor_schedule = torch.optim.lr_scheduler.CosineAnnealingLR(actor_optimizer, cfg.total_timesteps)
    components = {"actor": actor, "qf": qf, "vf": vf, "qf_target": qf_target, "v_optimizer": v_optimizer,
                  "q_optimizer": q_optimizer, "actor_optimizer": actor_optimizer, "actor_schedule": actor_schedule}
    q_params, target_params = list(qf.parameters()), list(qf_target.parameters())

    optimizers = (v_optimizer, q_optimizer, actor_optimizer)

    def objective(batch: dict) -> tuple[torch.Tensor, dict]:
        obs, actions = batch["obs"], batch["actions"]
        with torch.no_grad():
            target_q = qf_target(obs, actions).min(0).values
            next_v = vf(batch["next_obs"])
        # 1. V(s) toward the expectile of the target Q over the dataset's actions.
        advantage = target_q - vf(obs)
        v_loss = expectile_loss(advantage, cfg.expectile)
        # 2. The twin Q-functions toward r + gamma * V(s').
        target = batch["rewards"] + cfg.gamma * (1.0 - batch["terminated"]) * next_v
        q = qf(obs, actions)
        q_loss = (F.mse_loss(q[0], target) + F.mse_loss(q[1], target)) / 2
        # 3. The actor: advantage-weighted regression onto the dataset's actions.
        weights = torch.exp(cfg.beta * advantage.detach()).clamp(max=cfg.exp_adv_max)
        actor_loss = -(weights * actor.log_prob(obs, actions)).mean()
        # The three losses share no parameter and none reads another's update (the targets, V(s')
        # and the advantage weights are taken before any step), so one backward of their sum gives
        # each network exactly the gradient of its own loss, as three backward passes would.
        return v_loss + q_loss + actor_loss, {
            "losses/value_loss": v_loss.detach(), "losses/qf_loss": q_loss.detach(),
            "losses/actor_loss": actor_loss.detach(), "losses/qf1_values": q[0].detach().mean(),
            "losses/advantage_weight": weights.mean()}

    objective = update_objective(cfg, objective)  # --precision, --compile

    def update(batch: dict, step: int) -> dict:
        loss, metrics = objective(batch)
        for optimizer in optimizers:
            optimizer.zero_grad()
        loss.backward()
        for optimizer in optimizers:
            optimizer.step()
        actor_schedule.step()
        with torch.no_grad():  # the target Q-networks follow
            torch._foreach_lerp_(target_params, q_params, cfg.tau)
        return metrics

    if cfg.resume_online:
        def explore(obs):  # a sample of the Gaussian (clipped to the action box by the loop)
            mean = actor(obs)
            return mean + torch.randn_like(mean) * actor.log_std.clamp(*actor.LOG_STD_RANGE).exp()

        return train_online(cfg, "iql", run, data, evaluator, components, update, actor, explore, source,
                            reward=lambda r: r * reward_scale)
    return train_offline(cfg, "iql", run, data, evaluator, components, update, actor)


def load_policy(cfg: IQLConfig, components: dict, envs, greedy: bool = True):
    """The trained actor's mean action on standardized observations, ``obs (numpy batch) -> actions (numpy)``."""
    return offline_policy(GaussianActor(network_obs_dim(envs), envs.single_action_space,
                                        tuple(cfg.hidden)), components)
