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

from omnigym.config import ControlConfig, require_fraction, require_non_negative, require_positive, require_rollout_holds_a_step
from omnigym.envs.vector import make_run_envs
from omnigym.models.control import ActorCritic
from omnigym.optim import Adam, clip_grad_norm
from omnigym.process import scoped_run
from omnigym.rl.advantages import AdvantageConfig, EpisodeEnds, discounted_returns, normalize
from omnigym.rl.losses import check_finite, reinforce, value_loss
from omnigym.rl.rollout import RolloutCollector, actor_critic_policy
from omnigym.track.episodes import EpisodeStats, close_control_run
from omnigym.track.progress import Clock, ProgressBar, whole_rollouts
from omnigym.track.stopping import checkpoint_due
from omnigym.track.run import start_run


@dataclass
class ReinforceConfig(ControlConfig):
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

    def check(self) -> None:
        super().check()
        require_positive(self, "num_steps", "learning_rate", "max_grad_norm")
        require_rollout_holds_a_step(self)
        require_non_negative(self, "ent_coef", "vf_coef")
        require_fraction(self, "gamma")
        require_positive(self, "hidden")


CONFIG = ReinforceConfig


@scoped_run
def train(cfg: ReinforceConfig) -> dict:
    envs, signal = make_run_envs(cfg, "reinforce")  # bad ids fail before the run dir exists
    run = start_run(cfg, "reinforce", cfg.env_id)
    agent = ActorCritic(envs.single_observation_space, envs.single_action_space, cfg.hidden).to(cfg.device)
    optimizer = Adam(agent.parameters(), lr=cfg.learning_rate)
    stats = EpisodeStats(cfg.print_episodes)
    collector = RolloutCollector(envs, cfg.num_steps, stats, cfg.device, cfg.seed, signal=signal)
    components = {"model": agent, "optimizer": optimizer, "episodes": stats, "collector": collector}
    counters = run.begin(components)  # restores the checkpoint when resuming
    global_step, first_update = counters.get("global_step", 0), counters.get("update", 0)
    batch_size = cfg.num_steps * cfg.num_envs
    num_updates = whole_rollouts(cfg.total_timesteps, cfg.num_envs, cfg.num_steps)

    progress = ProgressBar(num_updates * batch_size, "reinforce", start=global_step, enabled=cfg.progress)
    clock = Clock(global_step)
    for update in range(first_update, num_updates):
        rollout, global_step = collector.collect(agent, global_step)
        progress.update(global_step, sps=int(clock.sps(global_step)), **stats.shown())  # before a long update
        # Without a baseline the critic is never trained, so its values (used only past the
        # rollout's end) are zeroed: plain REINFORCE cuts the return there. The estimator
        # takes [envs, steps]; a rollout is [steps, envs].
        bootstrap = rollout.bootstrap_values if cfg.baseline else torch.zeros_like(rollout.bootstrap_values)
        advantages, returns = discounted_returns(
            rollout.rewards.T, rollout.valid.T, values=rollout.values.T if cfg.baseline else None,
            cfg=AdvantageConfig(gamma=cfg.gamma), ends=EpisodeEnds(rollout.terminated.T, rollout.truncated.T, bootstrap.T))
        obs, actions, b_advantages, b_returns, b_values, masks = rollout.flat(
            rollout.obs, rollout.actions, advantages.T, returns.T, rollout.values, rollout.masks)
        _, logprob, entropy, value = agent.act(obs.to(cfg.device), actions.to(cfg.device),
                                               None if masks is None else masks.to(cfg.device))
        adv = normalize(b_advantages) if cfg.norm_adv else b_advantages
        pg_loss, _ = reinforce(logprob, logprob.detach(), adv.to(cfg.device))
        loss = pg_loss - cfg.ent_coef * entropy.mean()
        if cfg.baseline:
            v_loss = value_loss(value, b_values, b_returns.to(cfg.device))
            loss = loss + cfg.vf_coef * v_loss
        check_finite(loss, global_step)
        optimizer.zero_grad()
        loss.backward()
        clip_grad_norm(agent.parameters(), cfg.max_grad_norm)
        optimizer.step()

        metrics = {**stats.drain(), "losses/policy_loss": pg_loss.item(), "losses/entropy": entropy.mean().item(),
                   "perf/sps": clock.sps(global_step)}
        if cfg.baseline:
            metrics["losses/value_loss"] = v_loss.item()
        run.log(global_step, metrics)
        if update == num_updates - 1 or checkpoint_due(global_step, global_step - batch_size, cfg.checkpoint_every):
            run.save(components, global_step=global_step, update=update + 1)
    progress.close()
    collector.envs.close()
    return close_control_run(run, stats, cfg.plot, global_step, stepped=num_updates * batch_size)


def load_policy(cfg: ReinforceConfig, components: dict, envs, greedy: bool = False):
    """The trained policy as ``obs (numpy batch) -> actions (numpy)`` for evaluation."""
    return actor_critic_policy(cfg.hidden, components, envs, greedy)
