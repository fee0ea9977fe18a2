"""MAPPO (Yu et al., 2022, "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games"):
PPO for a cooperative team, one policy shared by every agent, one centralised critic.

Read top to bottom: ``num_envs`` team envs (PettingZoo's parallel API, envs/parallel_agents.py)
step ``num_steps`` times with every agent acting at once; each agent's advantage is GAE over its
own row of rewards and values; then ``update_epochs`` passes of PPO's clipped step over the
agent-steps. What makes it MAPPO rather than PPO run once per agent:

- **parameter sharing**: one actor for all agents, which sees only its own observation and
  the agent's id as a one-hot (so that agents can still act differently);
- **a centralised value**: the critic sees the global state, every agent's observation joined
  (MAPPO's ``share_obs`` for MPE), plus the agent's id. It is used in training only: acting
  needs the actor alone (centralised training, decentralised execution);
- **the team reward**: every agent learns from the sum of the agents' rewards at each step,
  as MAPPO's MPE envs give it (``--no-team-reward``: each agent's own reward);
- **value normalisation** (the paper's ValueNorm): the critic predicts returns standardised
  by their running mean and std, which are kept in the checkpoint.

The defaults are the MPE settings of the paper's code (marlbenchmark/on-policy: lr 7e-4, 10
epochs, 1 minibatch, clip 0.2, entropy 0.01, gamma 0.99, GAE lambda 0.95, gradient norm 10,
episodes of 25 steps) except for the batch: 16 envs here where it steps 128, for a 2-core CPU.
docs/mappo.md has the figures beside the published one, and what differs.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from omnigym.config import RunConfig, require_fraction, require_non_negative, require_positive
from omnigym.envs.parallel_agents import TeamEnvs
from omnigym.envs.vector import parse_env_kwargs
from omnigym.errors import require
from omnigym.models.control import CategoricalHead, mlp, torso
from omnigym.optim import Adam, clip_grad_norm
from omnigym.process import scoped_run
from omnigym.rl.advantages import AdvantageConfig, EpisodeEnds, gae, normalize
from omnigym.rl.losses import PolicyLossConfig, check_finite, ppo_clip, value_loss
from omnigym.rl.running_stats import RunningMeanStd
from omnigym.track.episodes import EpisodeStats, close_control_run
from omnigym.track.progress import Clock, ProgressBar, whole_rollouts
from omnigym.track.run import start_run
from omnigym.track.stopping import checkpoint_due


@dataclass
class MAPPOConfig(RunConfig):
    env_id: str = "pettingzoo/simple_spread_v3"
    """a cooperative PettingZoo parallel env, pettingzoo/NAME (MPE's from mpe2)"""
    env_kwargs: tuple[str, ...] = ()
    """KEY=VALUE settings for the env's constructor, e.g. N=3 max_cycles=25 local_ratio=0.5 (simple_spread's
    defaults)"""
    total_timesteps: int = 300_000
    """env steps to train for (each moves every agent), summed over the envs"""
    num_envs: int = 16
    num_steps: int = 25
    """steps per env per rollout (25: one simple_spread episode)"""
    checkpoint_every: int = 50_000
    """env steps between checkpoints (one is always written at the end); 0 writes only the last"""
    print_episodes: bool = False
    """print one line per finished episode (global_step=..., episodic_return=...)"""
    learning_rate: float = 7e-4
    anneal_lr: bool = False
    """decay the learning rate linearly to 0 over the run"""
    gamma: float = 0.99
    gae_lambda: float = 0.95
    update_epochs: int = 10
    num_minibatches: int = 1
    clip_coef: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 1.0
    max_grad_norm: float = 10.0
    hidden: tuple[int, ...] = (64, 64)
    team_reward: bool = True
    """every agent learns from the sum of all agents' rewards (MAPPO's shared reward); off: its own reward"""
    agent_id: bool = True
    """actor and critic see the agent's id as a one-hot beside their input"""
    value_norm: bool = True
    """the critic predicts returns standardised by their running mean and std (MAPPO's ValueNorm)"""

    RESUME_FIXED = RunConfig.RESUME_FIXED + ("env_id", "env_kwargs", "num_envs", "hidden", "agent_id", "value_norm",
                                          "team_reward")  # the rewards each agent learns from
    SAVED_REQUIRED = ("env_id",)
    BUDGET = ("total_timesteps", "global_step")

    def check(self) -> None:
        super().check()
        require_positive(self, "total_timesteps", "num_envs", "num_steps", "learning_rate", "update_epochs",
                         "num_minibatches", "max_grad_norm", "hidden")
        require_non_negative(self, "checkpoint_every", "clip_coef", "ent_coef", "vf_coef")
        require_fraction(self, "gamma", "gae_lambda")
        batch = self.num_steps * self.num_envs
        require(self.num_minibatches <= batch, f"--num-minibatches {self.num_minibatches} is more than the {batch} "
                                               "env steps of a rollout (--num-steps x --num-envs)")


CONFIG = MAPPOConfig


class TeamActorCritic(nn.Module):
    """The shared actor (own observation + agent id -> action logits) and the centralised critic
    (joined observations + agent id -> value). Inputs are ``[..., agents, obs]``, the agents of one
    env-step together, so that the critic can join them; outputs are ``[..., agents]``."""

    def __init__(self, obs_dim: int, num_agents: int, n_actions: int, hidden: tuple[int, ...], agent_id: bool = True):
        super().__init__()
        self.num_agents, self.agent_id = num_agents, agent_id
        ids = num_agents if agent_id else 0
        self.actor = nn.Sequential(*torso(obs_dim + ids, hidden))
        self.head = CategoricalHead(hidden[-1], n_actions)
        self.critic = mlp(obs_dim * num_agents + ids, hidden, 1, out_gain=1.0)

    def _with_id(self, x: torch.Tensor) -> torch.Tensor:
        if not self.agent_id:
            return x
        eye = torch.eye(self.num_agents, dtype=x.dtype, device=x.device).expand(*x.shape[:-1], self.num_agents)
        return torch.cat([x, eye], -1)

    def actor_input(self, obs: torch.Tensor) -> torch.Tensor:
        return self._with_id(obs)

    def critic_input(self, obs: torch.Tensor) -> torch.Tensor:
        """The global state, the same for every agent of an env-step, beside that agent's id."""
        state = obs.flatten(-2).unsqueeze(-2).expand(*obs.shape[:-1], obs.shape[-1] * self.num_agents)
        return self._with_id(state)

    def act(self, actor_in: torch.Tensor, action=None):
        """``(action, log_prob, entropy)``, each shaped as ``actor_in`` without its last axis."""
        features = self.actor(actor_in)
        flat = self.head.sample(features.reshape(-1, features.shape[-1]), None if action is None else action.reshape(-1))
        return tuple(x.reshape(actor_in.shape[:-1]) for x in flat)

    def value(self, critic_in: torch.Tensor) -> torch.Tensor:
        return self.critic(critic_in).squeeze(-1)

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head.mode(self.actor(self.actor_input(obs)))


class ValueNorm:
    """Returns standardised by their running mean and std: the critic learns the standardised
    value, GAE uses it mapped back (``denormalize``). Off: both maps are the identity."""

    def __init__(self, enabled: bool):
        self.enabled, self.stats = enabled, RunningMeanStd()

    def update(self, returns: torch.Tensor) -> None:
        if self.enabled:
            self.stats.update(returns.reshape(-1).double().numpy())

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return x
        return (x - float(self.stats.mean)) / float(np.sqrt(self.stats.var + 1e-8))

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return x
        return x * float(np.sqrt(self.stats.var + 1e-8)) + float(self.stats.mean)

    def state_dict(self) -> dict:
        return self.stats.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.stats.load_state_dict(state)


def per_agent_gae(rewards, values, bootstrap, terminated, truncated, cfg: AdvantageConfig):
    """GAE for each agent of each env on its own row: ``rewards``, ``values``, ``bootstrap`` are
    ``[steps, envs, agents]``, ``terminated``/``truncated`` ``[steps, envs]`` (an episode ends
    for the whole team). Returns ``(advantages, returns)``, ``[steps, envs, agents]``."""
    steps, envs, agents = rewards.shape

    def rows(x):  # [steps, envs, agents] -> [envs * agents, steps], the estimator's layout
        return x.permute(1, 2, 0).reshape(envs * agents, steps)

    def team(x):  # an env's end is each of its agents' end
        return rows(x.unsqueeze(-1).expand(steps, envs, agents))

    ends = EpisodeEnds(team(terminated), team(truncated), rows(bootstrap))
    advantages, returns = gae(rows(rewards), torch.ones(envs * agents, steps), values=rows(values), cfg=cfg, ends=ends)

    def back(x):
        return x.reshape(envs, agents, steps).permute(2, 0, 1)

    return back(advantages), back(returns)


@scoped_run
def train(cfg: MAPPOConfig) -> dict:
    envs = TeamEnvs(cfg.env_id, cfg.num_envs, cfg.seed, parse_env_kwargs(cfg.env_kwargs))  # bad ids: before the run dir
    with closing(envs):  # the envs end with the run however it ends
        return train_on(envs, cfg)


def train_on(envs: TeamEnvs, cfg: MAPPOConfig) -> dict:
    run = start_run(cfg, "mappo", cfg.env_id)
    agent = TeamActorCritic(envs.obs_dim, envs.num_agents, envs.n_actions, cfg.hidden, cfg.agent_id).to(cfg.device)
    optimizer = Adam(agent.parameters(), lr=cfg.learning_rate, eps=1e-5)
    value_norm = ValueNorm(cfg.value_norm)
    stats = EpisodeStats(cfg.print_episodes)
    components = {"model": agent, "optimizer": optimizer, "value_norm": value_norm, "episodes": stats}
    counters = run.begin(components)  # restores the checkpoint when resuming
    global_step, first_update = counters.get("global_step", 0), counters.get("update", 0)
    batch_size = cfg.num_steps * cfg.num_envs
    num_updates = whole_rollouts(cfg.total_timesteps, cfg.num_envs, cfg.num_steps)
    advantage_cfg = AdvantageConfig(cfg.gamma, cfg.gae_lambda)
    loss_cfg = PolicyLossConfig(clip_low=cfg.clip_coef)
    progress = ProgressBar(num_updates * batch_size, "mappo", start=global_step, enabled=cfg.progress)
    clock = Clock(global_step)
    # A resumed run starts new episodes: its envs' states are not in the checkpoint.
    obs = torch.from_numpy(envs.reset()).to(cfg.device)
    T, E, A = cfg.num_steps, cfg.num_envs, envs.num_agents

    def value_of(o):  # the critic's value in return units
        return value_norm.denormalize(agent.value(agent.critic_input(o)))

    for update in range(first_update, num_updates):
        if cfg.anneal_lr:
            optimizer.param_groups[0]["lr"] = cfg.learning_rate * (1.0 - update / num_updates)

        # 1. Roll out: every agent of every env acts from its own observation.
        all_obs = torch.zeros(T, E, A, envs.obs_dim, device=cfg.device)
        actions, logprobs, rewards = (torch.zeros(T, E, A, device=cfg.device) for _ in range(3))
        values, bootstrap = torch.zeros(T + 1, E, A, device=cfg.device), torch.zeros(T, E, A, device=cfg.device)
        terminated, truncated = torch.zeros(T, E, dtype=torch.bool), torch.zeros(T, E, dtype=torch.bool)
        for t in range(T):
            with torch.no_grad():
                action, logprob, _ = agent.act(agent.actor_input(obs))
                values[t] = value_of(obs)
            all_obs[t], actions[t], logprobs[t] = obs, action, logprob
            next_obs, step_rewards, term, trunc, final_obs, episodes = envs.step(action.cpu().numpy())
            step_rewards = torch.from_numpy(step_rewards)
            rewards[t] = step_rewards.sum(-1, keepdim=True).expand(E, A) if cfg.team_reward else step_rewards
            terminated[t], truncated[t] = torch.from_numpy(term), torch.from_numpy(trunc)
            if trunc.any():  # a cut-off episode bootstraps from its last state's value
                with torch.no_grad():
                    bootstrap[t, truncated[t]] = value_of(torch.from_numpy(final_obs[trunc]).to(cfg.device))
            obs = torch.from_numpy(next_obs).to(cfg.device)
            global_step += E
            stats.add_episodes(episodes, global_step)
        progress.update(global_step, sps=int(clock.sps(global_step)), **stats.shown())
        with torch.no_grad():
            values[T] = value_of(obs)
        ended = (terminated | truncated).unsqueeze(-1)
        bootstrap = torch.where(ended.to(cfg.device), bootstrap, values[1:])

        # 2. GAE per agent, on the team's (or the agent's own) reward.
        advantages, returns = per_agent_gae(rewards.cpu(), values[:-1].cpu(), bootstrap.cpu(), terminated, truncated,
                                            advantage_cfg)
        value_norm.update(returns)

        # 3. Clipped policy steps over the agent-steps; one policy for all agents.
        with torch.no_grad():
            b_actor_in = agent.actor_input(all_obs).reshape(T * E * A, -1)
            b_critic_in = agent.critic_input(all_obs).reshape(T * E * A, -1)
        b_actions, b_logprobs = actions.reshape(-1), logprobs.reshape(-1)
        b_advantages, b_returns = advantages.reshape(-1).to(cfg.device), returns.reshape(-1).to(cfg.device)
        b_targets = value_norm.normalize(b_returns)
        n = len(b_actions)
        minibatch = max(n // cfg.num_minibatches, 1)
        clip_fractions = []
        for _ in range(cfg.update_epochs):
            order = torch.randperm(n, device=cfg.device)
            for begin in range(0, n, minibatch):
                idx = order[begin:begin + minibatch]
                _, new_logprob, entropy = agent.act(b_actor_in[idx], b_actions[idx])
                mb_advantages = normalize(b_advantages[idx])
                pg_loss, pg_stats = ppo_clip(new_logprob, b_logprobs[idx], mb_advantages, cfg=loss_cfg)
                new_value = agent.value(b_critic_in[idx])
                v_loss = value_loss(new_value, None, b_targets[idx])
                entropy_loss = entropy.mean()
                loss = pg_loss - cfg.ent_coef * entropy_loss + cfg.vf_coef * v_loss
                check_finite(loss, global_step)
                optimizer.zero_grad()
                loss.backward()
                clip_grad_norm(agent.parameters(), cfg.max_grad_norm)
                optimizer.step()
                clip_fractions.append(pg_stats["clip_fraction"])

        # 4. Log, show, checkpoint.
        run.log(global_step, {
            **stats.drain(),
            "losses/policy_loss": pg_loss.item(), "losses/value_loss": v_loss.item(),
            "losses/entropy": entropy_loss.item(), "losses/approx_kl": pg_stats["approx_kl"].item(),
            "losses/clip_fraction": torch.stack(clip_fractions).mean().item(),
            "charts/learning_rate": optimizer.param_groups[0]["lr"], "perf/sps": clock.sps(global_step),
        })
        if update == num_updates - 1 or checkpoint_due(global_step, global_step - batch_size, cfg.checkpoint_every):
            run.save(components, global_step=global_step, update=update + 1)
    progress.close()
    return close_control_run(run, stats, cfg.plot, global_step, stepped=num_updates * batch_size)
