"""REINFORCE (Williams, 1992): the policy gradient with Monte-Carlo returns.

Each update collects ``num_steps`` from every env, computes the discounted return of
each step (to the episode's end, or to the rollout's end where the critic's value
stands in for the rest), and takes one step on ``-log pi(a|s) * advantage``. With
``--baseline`` a learned value function is subtracted from the return, which lowers
the variance without adding bias.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omnigym.algos.common import Clock, CommonConfig, EpisodeStats, due, finish, save_on_policy, start, start_on_policy
from omnigym.algos.ppo import load_policy  # same network, same checkpoint layout
from omnigym.envs.vector import make_vec
from omnigym.models.control import ActorCritic
from omnigym.rl.advantages import discounted_returns, normalize
from omnigym.rl.losses import check_finite, masked_mean, value_loss
from omnigym.rl.optim import Adam
from omnigym.track.progress import ProgressBar

__all__ = ["ReinforceConfig", "train", "load_policy"]


@dataclass
class ReinforceConfig(CommonConfig):
    num_envs: int = 8
    num_steps: int = 256
    """steps per env per update; long enough to hold whole episodes"""
    learning_rate: float = 2e-3
    gamma: float = 0.99
    baseline: bool = True
    """subtract a learned value baseline from the returns"""
    norm_adv: bool = True
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    hidden: tuple[int, ...] = (64, 64)


def train(cfg: ReinforceConfig) -> dict:
    envs = make_vec(cfg.env_id, cfg.num_envs, backend=cfg.backend, seed=cfg.seed)  # bad ids fail before the run dir exists
    run = start(cfg, "reinforce")
    agent = ActorCritic(envs.single_observation_space, envs.single_action_space, cfg.hidden).to(cfg.device)
    optimizer = Adam(agent.parameters(), lr=cfg.learning_rate)
    stats = EpisodeStats(cfg.print_episodes)
    batch_size = cfg.num_steps * cfg.num_envs
    num_updates = max(cfg.total_timesteps // batch_size, 1)
    envs, collector, global_step, first_update = start_on_policy(run, cfg, envs, agent, optimizer, stats)

    progress = ProgressBar(num_updates * batch_size, "reinforce", start=global_step, enabled=cfg.progress)
    clock = Clock(global_step)
    for update in range(first_update, num_updates):
        rollout, global_step = collector.collect(agent, global_step)
        # Without a baseline the critic is never trained, so its values (used only past the
        # rollout's end) are zeroed: plain REINFORCE cuts the return there.
        bootstrap = rollout.bootstrap_values if cfg.baseline else torch.zeros_like(rollout.bootstrap_values)
        advantages, returns = discounted_returns(rollout.rewards, rollout.values if cfg.baseline else None, bootstrap,
                                                 rollout.terminated, rollout.truncated, cfg.gamma)
        obs, actions, b_advantages, b_returns, b_values = rollout.flat(rollout.obs, rollout.actions, advantages,
                                                                       returns, rollout.values)
        _, logprob, entropy, value = agent.act(obs.to(cfg.device), actions.to(cfg.device))
        adv = normalize(b_advantages) if cfg.norm_adv else b_advantages
        pg_loss = -masked_mean(logprob * adv.to(cfg.device))
        loss = pg_loss - cfg.ent_coef * entropy.mean()
        if cfg.baseline:
            v_loss = value_loss(value, b_values, b_returns.to(cfg.device))
            loss = loss + cfg.vf_coef * v_loss
        check_finite(loss, global_step)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(optimizer.params, cfg.max_grad_norm)
        optimizer.step()

        metrics = {**stats.drain(), "losses/policy_loss": pg_loss.item(), "losses/entropy": entropy.mean().item(),
                   "perf/sps": clock.sps(global_step)}
        if cfg.baseline:
            metrics["losses/value_loss"] = v_loss.item()
        run.log(global_step, metrics)
        progress.update(global_step, sps=int(clock.sps(global_step)), ret=stats.mean_recent)
        if update == num_updates - 1 or due(global_step, global_step - batch_size, cfg.checkpoint_every):
            save_on_policy(run, envs, agent, optimizer, stats, collector, global_step, update + 1)
    progress.close()
    envs.close()
    return finish(run, stats, cfg, global_step)
