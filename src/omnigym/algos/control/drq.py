"""DrQ: Soft Actor-Critic from pixels with random-shift augmentation (Kostrikov, Yarats & Fergus, 2020).

SAC (algos/control/sac.py has the state version) on stacked rendered frames (``--pixels``,
envs/pixels.py), with DrQ's three changes:

1. **One CNN encoder shared by actor and critic, trained by the critic only** (models/
   pixel_encoder.py): the critic's loss back-propagates into the encoder; the actor reads
   the encoder's output detached, so its loss trains the actor's own trunk and MLP only.
2. **Random shifts** (rl/augment.py, pad 4, a shift per sample, as DrQ-v2 applies them) on
   the observations and the next observations of every replayed batch: the Q-target is
   computed on shifted next frames, the Q-values on shifted frames. One shift each (DrQ's
   K = M = 1; DrQ-v2 uses only that).
3. **A target encoder**: the target critic (encoder, trunk, twin Q) follows the critic by
   Polyak averaging at rate ``tau`` every ``target_update_frequency`` updates.

After ``learning_starts`` frames of uniform random actions, each agent step (every
``update_every``) takes one step on the twin soft Q-functions toward

    y = r + gamma * (1 - terminated) * (min_i Q_target_i(s', a') - alpha * log pi(a'|s')),  a' ~ pi(.|s'),

and every ``actor_update_frequency`` updates one actor step on ``alpha * log pi - min_i Q_i``
(on the critic's features of the same shifted frames, detached, as DrQ-v2 does) and one
temperature step toward the entropy target ``-action_dim``.

Counting: ``--total-timesteps``, ``--learning-starts``, ``--log-every`` and the metrics' steps
are **frames** (simulator steps: agent steps x ``--action-repeat``), the unit of DrQ's and
PlaNet's benchmark tables; ``--buffer-size`` counts transitions (agent steps).

Defaults are DrQ's (its repository's config.yaml and the paper's Appendix): lr 1e-3 for
actor, critic and temperature, batch 128 (the paper's figures use 512), initial temperature
0.1, tau 0.01 with target and actor updates every 2 steps, 50 features, two hidden layers of
1024, a 100k-transition replay, 3 stacked 84 x 84 frames, pad 4; ``learning_starts`` is
DrQ-v2's 4000 frames.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from omnigym.config import (ControlConfig, require_buffer_holds_a_batch, require_fraction, require_non_negative,
                            require_positive)
from omnigym.envs.cursor import EnvCursor
from omnigym.envs.pixels import frames_per_step
from omnigym.envs.vector import make_run_envs
from omnigym.errors import OmnigymError, require
from omnigym.models.pixel_encoder import PixelActor, PixelCritic
from omnigym.optim import Adam
from omnigym.process import scoped_run
from omnigym.rl.augment import random_shift
from omnigym.rl.losses import check_finite
from omnigym.rl.replay import Replay, ReplayBuffer
from omnigym.track.episodes import EpisodeStats, close_control_run
from omnigym.track.progress import Clock, ProgressBar, crossed_multiple
from omnigym.track.stopping import checkpoint_due
from omnigym.track.run import start_run


@dataclass
class DrQConfig(ControlConfig):
    env_id: str = "dm_control/cartpole-swingup-v0"
    total_timesteps: int = 500_000
    """frames to train for (agent steps x --action-repeat): the PlaNet benchmark's 500k"""
    num_envs: int = 1
    pixels: bool = True
    """DrQ learns from pixels only"""
    frame_stack: int = 3
    buffer_size: int = 100_000
    """transitions (agent steps) the replay holds; each frame is stored once"""
    gamma: float = 0.99
    tau: float = 0.01
    """target critic (encoder included) update rate"""
    batch_size: int = 128
    learning_starts: int = 4000
    """frames of uniform random actions before learning starts (DrQ-v2's num_seed_frames)"""
    learning_rate: float = 1e-3
    """of the actor, the critic (and encoder) and the temperature"""
    actor_update_frequency: int = 2
    """critic updates per actor (and temperature) update"""
    target_update_frequency: int = 2
    """critic updates per target critic update"""
    update_every: int = 1
    """agent steps per update (DrQ 1; DrQ-v2 2, half the compute)"""
    init_temperature: float = 0.1
    autotune: bool = True
    """learn the temperature toward the target entropy -action_dim"""
    features: int = 50
    """width of the actor's and critic's trunk on the encoder's maps"""
    hidden: tuple[int, ...] = (1024, 1024)
    image_pad: int = 4
    """random shifts of up to this many pixels (0 turns augmentation off)"""
    save_buffer: bool = False
    """put the replay buffer in the checkpoint (without it a resumed run refills it for learning_starts frames)"""
    log_every: int = 10_000
    """frames between metric lines"""

    RESUME_FIXED = ControlConfig.RESUME_FIXED + ("buffer_size", "features")

    def check(self) -> None:
        super().check()
        require(self.pixels, "drq learns from pixels; give --pixels (its default), or train sac on the state")
        require_positive(self, "buffer_size", "batch_size", "learning_rate", "actor_update_frequency",
                         "target_update_frequency", "update_every", "init_temperature", "features", "log_every",
                         "hidden")
        require_buffer_holds_a_batch(self)
        require_non_negative(self, "learning_starts", "image_pad")
        require_fraction(self, "gamma")
        require(0 < self.tau <= 1, f"--tau must be in (0, 1], got {self.tau}")


CONFIG = DrQConfig


def check_action_space(action_space: gym.Space) -> None:
    require(isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1 and
            np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all(),
            f"drq needs a bounded 1-D Box of actions (continuous control), but the env has {action_space}; "
            "ppo --pixels takes discrete actions")


class Learner:
    """DrQ's networks, optimizers and update steps (separate, so that a test can take one)."""

    def __init__(self, obs_shape: tuple[int, ...], action_space: gym.spaces.Box, cfg: DrQConfig, device):
        action_dim = action_space.shape[0]
        self.cfg = cfg
        self.critic = PixelCritic(obs_shape, action_dim, cfg.features, cfg.hidden).to(device)
        self.critic_target = copy.deepcopy(self.critic)
        self.actor = PixelActor(self.critic.encoder.out_features, action_space, cfg.features, cfg.hidden).to(device)
        self.log_alpha = torch.nn.Parameter(torch.tensor([math.log(cfg.init_temperature)], device=device),
                                            requires_grad=cfg.autotune)
        self.critic_optimizer = Adam(self.critic.parameters(), lr=cfg.learning_rate)
        self.actor_optimizer = Adam(self.actor.parameters(), lr=cfg.learning_rate)
        self.alpha_optimizer = Adam([self.log_alpha], lr=cfg.learning_rate)
        self.target_entropy = -float(action_dim)
        self.actor_params = list(self.actor.parameters())
        self.critic_params, self.target_params = list(self.critic.parameters()), list(self.critic_target.parameters())

    def components(self) -> dict:
        return {"critic": self.critic, "critic_target": self.critic_target, "actor": self.actor,
                "temperature": torch.nn.ParameterList([self.log_alpha]), "critic_optimizer": self.critic_optimizer,
                "actor_optimizer": self.actor_optimizer, "alpha_optimizer": self.alpha_optimizer}

    def augment(self, frames: torch.Tensor) -> torch.Tensor:
        return random_shift(frames, self.cfg.image_pad) if self.cfg.image_pad > 0 else frames.float()

    @torch.inference_mode()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.sample(self.critic.encoder(obs))[0]

    def critic_step(self, batch: dict) -> tuple[torch.Tensor, dict]:
        """One step of the critic and encoder on shifted frames. Returns the encoder's maps of
        the shifted observations (for the actor, which reads them detached) and the losses."""
        alpha = self.log_alpha.exp().detach()
        obs, next_obs = self.augment(batch["obs"]), self.augment(batch["next_obs"])
        with torch.no_grad():
            next_actions, next_log_pi = self.actor.sample(self.critic.encoder(next_obs))
            next_q = self.critic_target(next_obs, next_actions).min(0).values - alpha * next_log_pi
            target = batch["rewards"] + self.cfg.gamma * (1.0 - batch["terminated"]) * next_q
        maps = self.critic.encoder(obs)
        q = self.critic.q(maps, batch["actions"])
        qf1_loss, qf2_loss = F.mse_loss(q[0], target), F.mse_loss(q[1], target)
        self.critic_optimizer.zero_grad()
        (qf1_loss + qf2_loss).backward()
        self.critic_optimizer.step()
        return maps.detach(), {"losses/qf1_loss": qf1_loss.detach(), "losses/qf2_loss": qf2_loss.detach(),
                               "losses/qf1_values": q[0].detach().mean()}

    def actor_step(self, maps: torch.Tensor) -> dict:
        """One actor step and one temperature step on the encoder's maps, detached: the
        gradients reach the actor's trunk and MLP, never the encoder or the Q-functions."""
        maps = maps.detach()
        alpha = self.log_alpha.exp().detach()
        pi, log_pi = self.actor.sample(maps)
        actor_loss = (alpha * log_pi - self.critic.q(maps, pi).min(0).values).mean()
        self.actor_optimizer.zero_grad()
        actor_loss.backward(inputs=self.actor_params)
        self.actor_optimizer.step()
        losses = {"losses/actor_loss": actor_loss.detach(), "losses/entropy": -log_pi.detach().mean()}
        if self.cfg.autotune:
            alpha_loss = (self.log_alpha.exp() * (-log_pi.detach() - self.target_entropy)).mean()
            self.alpha_optimizer.zero_grad()
            alpha_loss.backward()
            self.alpha_optimizer.step()
            losses["losses/alpha_loss"] = alpha_loss.detach()
        return losses

    def update_target(self) -> None:
        with torch.no_grad():
            torch._foreach_lerp_(self.target_params, self.critic_params, self.cfg.tau)


@scoped_run
def train(cfg: DrQConfig) -> dict:
    envs, _ = make_run_envs(cfg, "drq")  # renders, or refuses, before the run directory exists
    obs_space, action_space = envs.single_observation_space, envs.single_action_space
    try:
        check_action_space(action_space)
    except OmnigymError:
        envs.close()
        raise
    run = start_run(cfg, "drq", cfg.env_id)
    device = torch.device(cfg.device)
    repeat = frames_per_step(cfg)
    learner = Learner(obs_space.shape, action_space, cfg, device)
    # The replay sees an observation as frame_stack frames of 3 channels, and stores each frame once.
    frames_shape = (cfg.frame_stack, obs_space.shape[0] // cfg.frame_stack, *obs_space.shape[1:])
    action_dim = action_space.shape[0]
    replay = Replay(ReplayBuffer(cfg.buffer_size, frames_shape, (action_dim,), obs_dtype=np.uint8,
                                 action_dtype=np.float32, num_envs=cfg.num_envs, frame_stack=cfg.frame_stack),
                    cfg.seed, cfg.save_buffer)
    stats = EpisodeStats(cfg.print_episodes)
    cursor = EnvCursor(envs, cfg.seed)
    components = {**learner.components(), "replay": replay, "episodes": stats, "envs": cursor}
    counters = run.begin(components)  # restores the checkpoint when resuming
    global_step, updates, steps = (counters.get(k, 0) for k in ("global_step", "updates", "vector_steps"))
    updates_start = replay.learning_starts(cfg.learning_starts, global_step)
    buffer, rng = replay.buffer, replay.rng
    low, high = action_space.low, action_space.high
    losses: dict[str, torch.Tensor] = {}  # the latest of each, read only when logging

    def as_frames(obs):
        return np.asarray(obs).reshape(cfg.num_envs, *frames_shape)

    progress = ProgressBar(cfg.total_timesteps, "drq", start=global_step, enabled=cfg.progress)
    clock = Clock(global_step)
    while global_step < cfg.total_timesteps:
        previous_step = global_step
        # 1. Act (uniformly at random before learning_starts) on unshifted frames; store the transitions.
        obs = cursor.obs
        if global_step < cfg.learning_starts:
            actions = rng.uniform(low, high, (cfg.num_envs, action_dim)).astype(np.float32)
        else:
            actions = learner.act(torch.as_tensor(obs, device=device)).cpu().numpy()
        next_obs, rewards, terminated, truncated, info, valid = cursor.step(actions)
        buffer.add(as_frames(obs), actions, rewards, as_frames(next_obs), terminated, valid=valid)
        global_step += int(valid.sum()) * repeat
        steps += 1
        stats.add(info, global_step)

        if global_step > updates_start and global_step > previous_step and steps % cfg.update_every == 0:
            # 2. Critic (and encoder) on shifted frames; 3. the actor on its detached maps; 4. targets.
            sampled = buffer.sample(cfg.batch_size, rng)
            batch = {k: v.to(device, non_blocking=True) for k, v in sampled.items()}
            for key in ("obs", "next_obs"):  # [n, stack, 3, H, W] frames -> [n, 3 * stack, H, W]
                batch[key] = batch[key].flatten(1, 2)
            maps, critic_losses = learner.critic_step(batch)
            losses.update(critic_losses)
            updates += 1
            if updates % cfg.actor_update_frequency == 0:
                losses.update(learner.actor_step(maps))
            if updates % cfg.target_update_frequency == 0:
                learner.update_target()

        # 5. Log, show, checkpoint (losses checked here: NaN weights are never saved).
        done = global_step >= cfg.total_timesteps
        if crossed_multiple(global_step, previous_step, cfg.log_every) or done:
            values = {k: v.item() for k, v in losses.items()}
            check_finite(torch.tensor(sum(values.values())), global_step)
            run.log(global_step, {**stats.drain(), **values, "losses/alpha": learner.log_alpha.exp().item(),
                                  "perf/sps": clock.sps(global_step)})
        progress.update(global_step, sps=int(clock.sps(global_step)), **stats.shown())
        if done or checkpoint_due(global_step, previous_step, cfg.checkpoint_every):
            check_finite(torch.stack(list(losses.values())).sum() if losses else torch.zeros(()), global_step)
            run.save(components, global_step=global_step, updates=updates, vector_steps=steps)
    progress.close()
    cursor.close()
    return close_control_run(run, stats, cfg.plot, global_step)


def load_policy(cfg: DrQConfig, components: dict, envs, greedy: bool = False):
    """The trained actor on the critic's encoder, ``frames (numpy batch) -> actions``;
    ``greedy`` takes the squashed mean."""
    obs_shape, action_space = envs.single_observation_space.shape, envs.single_action_space
    critic = PixelCritic(obs_shape, action_space.shape[0], cfg.features, tuple(cfg.hidden))
    critic.load_state_dict(components["critic"])
    actor = PixelActor(critic.encoder.out_features, action_space, cfg.features, tuple(cfg.hidden))
    actor.load_state_dict(components["actor"])

    @torch.inference_mode()
    def policy(obs):
        maps = critic.encoder(torch.as_tensor(obs))
        return (actor.mode(maps) if greedy else actor.sample(maps)[0]).numpy()

    return policy
