"""Twin Delayed DDPG (Fujimoto et al., 2018), as CleanRL's td3_continuous_action.py does it.

Act with a deterministic tanh actor plus Gaussian exploration noise (uniform random actions
for the first ``learning_starts`` steps), store transitions in a replay buffer, and after
every env step take one step on the twin Q-functions toward

    y = r + gamma * (1 - terminated) * min_i Q_target_i(s', clip(mu_target(s') + eps, low, high)),
    eps = clip(N(0, policy_noise), -noise_clip, noise_clip) * action_scale

(target policy smoothing). Every ``policy_frequency`` of those steps, take one actor step on
``-Q_1(s, mu(s))`` and move the target actor and target Q-networks toward theirs at rate
``tau`` (delayed policy updates). A truncated transition still bootstraps; only termination
stops it. Defaults are CleanRL's (the paper's MuJoCo settings).
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
from omnigym.models.continuous import DeterministicActor, QNetwork, check_spaces, deterministic_policy
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
class TD3Config(HindsightFlags, ControlConfig):
    env_id: str = "Pendulum-v1"
    total_timesteps: int = 1_000_000
    num_envs: int = 1
    learning_rate: float = 3e-4
    """learning rate of the actor and the Q-networks"""
    buffer_size: int = 1_000_000
    gamma: float = 0.99
    tau: float = 0.005
    """target network update rate (polyak averaging)"""
    batch_size: int = 256
    policy_noise: float = 0.2
    """std of the target policy smoothing noise, in units of the action scale"""
    noise_clip: float = 0.5
    """the smoothing noise is clipped to +-noise_clip (in units of the action scale)"""
    exploration_noise: float = 0.1
    """std of the Gaussian noise added to the actor's actions, in units of the action scale"""
    learning_starts: int = 25_000
    """env steps of uniform random actions before learning starts"""
    policy_frequency: int = 2
    """Q steps between actor (and target network) updates"""
    hidden: tuple[int, ...] = (256, 256)
    save_buffer: bool = False
    """put the replay buffer in the checkpoint (large: buffer_size x 2 observations); without it a resumed
    run starts with an empty buffer and refills it for learning_starts steps before updating again"""
    log_every: int = 1000
    """env steps between metric lines"""

    RESUME_FIXED = ControlConfig.RESUME_FIXED + ("buffer_size", "her")  # a HER replay buffer is not a plain one

    def check(self) -> None:
        super().check()
        require_positive(self, "learning_rate", "buffer_size", "batch_size", "policy_frequency", "log_every", "hidden")
        require_buffer_holds_a_batch(self)
        require_non_negative(self, "learning_starts", "policy_noise", "noise_clip", "exploration_noise")
        require_fraction(self, "gamma")
        require(0 < self.tau <= 1, f"--tau must be in (0, 1], got {self.tau}")


CONFIG = TD3Config


@scoped_run
def train(cfg: TD3Config) -> dict:
    envs, _ = make_run_envs(cfg, "td3")  # continuous control: no Atari learning signal
    action_space = envs.single_action_space
    obs_space, network_input = network_view(envs.single_observation_space)  # goal envs: observation ++ goal
    try:  # before the run directory exists
        check_goal_env(cfg, envs.single_observation_space)  # --her on a Dict without goals: say that first
        check_spaces("td3", obs_space, action_space)
        buffer = replay_buffer(cfg, envs, (action_space.shape[0],), np.float32)  # --her relabels goal envs'
    except OmnigymError:
        envs.close()
        raise
    run = start_run(cfg, "td3", cfg.env_id)
    device = torch.device(cfg.device)
    obs_dim, action_dim = obs_space.shape[0], action_space.shape[0]
    actor = DeterministicActor(obs_dim, action_space, cfg.hidden).to(device)
    qf = QNetwork(obs_dim, action_dim, cfg.hidden, n=2).to(device)  # the twin Q-functions, one batched module
    actor_target, qf_target = copy.deepcopy(actor), copy.deepcopy(qf)
    q_optimizer = Adam(qf.parameters(), lr=cfg.learning_rate)
    actor_optimizer = Adam(actor.parameters(), lr=cfg.learning_rate)
    replay = Replay(buffer, cfg.seed, cfg.save_buffer)
    stats = EpisodeStats(cfg.print_episodes)
    cursor = EnvCursor(envs, cfg.seed)
    components = {"actor": actor, "qf": qf, "actor_target": actor_target, "qf_target": qf_target,
                  "q_optimizer": q_optimizer, "actor_optimizer": actor_optimizer, "replay": replay, "episodes": stats,
                  "envs": cursor}
    counters = run.begin(components)  # restores the checkpoint when resuming
    global_step, q_updates = counters.get("global_step", 0), counters.get("q_updates", 0)
    # Without its buffer a resumed run refills it for learning_starts steps before updating again.
    updates_start = replay.learning_starts(cfg.learning_starts, global_step)
    buffer, rng = replay.buffer, replay.rng
    low, high = action_space.low, action_space.high
    low_t, high_t = (torch.as_tensor(x, dtype=torch.float32, device=device) for x in (low, high))
    scale = actor.action_scale
    actor_params = list(actor.parameters())
    online, targets = (list(actor.parameters()) + list(qf.parameters()),
                       list(actor_target.parameters()) + list(qf_target.parameters()))
    losses: dict[str, torch.Tensor] = {}  # the latest of each, read only when logging

    progress = ProgressBar(cfg.total_timesteps, "td3", start=global_step, enabled=cfg.progress)
    clock = Clock(global_step)
    while global_step < cfg.total_timesteps:
        previous_step = global_step
        # 1. Act (uniformly at random before learning_starts, then mu(s) + exploration noise,
        # clipped to the bounds) and store the real transitions.
        obs = cursor.obs
        if global_step < cfg.learning_starts:
            actions = rng.uniform(low, high, (cfg.num_envs, action_dim)).astype(np.float32)
        else:
            with torch.inference_mode():
                mu = actor(torch.as_tensor(network_input(obs), dtype=torch.float32, device=device))
                actions = (mu + torch.randn_like(mu) * (scale * cfg.exploration_noise)).cpu().numpy()
            actions = actions.clip(low, high)
        next_obs, rewards, terminated, truncated, info, valid = cursor.step(actions)
        buffer.add(obs, actions, rewards, next_obs, terminated, valid=valid, truncated=truncated)
        global_step += int(valid.sum())
        stats.add(info, global_step)

        if global_step > updates_start and global_step > previous_step:
            # 2. One step of the twin Q-functions toward the smoothed clipped double-Q target.
            batch = {k: v.to(device, non_blocking=True) for k, v in buffer.sample(cfg.batch_size, rng).items()}
            with torch.no_grad():
                noise = (torch.randn_like(batch["actions"]) * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
                next_actions = torch.minimum(torch.maximum(actor_target(batch["next_obs"]) + noise * scale, low_t),
                                             high_t)
                next_q = qf_target(batch["next_obs"], next_actions).min(0).values
                target = batch["rewards"] + cfg.gamma * (1.0 - batch["terminated"]) * next_q
            q = qf(batch["obs"], batch["actions"])
            qf1_loss, qf2_loss = F.mse_loss(q[0], target), F.mse_loss(q[1], target)
            q_optimizer.zero_grad()
            (qf1_loss + qf2_loss).backward()
            q_optimizer.step()
            q_updates += 1
            losses.update({"losses/qf1_loss": qf1_loss.detach(), "losses/qf2_loss": qf2_loss.detach(),
                           "losses/qf1_values": q[0].detach().mean()})

            # 3. Delayed actor step on Q_1, then the target networks follow.
            if q_updates % cfg.policy_frequency == 0:
                actor_loss = -qf.q1(batch["obs"], actor(batch["obs"])).mean()
                actor_optimizer.zero_grad()
                actor_loss.backward(inputs=actor_params)  # no gradients for the Q-networks' weights
                actor_optimizer.step()
                losses["losses/actor_loss"] = actor_loss.detach()
                with torch.no_grad():
                    torch._foreach_lerp_(targets, online, cfg.tau)

        # 4. Log, show, checkpoint. Losses are checked here, not every step (a GPU would wait):
        # NaN weights make every later loss NaN, so a poisoned run is never saved.
        done = global_step >= cfg.total_timesteps
        if crossed_multiple(global_step, previous_step, cfg.log_every) or done:
            values = {k: v.item() for k, v in losses.items()}
            check_finite(torch.tensor(sum(values.values())), global_step)
            run.log(global_step, {**stats.drain(), **values, "perf/sps": clock.sps(global_step)})
        progress.update(global_step, sps=int(clock.sps(global_step)), **stats.shown())
        if done or checkpoint_due(global_step, previous_step, cfg.checkpoint_every):
            check_finite(torch.stack(list(losses.values())).sum() if losses else torch.zeros(()), global_step)
            run.save(components, global_step=global_step, q_updates=q_updates)
    progress.close()
    cursor.close()
    return close_control_run(run, stats, cfg.plot, global_step)


def load_policy(cfg: TD3Config, components: dict, envs, greedy: bool = True):
    """The trained actor without exploration noise, ``obs (numpy batch) -> actions (numpy)``."""
    return deterministic_policy(cfg.hidden, components, envs, greedy)
