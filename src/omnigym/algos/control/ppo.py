"""Proximal Policy Optimization (Schulman et al., 2017) for control.

Read top to bottom: collect ``num_steps`` from ``num_envs`` envs, estimate advantages
with GAE, then take ``update_epochs`` passes of clipped policy steps over minibatches.
Discrete actions get a categorical head, 1-D boxes a Gaussian head, images a CNN
encoder (models/control.py); the loop below does not change with the action space.

Defaults solve CartPole-v1 in 25-55k steps: RL-Zoo's tuned settings (8 envs x 32 steps,
gamma 0.98, lambda 0.8, no entropy bonus, linear decay) with half the epochs at twice
the learning rate, which halves the compute per step for about the same sample
efficiency (docs/benchmarks.md has the search and the figures). Atari and MuJoCo ids get
the published settings instead (``PRESETS``, printed at start; any flag you give wins).

Continuous actions follow CleanRL's ``ppo_continuous_action``: a state-independent
log-std, separate actor and critic, observations normalized and rewards scaled by running
statistics (both saved in checkpoints; ``omnigym eval`` normalizes with the saved ones),
actions clipped into the env's box at the env boundary only. Discrete actions take the
env's action mask where it gives one (invalid actions get probability 0).

``--runtime ray`` steps the envs on ``--num-generators`` rollout workers (Ray actors) up to
``--max-staleness`` updates ahead of this learner, which recomputes values and pi_old and
corrects for the stale sampler with ``--behaviour-cap`` (runtime/control_workers.py,
docs/scale_out.md). The loop below is the same in both modes.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass

import gymnasium as gym
import torch

from omnigym.config import (ControlConfig, check_compiler, compiled, require_fraction, require_non_negative,
                            require_positive, require_rollout_holds_a_step)
from omnigym.envs.games.symmetry import check_board_size, has_symmetries, no_symmetries, symmetries_of
from omnigym.envs.games.threats import threats_of
from omnigym.envs.vector import make_run_envs
from omnigym.errors import OmnigymError, require
from omnigym.models.control import ActorCritic
from omnigym.optim import Adam, clip_grad_norm
from omnigym.process import scoped_run
from omnigym.rl.advantages import AdvantageConfig, EpisodeEnds, gae, normalize
from omnigym.rl.augment import random_shift
from omnigym.rl.league import League, SelfPlayConfig, check_games_envs
from omnigym.rl.losses import PolicyLossConfig, check_finite, ppo_clip, value_loss
from omnigym.rl.rollout import actor_critic_policy
from omnigym.runtime import RolloutRuntimeConfig
from omnigym.runtime.control_workers import make_control_rollouts
from omnigym.track.episodes import EpisodeStats, close_control_run
from omnigym.track.progress import Clock, ProgressBar, whole_rollouts
from omnigym.track.stopping import checkpoint_due
from omnigym.track.run import start_run


@dataclass
class PPOConfig(SelfPlayConfig, RolloutRuntimeConfig, ControlConfig):
    num_envs: int = 8
    num_steps: int = 32
    """steps per env per rollout"""
    learning_rate: float = 2e-3
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over the run"""
    gamma: float = 0.98
    gae_lambda: float = 0.8
    update_epochs: int = 10
    num_minibatches: int = 1
    clip_coef: float = 0.2
    clip_vloss: bool = False
    """clip the value update like the policy update"""
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    norm_adv: bool = True
    target_kl: float | None = None
    """stop the epochs of an update early once approx-KL exceeds this"""
    desired_kl: float | None = None
    """rsl_rl's adaptive learning rate: after each update, divide it by 1.5 when approx-KL was over twice this,
    multiply by 1.5 when under half (kept in [1e-5, 1e-2]); replaces --anneal-lr (the locomotion preset: 0.01)"""
    normalize_obs: bool = False
    """normalize observations with running statistics (MuJoCo)"""
    normalize_reward: bool = False
    """scale rewards by the running std of the discounted return, clipped to +-10 (MuJoCo)"""
    hidden: tuple[int, ...] = (64, 64)
    image_pad: int = 0
    """images: random shifts of up to this many pixels on each minibatch (DrQ's augmentation, rl/augment.py; 4 is
    DrQ's; 0 = off)"""
    symmetric: bool = False
    """board games: average the policy and value over the board's symmetries (tic-tac-toe's 8 rotations and
    reflections, envs/games/symmetry.py), so what is learnt of a position holds for its mirror images (the
    tictactoe preset's)"""
    compile: bool = False
    """compile the minibatch loss with torch.compile (its backward too): ~25 s to build on a cold cache, then
    1.09x the training SPS on PPO HalfCheetah (docs/benchmarks.md); needs a C++ compiler on CPU (docs/ppo.md)"""

    RESUME_FIXED = ControlConfig.RESUME_FIXED + ("normalize_obs", "normalize_reward", "runtime", "max_staleness",
                                                 "num_generators", "self_play", "symmetric", "league_search_depth",
                                                 "search_depth")  # eval/vs_search/score's opponent
    PRESETS = {
        "atari": ("CleanRL ppo_atari.py, the PPO paper's Atari settings", dict(
            total_timesteps=10_000_000, num_envs=8, num_steps=128, learning_rate=2.5e-4, gamma=0.99, gae_lambda=0.95,
            num_minibatches=4, update_epochs=4, clip_coef=0.1, clip_vloss=True, ent_coef=0.01, vf_coef=0.5,
            max_grad_norm=0.5)),
        "mujoco": ("CleanRL ppo_continuous_action.py, the PPO paper's MuJoCo settings", dict(
            total_timesteps=1_000_000, num_envs=1, num_steps=2048, learning_rate=3e-4, gamma=0.99, gae_lambda=0.95,
            num_minibatches=32, update_epochs=10, clip_coef=0.2, clip_vloss=True, ent_coef=0.0, vf_coef=0.5,
            max_grad_norm=0.5, normalize_obs=True, normalize_reward=True, hidden=(64, 64))),
        # rsl_rl's PPO for legged_gym / Isaac Lab velocity tasks (rsl_rl_ppo_cfg.py): 24 steps x 4096 envs there,
        # 64 envs here (2 CPU cores); ELU (512, 256, 128) there, omnigym's tanh MLP of the same widths here.
        "locomotion": ("rsl_rl PPO as legged_gym / Isaac Lab train quadrupeds, 4096 envs scaled to 64", dict(
            total_timesteps=5_000_000, num_envs=64, num_steps=24, learning_rate=1e-3, desired_kl=0.01, gamma=0.99,
            gae_lambda=0.95, num_minibatches=4, update_epochs=5, clip_coef=0.2, clip_vloss=True, ent_coef=0.01,
            vf_coef=1.0, max_grad_norm=1.0, normalize_obs=True, hidden=(512, 256, 128))),
        # Two-seat board games (docs/games.md): the defaults with a large entropy bonus, which keeps the league's
        # games varied (tic-tac-toe without symmetries: at 0.03 or less self-play collapsed onto a few lines; 0.1
        # reached 0.3-0.45 against the perfect player, its holes moving between evaluations), and a fixed share of
        # games against the random player. Tic-tac-toe's network also averages over the board's 8 symmetries
        # (--symmetric): with them, 0.05 ended at 0.5 against the perfect player on seeds 1 and 2, where 0.1 left
        # seed 2 losing every game to it for 150k steps (a line its league never played); seed 3 still ends at
        # 0.25 (it loses every game as O), docs/games.md.
        "tictactoe": ("omnigym's self-play search on tic-tac-toe, docs/games.md", dict(
            total_timesteps=300_000, num_steps=64, ent_coef=0.05, symmetric=True, latest_share=0.3,
            random_share=0.2, league_every=10, eval_every=20)),
        "connect_four": ("omnigym's self-play search on connect four, docs/games.md", dict(
            total_timesteps=400_000, num_steps=64, ent_coef=0.05, latest_share=0.3, random_share=0.2,
            hidden=(128, 128), league_every=10, eval_every=20, eval_games=50)),
    }

    def check(self) -> None:
        super().check()
        require_positive(self, "num_steps", "learning_rate", "update_epochs", "num_minibatches", "max_grad_norm")
        require_rollout_holds_a_step(self)
        require_non_negative(self, "clip_coef", "ent_coef", "vf_coef")
        require_fraction(self, "gamma", "gae_lambda")
        batch = self.num_steps * self.num_envs
        require(self.num_minibatches <= batch, f"--num-minibatches {self.num_minibatches} is more than the {batch} "
                                               "transitions of a rollout (--num-steps x --num-envs)")
        require(self.target_kl is None or self.target_kl > 0, f"--target-kl must be positive, got {self.target_kl}")
        require(self.desired_kl is None or self.desired_kl > 0, f"--desired-kl must be positive, got {self.desired_kl}")
        require_positive(self, "hidden")
        require_non_negative(self, "image_pad")
        require(not (self.pixels and self.normalize_obs), "--normalize-obs normalizes state vectors; the CNN scales "
                                                          "the frames of --pixels itself")
        self.check_runtime(self.num_envs, "envs of --num-envs, split between the rollout workers")
        require(self.runtime == "ray" or self.behaviour_cap is None,
                "--behaviour-cap corrects for rollouts stepped by an older policy: read by --runtime ray only")
        require(self.num_envs % self.num_generators == 0,
                f"--num-envs {self.num_envs} does not split evenly between --num-generators {self.num_generators} "
                "rollout workers; make it a multiple")
        if self.compile:
            check_compiler(self.device)
        require(not self.symmetric or has_symmetries(self.env_id), no_symmetries(self.env_id))
        # the running statistics are per cell and not symmetric: the averaged views would differ again
        require(not (self.symmetric and self.normalize_obs), "--symmetric averages the policy over the board's "
                "symmetries; --normalize-obs's per-cell statistics are not symmetric and would undo that: leave one out")
        self.check_self_play()

    def preset_field_applies(self, name: str) -> bool:
        """The tictactoe preset's --symmetric is for the boards it knows: the preset on another game
        (connect four) trains without it, as before the flag existed."""
        return (name != "symmetric" or has_symmetries(self.env_id)) and super().preset_field_applies(name)


CONFIG = PPOConfig


@scoped_run
def train(cfg: PPOConfig) -> dict:
    envs, signal = make_run_envs(cfg, "ppo")  # bad ids fail before the run dir exists
    if cfg.preset == "locomotion" and not isinstance(envs.single_action_space, gym.spaces.Box):
        envs.close()
        raise OmnigymError(f"--preset locomotion is for joint-position (Box) actions; {cfg.env_id} has "
                           f"{envs.single_action_space}: use --preset auto or none")
    if cfg.self_play:
        check_games_envs(envs, cfg)
    if cfg.symmetric:
        check_board_size(cfg.env_id, envs, threats_of(cfg))
    run = start_run(cfg, "ppo", cfg.env_id)
    agent = ActorCritic(envs.single_observation_space, envs.single_action_space, cfg.hidden,
                        symmetries_of(cfg)).to(cfg.device)
    # --self-play: the game's other seat is the league's (this policy, its snapshots, random), rl/league.py
    league = League(cfg, envs, agent) if cfg.self_play else None
    optimizer = Adam(agent.parameters(), lr=cfg.learning_rate, eps=1e-5)
    stats = EpisodeStats(cfg.print_episodes)
    batch_size = cfg.num_steps * cfg.num_envs
    num_updates = whole_rollouts(cfg.total_timesteps, cfg.num_envs, cfg.num_steps)
    # sync: a collector on these envs; ray: rollout workers with their own envs (these close)
    rollouts = make_control_rollouts(cfg, "ppo", envs, signal, stats, num_updates)
    components = {"model": agent, "optimizer": optimizer, "episodes": stats, "collector": rollouts,
                  **({"league": league} if league else {})}
    with closing(rollouts):  # the envs, or Ray's workers, end with the run however it ends
        counters = run.begin(components)  # restores the checkpoint when resuming
        global_step, first_update = counters.get("global_step", 0), counters.get("update", 0)
        advantage_cfg = AdvantageConfig(cfg.gamma, cfg.gae_lambda)
        loss_cfg = PolicyLossConfig(clip_low=cfg.clip_coef, behaviour_cap=cfg.behaviour_cap_in_effect())

        objective = minibatch_objective
        if cfg.compile:  # one compiled graph for the forward pass and the losses, and so for their backward
            objective = compiled(minibatch_objective, dynamic=True, what="the minibatch loss")
        progress = ProgressBar(num_updates * batch_size, "ppo", start=global_step, enabled=cfg.progress)
        clock = Clock(global_step)
        rollouts.update_weights(agent.named_parameters(), version=first_update)  # the rollout workers start from the learner's policy
        if counters.get("unlogged") is not None:  # the row of an update whose evaluation a stop cut short
            row = {**counters["unlogged"], **league.evaluate()}
            if league.owed:  # stopped again
                run.save(components, global_step=global_step, update=first_update, unlogged=counters["unlogged"])
            run.log(global_step, row)
            if not league.owed:  # played: a later resume (of a run whose last evaluation this was) owes nothing
                run.save(components, global_step=global_step, update=first_update)
        for update in range(first_update, num_updates):
            if cfg.anneal_lr and cfg.desired_kl is None:
                optimizer.param_groups[0]["lr"] = cfg.learning_rate * (1.0 - update / num_updates)

            # 1. Roll out the current policy (ray: a rollout up to K versions old, with values and
            # pi_old recomputed by this policy); 2. estimate advantages (GAE bootstraps from the
            # final observation's value on truncation, not on termination). The estimators take
            # [envs, steps]; a rollout is [steps, envs].
            rollout, global_step = rollouts.collect(agent, update, global_step)
            progress.update(global_step, sps=int(clock.sps(global_step)), **stats.shown())  # before a long update
            ends = EpisodeEnds(rollout.terminated.T, rollout.truncated.T, rollout.bootstrap_values.T)
            advantages, returns = gae(rollout.rewards.T, rollout.valid.T, values=rollout.values.T, cfg=advantage_cfg,
                                      ends=ends)
            advantages, returns = advantages.T, returns.T

            # 3. Clipped policy steps over the valid transitions.
            b_obs, b_actions, b_logprobs, b_values, b_advantages, b_returns, b_masks, b_behaviour = (
                None if x is None else x.to(cfg.device) for x in rollout.flat(
                    rollout.obs, rollout.actions, rollout.logprobs, rollout.values, advantages, returns, rollout.masks,
                    rollout.behaviour_logprobs))
            n = len(b_obs)
            minibatch = max(n // cfg.num_minibatches, 1)
            clip_fractions, stop_early = [], False
            batch = (b_obs, b_actions, b_masks, b_logprobs, b_values, b_advantages, b_returns, b_behaviour)
            for _ in range(cfg.update_epochs):
                # One gather per tensor and epoch; each minibatch is then a slice (a view, no copy).
                order = torch.randperm(n, device=cfg.device)
                shuffled = [None if x is None else x[order] for x in batch]
                for begin in range(0, n, minibatch):
                    loss, pg_loss, pg_stats, v_loss, entropy_loss = objective(
                        agent, cfg, loss_cfg, *(None if x is None else x[begin:begin + minibatch] for x in shuffled))
                    check_finite(loss, global_step)
                    optimizer.zero_grad()
                    loss.backward()
                    clip_grad_norm(agent.parameters(), cfg.max_grad_norm)
                    optimizer.step()
                    clip_fractions.append(pg_stats["clip_fraction"])
                if cfg.target_kl is not None and pg_stats["approx_kl"].item() > cfg.target_kl:
                    stop_early = True
                    break

            if cfg.desired_kl is not None:  # rsl_rl's adaptive schedule (the lr lives in the optimizer's checkpoint)
                kl, lr = pg_stats["approx_kl"].item(), optimizer.param_groups[0]["lr"]
                lr = lr / 1.5 if kl > 2 * cfg.desired_kl else lr * 1.5 if kl < cfg.desired_kl / 2 else lr
                optimizer.param_groups[0]["lr"] = min(max(lr, 1e-5), 1e-2)

            rollouts.update_weights(agent.named_parameters(), version=update + 1)  # ray: the workers step on with the new policy

            # 4. Log, show, checkpoint.
            variance = b_returns.var()
            explained_variance = float("nan") if variance == 0 else (1 - (b_returns - b_values).var() / variance).item()
            row = {
                **stats.drain(),
                "losses/policy_loss": pg_loss.item(), "losses/value_loss": v_loss.item(),
                "losses/entropy": entropy_loss.item(), "losses/approx_kl": pg_stats["approx_kl"].item(),
                "losses/clip_fraction": torch.stack(clip_fractions).mean().item(),
                "losses/explained_variance": explained_variance, "losses/early_stop": int(stop_early),
                "charts/learning_rate": optimizer.param_groups[0]["lr"], "perf/sps": clock.sps(global_step),
                **rollouts.metrics(),
                **(league.after_update(update + 1, last=update == num_updates - 1) if league else {}),
            }
            if league and league.owed:  # a stop cut the evaluation short: the resumed run plays it, then logs this row
                run.save(components, global_step=global_step, update=update + 1, unlogged=row)
            run.log(global_step, row)
            if update == num_updates - 1 or checkpoint_due(global_step, global_step - batch_size, cfg.checkpoint_every):
                run.save(components, global_step=global_step, update=update + 1)
        progress.close()
    return close_control_run(run, stats, cfg.plot, global_step, stepped=num_updates * batch_size)


def minibatch_objective(agent, cfg: PPOConfig, loss_cfg: PolicyLossConfig, obs, actions, masks, old_logprobs,
                        old_values, advantages, returns, behaviour_logprobs=None):
    """PPO's loss on one minibatch: ``(loss, policy loss, policy stats, value loss, entropy)``.
    ``behaviour_logprobs``: the rollout workers' (``--runtime ray``), for the --behaviour-cap weight."""
    if cfg.image_pad and obs.dtype == torch.uint8:  # the rollout's policy saw the unshifted frames
        obs = random_shift(obs, cfg.image_pad)
    _, new_logprob, entropy, new_value = agent.act(obs, actions, masks)
    if cfg.norm_adv:
        advantages = normalize(advantages)
    pg_loss, pg_stats = ppo_clip(new_logprob, old_logprobs, advantages, cfg=loss_cfg,
                                 behaviour_logprobs=behaviour_logprobs)
    v_loss = value_loss(new_value, old_values, returns, clip=cfg.clip_coef if cfg.clip_vloss else None)
    entropy_loss = entropy.mean()
    loss = pg_loss - cfg.ent_coef * entropy_loss + cfg.vf_coef * v_loss
    return loss, pg_loss, pg_stats, v_loss, entropy_loss


def load_policy(cfg: PPOConfig, components: dict, envs, greedy: bool = False):
    """The trained policy as ``obs (numpy batch) -> actions (numpy)`` for evaluation."""
    return actor_critic_policy(cfg.hidden, components, envs, greedy, symmetries_of(cfg))
