"""Conservative Q-Learning (Kumar et al., 2020), CQL(H), offline, as CORL's cql.py does it; with
``--calibrated``, Cal-QL (Nakamoto et al., 2023) for offline-to-online fine-tuning.

SAC (a tanh-squashed Gaussian actor, twin Q-functions, a learned temperature) on a fixed dataset,
with one term added to each Q-function's loss that pushes down the values of actions the data
does not hold and up those it does:

    cql_i = mean_s [ temp * logsumexp_a (Q_i(s, a) / temp) - Q_i(s, a_data) ]

The logsumexp runs over ``--cql-n-actions`` actions of each of three kinds, at the same state
``s``: uniform random ones, the current policy's at ``s`` and the current policy's at ``s'``.
With ``--cql-importance-sample`` (on) each value first has its sampling density taken off
(``Q - log p(a)``: the uniform's, or the policy's log-prob), so the logsumexp estimates
``log integral exp Q(s, a) da``. The term is weighted by ``--cql-alpha`` (10), or with
``--cql-lagrange`` by ``alpha' * cql_alpha`` where ``alpha'`` rises while the gap exceeds
``--cql-target-action-gap`` (a dual variable, learned).

Cal-QL lower-bounds the policy's sampled values in that logsumexp by a reference value, the
discounted Monte-Carlo return-to-go of the transition's own logged episode: ``max(Q(s, a_pi),
G(s))``. A pessimistic Q can then not fall below what the behaviour policy is known to earn,
which is what makes its values usable as a start for online fine-tuning (``--resume-online``,
offline/online.py). Online transitions get their return-to-go once their episode ends; until then
they are not bounded. ``--sparse-reward``: an episode whose last reward is the dataset's lowest
(a sparse task never solved) gets ``r / (1 - gamma)`` at every step, as Cal-QL and CORL do.

Each gradient step: the actor on ``alpha * log pi(a|s) - min_i Q_i(s, a)``, the temperature
toward the entropy ``-action_dim``, the critics on their TD error toward ``r + gamma * (1 -
terminated) * min_i Q_target_i(s', a')`` plus the CQL term; the targets follow at ``tau``.
Defaults are CORL's (the paper's D4RL settings), its orthogonal Q-network init included.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from omnigym.config import require_non_negative, require_positive
from omnigym.errors import require
from omnigym.models.continuous import QNetwork, SquashedGaussianActor, Temperature
from omnigym.offline.datasets import OfflineConfig
from omnigym.offline.online import OnlineFlags, online_settings, train_online
from omnigym.offline.training import network_obs_dim, offline_policy, start_offline_run, train_offline
from omnigym.optim import Adam
from omnigym.process import scoped_run


@dataclass
class CQLConfig(OnlineFlags, OfflineConfig):
    hidden: tuple[int, ...] = (256, 256, 256)
    """widths of the actor's and the Q-networks' hidden layers (CORL: three of 256)"""
    policy_lr: float = 3e-5
    """learning rate of the actor and the temperature"""
    qf_lr: float = 3e-4
    """learning rate of the Q-networks (and of alpha' with --cql-lagrange)"""
    tau: float = 0.005
    """target network update rate (polyak averaging)"""
    alpha_multiplier: float = 1.0
    """the entropy coefficient is exp(log_alpha) times this (without --autotune: this itself)"""
    autotune: bool = True
    """learn the entropy coefficient toward the target entropy -action_dim"""
    backup_entropy: bool = False
    """subtract alpha * log pi(a'|s') in the TD target (SAC's soft backup; CORL: off)"""
    cql_alpha: float = 10.0
    """weight of the CQL term (with --cql-lagrange: its scale, times the learned alpha')"""
    cql_n_actions: int = 10
    """actions of each kind (random, policy at s, policy at s') in the logsumexp"""
    cql_importance_sample: bool = True
    """take each sampled action's log density off its Q before the logsumexp"""
    cql_temp: float = 1.0
    """temperature of the logsumexp"""
    cql_lagrange: bool = False
    """learn the CQL weight alpha' as a dual variable toward --cql-target-action-gap"""
    cql_target_action_gap: float = -1.0
    """with --cql-lagrange: the gap (logsumexp minus the dataset's Q) the dual variable aims at"""
    cql_clip_diff_min: float | None = None
    """the CQL gap of each sample is clipped to at least this (default: not clipped)"""
    cql_clip_diff_max: float | None = None
    """... and at most this"""
    orthogonal_init: bool = True
    """orthogonal init of the Q-networks (gain sqrt 2, the last layer 1e-2; CORL's)"""
    reward_scale: float = 1.0
    """rewards are learned as reward * scale + bias (CORL's AntMaze setting: 5 and -1); online steps too"""
    reward_bias: float = 0.0
    calibrated: bool = False
    """Cal-QL: the policy's Q values in the CQL term are bounded below by the Monte-Carlo return-to-go"""
    sparse_reward: bool = False
    """Cal-QL: an episode that ends on the dataset's lowest reward is valued r / (1 - gamma) at every step"""

    RESUME_FIXED = OfflineConfig.RESUME_FIXED + OnlineFlags.RESUME_FIXED + ("reward_scale", "reward_bias",
                                                                           "calibrated", "sparse_reward")

    def check(self) -> None:
        super().check()
        OnlineFlags.check_online(self)
        require_positive(self, "policy_lr", "qf_lr", "cql_n_actions", "cql_temp", "reward_scale")
        require_non_negative(self, "cql_alpha", "alpha_multiplier")
        require(0 < self.tau <= 1, f"--tau must be in (0, 1], got {self.tau}")
        require(self.cql_clip_diff_min is None or self.cql_clip_diff_max is None or
                self.cql_clip_diff_min < self.cql_clip_diff_max,
                "--cql-clip-diff-min must be below --cql-clip-diff-max")
        require(self.calibrated or not self.sparse_reward, "--sparse-reward is Cal-QL's rule; give it with "
                                                           "--calibrated")


CONFIG = CQLConfig


class GreedyActor(SquashedGaussianActor):
    """The actor as evaluations and ``omnigym eval`` play it: its squashed mean."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.mode(obs)


def cql_gap(q_data, q_random, q_current, q_next, log_pi_current, log_pi_next, random_log_density: float,
            temp: float, importance_sample: bool) -> torch.Tensor:
    """``temp * logsumexp(Q / temp) - Q(s, a_data)`` per Q-function and sample, ``[n, batch]``.
    ``q_data``: ``[n, batch]``; the sampled actions' ``q_*``: ``[n, batch, k]``; their log
    densities ``[batch, k]`` (the uniform's is one number)."""
    if importance_sample:
        values = torch.cat([q_random - random_log_density, q_next - log_pi_next, q_current - log_pi_current], -1)
    else:  # the plain CQL(H) estimate: every value as it is, the dataset's action among them
        values = torch.cat([q_random, q_data.unsqueeze(-1), q_next, q_current], -1)
    return temp * torch.logsumexp(values / temp, -1) - q_data


def calibrated(q: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Cal-QL's bound: ``max(Q(s, a), reference(s))`` for each sampled action; ``q``: ``[n, batch, k]``,
    ``reference``: ``[batch]``."""
    return torch.maximum(q, reference[:, None])


def returns_to_go(rewards: np.ndarray, terminated: np.ndarray, gamma: float, failure_reward: float | None = None):
    """The discounted return from each step of one episode to its end, ``G_t = r_t + gamma * (1 -
    terminated_t) * G_{t+1}`` (0 past the last logged step). ``failure_reward``: an episode whose last
    reward is it never reached the goal, and is valued as staying there forever, ``r / (1 - gamma)``."""
    if failure_reward is not None and len(rewards) and rewards[-1] == failure_reward:
        return np.full(len(rewards), rewards[-1] / (1.0 - gamma), dtype=np.float32)
    out, following = np.zeros(len(rewards), dtype=np.float32), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        following = float(rewards[t]) + gamma * (1.0 - float(terminated[t])) * following
        out[t] = following
    return out


class ReferenceValues:
    """Cal-QL's reference value of each transition: its episode's return-to-go. The dataset's are
    computed when it is loaded (its episodes lie in the buffer in order); the online ones when their
    episode ends (-inf, no bound, until then), and are checkpointed."""

    def __init__(self, buffer, gamma: float, sparse_reward: bool, online_capacity: int = 0):
        n = int(buffer.added[0])
        rewards, terminated = buffer.rewards[0, :n], buffer.terminated[0, :n]
        # add_episode pushes an episode's observations in a row: a new episode starts where an
        # observation is not the previous transition's next one
        starts = np.flatnonzero(buffer.obs_frame[0, 1:n] != buffer.next_frame[0, :n - 1]) + 1
        self.gamma, self.failure = gamma, float(rewards.min()) if sparse_reward else None
        self.offline = torch.from_numpy(np.concatenate([
            returns_to_go(rewards[a:b], terminated[a:b], gamma, self.failure)
            for a, b in zip([0, *starts], [*starts, n])]))
        self.online = torch.full((max(online_capacity, 1),), -math.inf)
        self.episode_start = 0

    def stepped(self, buffer, episode_over: bool) -> None:
        """After each online transition: an episode that ended gets its returns-to-go."""
        if episode_over:
            end = int(buffer.added[0])
            rows = slice(self.episode_start, end)
            self.online[rows] = torch.from_numpy(returns_to_go(buffer.rewards[0, rows], buffer.terminated[0, rows],
                                                               self.gamma, self.failure))
            self.episode_start = end

    def __call__(self, batch: dict) -> torch.Tensor:
        index, online = batch["index"].cpu(), batch.get("online")
        if online is None:
            return self.offline[index]
        online = online.cpu()
        values = torch.empty(len(index))
        values[~online], values[online] = self.offline[index[~online]], self.online[index[online]]
        return values

    def state_dict(self) -> dict:
        return {"online": self.online, "episode_start": self.episode_start}

    def load_state_dict(self, state: dict) -> None:
        self.online, self.episode_start = state["online"], state["episode_start"]


class CQLWeight(torch.nn.Module):
    """``log alpha'`` of ``--cql-lagrange`` (CORL's: starts at 1)."""

    def __init__(self):
        super().__init__()
        self.log_alpha_prime = torch.nn.Parameter(torch.ones(()))


def orthogonal_init_(qf: QNetwork) -> None:
    """CORL's Q-network init: orthogonal weights (gain sqrt 2; the output layer 1e-2), zero biases."""
    last = len(qf.weights) - 1
    with torch.no_grad():
        for i, (weights, biases) in enumerate(zip(qf.weights, qf.biases)):
            for member in range(len(weights)):
                n_in, n_out = weights.shape[1:]
                weights[member] = torch.nn.init.orthogonal_(torch.empty(n_out, n_in),
                                                            math.sqrt(2) if i < last else 1e-2).T
            biases.zero_()


def q_of_actions(qf: QNetwork, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``Q_i(s, a_j)`` for ``k`` actions per state: ``obs [batch, d]``, ``actions [batch, k, a]`` ->
    ``[n, batch, k]``."""
    batch, k = actions.shape[:2]
    return qf(obs.repeat_interleave(k, 0), actions.reshape(batch * k, -1)).reshape(-1, batch, k)


@scoped_run
def train(cfg: CQLConfig) -> dict:
    cfg, source = online_settings(cfg, "cql")  # --resume-online: the offline run's settings, checked
    data, evaluator, run = start_offline_run(cfg, "cql")
    data.buffer.rewards *= cfg.reward_scale  # once, on the loaded buffer: the dataset itself is not changed
    data.buffer.rewards += cfg.reward_bias
    device = torch.device(cfg.device)
    obs_dim, action_dim = data.observation_space.shape[0], data.action_space.shape[0]
    actor = GreedyActor(obs_dim, data.action_space, cfg.hidden).to(device)
    with torch.no_grad():  # CORL: the policy's output layer starts near zero (xavier, gain 1e-2)
        torch.nn.init.xavier_uniform_(actor.head.weight, 1e-2)
        actor.head.bias.zero_()
    qf = QNetwork(obs_dim, action_dim, cfg.hidden, n=2).to(device)  # the twin Q-functions, one batched module
    if cfg.orthogonal_init:
        orthogonal_init_(qf)
    qf_target = copy.deepcopy(qf)
    temperature, cql_weight = Temperature(1.0, autotune=True).to(device), CQLWeight().to(device)  # CORL's: from 0
    actor_optimizer = Adam(actor.parameters(), lr=cfg.policy_lr)
    q_optimizer = Adam(qf.parameters(), lr=cfg.qf_lr)
    alpha_optimizer = Adam(temperature.parameters(), lr=cfg.policy_lr)
    alpha_prime_optimizer = Adam(cql_weight.parameters(), lr=cfg.qf_lr)
    components = {"actor": actor, "qf": qf, "qf_target": qf_target, "temperature": temperature,
                  "cql_weight": cql_weight, "actor_optimizer": actor_optimizer, "q_optimizer": q_optimizer,
                  "alpha_optimizer": alpha_optimizer, "alpha_prime_optimizer": alpha_prime_optimizer}
    references = ReferenceValues(data.buffer, cfg.gamma, cfg.sparse_reward, cfg.online_steps) \
        if cfg.calibrated else None
    if references is not None:
        components["reference_values"] = references
    low, high = (torch.as_tensor(x, dtype=torch.float32, device=device)
                 for x in (data.action_space.low, data.action_space.high))
    random_log_density = -float(torch.log(high - low).sum())  # the uniform's log density over the action box
    target_entropy = -float(action_dim)
    actor_params, q_params, target_params = (list(m.parameters()) for m in (actor, qf, qf_target))
    k = cfg.cql_n_actions
    clipped = cfg.cql_clip_diff_min is not None or cfg.cql_clip_diff_max is not None

    def update(batch: dict, step: int) -> dict:
        obs, actions, next_obs = batch["obs"], batch["actions"], batch["next_obs"]
        # 1. The actor's and the temperature's losses (SAC's), on the critics before this step.
        pi, log_pi = actor.sample(obs)
        alpha = (temperature.log_alpha.exp().detach() if cfg.autotune else torch.ones(())) * cfg.alpha_multiplier
        actor_loss = (alpha * log_pi - qf(obs, pi).min(0).values).mean()
        alpha_loss = -(temperature.log_alpha * (log_pi.detach() + target_entropy)).mean()

        # 2. The critics: the TD error toward the clipped double-Q target ...
        with torch.no_grad():
            next_actions, next_log_pi = actor.sample(next_obs)
            next_q = qf_target(next_obs, next_actions).min(0).values
            if cfg.backup_entropy:
                next_q = next_q - alpha * next_log_pi
            target = batch["rewards"] + cfg.gamma * (1.0 - batch["terminated"]) * next_q
        q = qf(obs, actions)
        td_loss = (q - target).square().mean(1)  # [2]: each Q-function's

        # ... plus the CQL term over random and policy actions, all valued at s.
        with torch.no_grad():
            size = (len(obs), k, action_dim)
            random_actions = torch.rand(size, device=device) * (high - low) + low
            current_actions, current_log_pi = actor.sample(obs.repeat_interleave(k, 0))
            next_policy_actions, next_policy_log_pi = actor.sample(next_obs.repeat_interleave(k, 0))
        q_random = q_of_actions(qf, obs, random_actions)
        q_current = q_of_actions(qf, obs, current_actions.reshape(size))
        q_next = q_of_actions(qf, obs, next_policy_actions.reshape(size))
        extra = {}
        if references is not None:  # Cal-QL: the policy's values no lower than the return-to-go
            reference = references(batch).to(device)
            extra["losses/bound_rate"] = (q_current < reference[:, None]).float().mean()
            q_current, q_next = calibrated(q_current, reference), calibrated(q_next, reference)
        gap = cql_gap(q, q_random, q_current, q_next, current_log_pi.reshape(size[:2]),
                      next_policy_log_pi.reshape(size[:2]), random_log_density, cfg.cql_temp,
                      cfg.cql_importance_sample)
        if clipped:
            gap = gap.clamp(cfg.cql_clip_diff_min, cfg.cql_clip_diff_max)
        gap = gap.mean(1)  # [2]: each Q-function's
        if cfg.cql_lagrange:  # alpha' rises while the gap is above the target, falls below it
            alpha_prime = cql_weight.log_alpha_prime.exp().clamp(0.0, 1e6)
            alpha_prime_loss = -(alpha_prime * cfg.cql_alpha * (gap.detach() - cfg.cql_target_action_gap)).mean()
            alpha_prime_optimizer.zero_grad()
            alpha_prime_loss.backward()
            alpha_prime_optimizer.step()
            cql_loss = alpha_prime.detach() * cfg.cql_alpha * (gap - cfg.cql_target_action_gap)
            extra.update({"losses/alpha_prime": alpha_prime.detach(), "losses/alpha_prime_loss":
                          alpha_prime_loss.detach()})
        else:
            cql_loss = cfg.cql_alpha * gap
        q_loss = td_loss.sum() + cql_loss.sum()

        # 3. The steps, in CORL's order: temperature, actor, critics; then the targets follow.
        if cfg.autotune:
            alpha_optimizer.zero_grad()
            alpha_loss.backward()
            alpha_optimizer.step()
        actor_optimizer.zero_grad()
        actor_loss.backward(inputs=actor_params)  # no gradients for the Q-networks' weights
        actor_optimizer.step()
        q_optimizer.zero_grad()
        q_loss.backward(inputs=q_params)
        q_optimizer.step()
        with torch.no_grad():
            torch._foreach_lerp_(target_params, q_params, cfg.tau)
        return {"losses/actor_loss": actor_loss.detach(), "losses/qf_loss": q_loss.detach(),
                "losses/td_loss": td_loss.detach().sum(), "losses/cql_gap": gap.detach().mean(),
                "losses/qf1_values": q[0].detach().mean(), "losses/alpha": alpha, "losses/log_pi":
                log_pi.detach().mean(), **extra}

    if cfg.resume_online:
        return train_online(cfg, "cql", run, data, evaluator, components, update, actor,
                            explore=lambda obs: actor.sample(obs)[0], source=source,
                            reward=lambda r: r * cfg.reward_scale + cfg.reward_bias,
                            on_step=references.stepped if references is not None else None)
    return train_offline(cfg, "cql", run, data, evaluator, components, update, actor)


def load_policy(cfg: CQLConfig, components: dict, envs, greedy: bool = True):
    """The trained actor's squashed mean on standardized observations, ``obs (numpy batch) -> actions (numpy)``."""
    return offline_policy(GreedyActor(network_obs_dim(envs), envs.single_action_space,
                                      tuple(cfg.hidden)), components)
