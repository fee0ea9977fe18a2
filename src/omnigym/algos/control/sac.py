"""Soft Actor-Critic (Haarnoja et al., 2018), as CleanRL's sac_continuous_action.py does it.

Act with a tanh-squashed Gaussian policy (uniform random actions for the first
``learning_starts`` steps), store transitions in a replay buffer, and after every env step
take one step on the twin soft Q-functions toward

    y = r + gamma * (1 - terminated) * (min_i Q_target_i(s', a') - alpha * log pi(a'|s')),  a' ~ pi(.|s')

Every ``policy_frequency`` of those steps, take ``policy_frequency`` actor steps on
``alpha * log pi(a|s) - min_i Q_i(s, a)`` (delayed, then caught up, as CleanRL does), each
followed by a step on the temperature toward the target entropy ``-action_dim`` when
``autotune`` is on. The target Q-networks follow at rate ``tau``. A truncated transition
still bootstraps; only termination stops it. Defaults are CleanRL's (the paper's MuJoCo
settings).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from omnigym.config import (ControlConfig, require_buffer_holds_a_batch, require_fraction, require_non_negative,
                            require_positive)
from omnigym.envs.cursor import EnvCursor
from omnigym.envs.goal import network_view
from omnigym.envs.vector import make_run_envs
from omnigym.errors import OmnigymError, require
from omnigym.models.continuous import (QNetwork, SquashedGaussianActor, Temperature, check_spaces,
                                      squashed_gaussian_policy)
from omnigym.optim import Adam
from omnigym.process import scoped_run
from omnigym.rl.losses import check_finite
from omnigym.rl.her import HindsightFlags, check_goal_env, replay_buffer
from omnigym.rl.replay import Replay
from omnigym.track.episodes import EpisodeStats, close_control_run
from omnigym.track.progress import Clock, ProgressBar, crossed_multiple
from omnigym.track.stopping import checkpoint_due
from omnigym.track.run import start_run


@dataclass
class SACConfig(HindsightFlags, ControlConfig):
    env_id: str = "Pendulum-v1"
    total_timesteps: int = 1_000_000
    num_envs: int = 1
    buffer_size: int = 1_000_000
    gamma: float = 0.99
    tau: float = 0.005
    """target network update rate (polyak averaging)"""
    batch_size: int = 256
    learning_starts: int = 5000
    """env steps of uniform random actions before learning starts"""
    policy_lr: float = 3e-4
    q_lr: float = 1e-3
    """learning rate of the Q-networks (and of the temperature)"""
    policy_frequency: int = 2
    """Q steps between actor updates; each update then takes this many actor steps"""
    target_network_frequency: int = 1
    """Q steps between target network updates"""
    alpha: float = 0.2
    """entropy coefficient (its starting value is 1 with --autotune)"""
    autotune: bool = True
    """learn alpha toward the target entropy -action_dim"""
    hidden: tuple[int, ...] = (256, 256)
    save_buffer: bool = False
    """put the replay buffer in the checkpoint (large: buffer_size x 2 observations); without it a resumed
    run starts with an empty buffer and refills it for learning_starts steps before updating again"""
    log_every: int = 1000
    """env steps between metric lines"""

    RESUME_FIXED = ControlConfig.RESUME_FIXED + ("buffer_size", "her")  # a HER replay buffer is not a plain one

    PRESETS = {
        "fetch": ("RL-Zoo's her.yml for FetchReach; with --her, success >= 0.9 by 15k steps, docs/her.md", dict(
            total_timesteps=20_000, gamma=0.95, policy_lr=1e-3, q_lr=1e-3, batch_size=256, learning_starts=1000,
            hidden=(64, 64), policy_frequency=1)),
    }

    def check(self) -> None:
        super().check()
        require_positive(self, "buffer_size", "batch_size", "policy_lr", "q_lr", "policy_frequency",
                         "target_network_frequency", "log_every", "hidden")
        require_buffer_holds_a_batch(self)
        require_non_negative(self, "learning_starts", "alpha")
        require_fraction(self, "gamma")
        require(0 < self.tau <= 1, f"--tau must be in (0, 1], got {self.tau}")


CONFIG = SACConfig


@scoped_run
def train(cfg: SACConfig) -> dict:
    envs, _ = make_run_envs(cfg, "sac")  # continuous control: no Atari learning signal
    action_space = envs.single_action_space
    obs_space, network_input = network_view(envs.single_observation_space)  # goal envs: observation ++ goal
    try:  # before the run directory exists
        check_goal_env(cfg, envs.single_observation_space)  # --her on a Dict without goals: say that first
        check_spaces("sac", obs_space, action_space)
        buffer = replay_buffer(cfg, envs, (action_space.shape[0],), np.float32)  # --her relabels goal envs'
    except OmnigymError:
        envs.close()
        raise
    run = start_run(cfg, "sac", cfg.env_id)
    device = torch.device(cfg.device)
    obs_dim, action_dim = obs_space.shape[0], action_space.shape[0]
    actor = SquashedGaussianActor(obs_dim, action_space, cfg.hidden).to(device)
    qf = QNetwork(obs_dim, action_dim, cfg.hidden, n=2).to(device)  # the twin Q-functions, one batched module
    qf_target = copy.deepcopy(qf)
    temperature = Temperature(cfg.alpha, cfg.autotune).to(device)
    q_optimizer = Adam(qf.parameters(), lr=cfg.q_lr)
    actor_optimizer = Adam(actor.parameters(), lr=cfg.policy_lr)
    alpha_optimizer = Adam(temperature.parameters(), lr=cfg.q_lr)
    target_entropy = -float(action_dim)
    replay = Replay(buffer, cfg.seed, cfg.save_buffer)
    stats = EpisodeStats(cfg.print_episodes)
    cursor = EnvCursor(envs, cfg.seed)
    components = {"actor": actor, "qf": qf, "qf_target": qf_target, "temperature": temperature,
                  "q_optimizer": q_optimizer, "actor_optimizer": actor_optimizer, "alpha_optimizer": alpha_optimizer,
                  "replay": replay, "episodes": stats, "envs": cursor}
    counters = run.begin(components)  # restores the checkpoint when resuming
    global_step, q_updates = counters.get("global_step", 0), counters.get("q_updates", 0)
    # Without its buffer a resumed run refills it for learning_starts steps before updating again.
    updates_start = replay.learning_starts(cfg.learning_starts, global_step)
    buffer, rng = replay.buffer, replay.rng
    low, high = action_space.low, action_space.high
    alpha = temperature.log_alpha.exp().detach()
    actor_params, q_params, target_params = (list(m.parameters()) for m in (actor, qf, qf_target))
    losses: dict[str, torch.Tensor] = {}  # the latest of each, read only when logging

    progress = ProgressBar(cfg.total_timesteps, "sac", start=global_step, enabled=cfg.progress)
    clock = Clock(global_step)
    while global_step < cfg.total_timesteps:
        previous_step = global_step
        # 1. Act (uniformly at random before learning_starts) and store the real transitions.
        obs = cursor.obs
        if global_step < cfg.learning_starts:
            actions = rng.uniform(low, high, (cfg.num_envs, action_dim)).astype(np.float32)
        else:
            with torch.inference_mode():
                x = torch.as_tensor(network_input(obs), dtype=torch.float32, device=device)
                actions = actor.sample(x)[0].cpu().numpy()
        next_obs, rewards, terminated, truncated, info, valid = cursor.step(actions)
        buffer.add(obs, actions, rewards, next_obs, terminated, valid=valid, truncated=truncated)
        global_step += int(valid.sum())
        stats.add(info, global_step)

        if global_step > updates_start and global_step > previous_step:
            # 2. One step of the twin soft Q-functions toward the entropy-regularized target.
            batch = {k: v.to(device, non_blocking=True) for k, v in buffer.sample(cfg.batch_size, rng).items()}
            with torch.no_grad():
                next_actions, next_log_pi = actor.sample(batch["next_obs"])
                next_q = qf_target(batch["next_obs"], next_actions).min(0).values - alpha * next_log_pi
                target = batch["rewards"] + cfg.gamma * (1.0 - batch["terminated"]) * next_q
            q = qf(batch["obs"], batch["actions"])
            qf1_loss, qf2_loss = F.mse_loss(q[0], target), F.mse_loss(q[1], target)
            q_optimizer.zero_grad()
            (qf1_loss + qf2_loss).backward()
            q_optimizer.step()
            q_updates += 1
            losses.update({"losses/qf1_loss": qf1_loss.detach(), "losses/qf2_loss": qf2_loss.detach(),
                           "losses/qf1_values": q[0].detach().mean()})

            # 3. Delayed actor (and temperature) steps, policy_frequency of them at once.
            if q_updates % cfg.policy_frequency == 0:
                for _ in range(cfg.policy_frequency):
                    pi, log_pi = actor.sample(batch["obs"])
                    actor_loss = (alpha * log_pi - qf(batch["obs"], pi).min(0).values).mean()
                    actor_optimizer.zero_grad()
                    actor_loss.backward(inputs=actor_params)  # no gradients for the Q-networks' weights
                    actor_optimizer.step()
                    losses["losses/actor_loss"] = actor_loss.detach()
                    if cfg.autotune:
                        with torch.no_grad():
                            log_pi = actor.sample(batch["obs"])[1]
                        alpha_loss = (-temperature.log_alpha.exp() * (log_pi + target_entropy)).mean()
                        alpha_optimizer.zero_grad()
                        alpha_loss.backward()
                        alpha_optimizer.step()
                        alpha = temperature.log_alpha.exp().detach()
                        losses["losses/alpha_loss"] = alpha_loss.detach()

            # 4. The target Q-networks follow.
            if q_updates % cfg.target_network_frequency == 0:
                with torch.no_grad():
                    torch._foreach_lerp_(target_params, q_params, cfg.tau)

        # 5. Log, show, checkpoint. Losses are checked here, not every step (a GPU would wait):
        # NaN weights make every later loss NaN, so a poisoned run is never saved.
        done = global_step >= cfg.total_timesteps
        if crossed_multiple(global_step, previous_step, cfg.log_every) or done:
            values = {k: v.item() for k, v in losses.items()}
            check_finite(torch.tensor(sum(values.values())), global_step)
            run.log(global_step, {**stats.drain(), **values, "losses/alpha": alpha.item(),
                                  "perf/sps": clock.sps(global_step)})
        progress.update(global_step, sps=int(clock.sps(global_step)), **stats.shown())
        if done or checkpoint_due(global_step, previous_step, cfg.checkpoint_every):
            check_finite(torch.stack(list(losses.values())).sum() if losses else torch.zeros(()), global_step)
            run.save(components, global_step=global_step, q_updates=q_updates)
    progress.close()
    cursor.close()
    return close_control_run(run, stats, cfg.plot, global_step)


def load_policy(cfg: SACConfig, components: dict, envs, greedy: bool = False):
    """The trained actor, ``obs (numpy batch) -> actions (numpy)``; ``greedy`` takes the squashed mean."""
    return squashed_gaussian_policy(cfg.hidden, components, envs, greedy)
