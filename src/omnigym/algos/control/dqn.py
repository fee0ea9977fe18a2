"""Deep Q-Network (Mnih et al., 2015), with the double-DQN target as an option.

Act epsilon-greedily, store transitions in a replay buffer, and every ``train_frequency``
env steps take ``gradient_steps`` TD-regression steps toward
``r + gamma * max_a' Q_target(s', a')`` (double DQN: the online net picks ``a'``, the target
net scores it). A truncated transition still bootstraps from its next observation; only
termination stops the bootstrap. Defaults are RL-Zoo's tuned CartPole-v1 settings;
Atari ids get the Nature paper's settings as CleanRL's ``dqn_atari`` runs them (``PRESETS``).

The replay memory stores each frame once (rl/replay.py): a million Atari transitions take
about 9 GB rather than 56. Checkpoints leave it out unless ``--save-buffer`` is given; a run
resumed without it refills the memory for ``learning_starts`` steps before learning again.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from omnigym.config import (ControlConfig, require_buffer_holds_a_batch, require_fraction, require_non_negative,
                            require_positive)
from omnigym.envs.cursor import EnvCursor
from omnigym.envs.goal import network_view
from omnigym.envs.atari import is_atari
from omnigym.envs.vector import make_run_envs
from omnigym.errors import OmnigymError, require
from omnigym.models.control import QNetwork, obs_tensor, q_network_policy
from omnigym.optim import Adam
from omnigym.process import scoped_run
from omnigym.rl.losses import check_finite
from omnigym.rl.her import HindsightFlags, replay_buffer
from omnigym.rl.replay import Replay
from omnigym.track.episodes import EpisodeStats, close_control_run
from omnigym.track.progress import Clock, ProgressBar, crossed_multiple
from omnigym.track.stopping import checkpoint_due
from omnigym.track.run import start_run


@dataclass
class DQNConfig(HindsightFlags, ControlConfig):
    total_timesteps: int = 50_000
    num_envs: int = 1
    learning_rate: float = 2.3e-3
    buffer_size: int = 100_000
    gamma: float = 0.99
    tau: float = 1.0
    """target network update rate (1.0 = hard copy)"""
    target_network_frequency: int = 10
    """env steps between target network updates"""
    batch_size: int = 64
    start_e: float = 1.0
    end_e: float = 0.04
    exploration_fraction: float = 0.16
    """fraction of the run over which epsilon decays from start_e to end_e"""
    learning_starts: int = 1000
    train_frequency: int = 256
    gradient_steps: int = 128
    double_dqn: bool = False
    hidden: tuple[int, ...] = (256, 256)
    log_every: int = 1000
    """env steps between metric lines"""
    save_buffer: bool = False
    """put the replay memory in checkpoints (exact resume; large on Atari)"""

    RESUME_FIXED = ControlConfig.RESUME_FIXED + ("buffer_size", "her")  # a HER replay buffer is not a plain one
    PRESETS = {
        "atari": ("CleanRL dqn_atari.py, the DQN Nature paper's settings", dict(
            total_timesteps=10_000_000, num_envs=1, learning_rate=1e-4, buffer_size=1_000_000, gamma=0.99, tau=1.0,
            target_network_frequency=1000, batch_size=32, start_e=1.0, end_e=0.01, exploration_fraction=0.10,
            learning_starts=80_000, train_frequency=4, gradient_steps=1)),
    }

    def check(self) -> None:
        super().check()
        require_positive(self, "learning_rate", "buffer_size", "batch_size", "train_frequency", "gradient_steps",
                         "target_network_frequency", "log_every")
        require_buffer_holds_a_batch(self)
        require_non_negative(self, "learning_starts")
        require_fraction(self, "gamma", "start_e", "end_e", "exploration_fraction")
        require(0 < self.tau <= 1, f"--tau must be in (0, 1], got {self.tau}")
        require_positive(self, "hidden")


CONFIG = DQNConfig


def epsilon(cfg: DQNConfig, step: int) -> float:
    decay_steps = cfg.exploration_fraction * cfg.total_timesteps
    return max(cfg.end_e, cfg.start_e + (cfg.end_e - cfg.start_e) * step / max(decay_steps, 1))


@scoped_run
def train(cfg: DQNConfig) -> dict:
    envs, signal = make_run_envs(cfg, "dqn")
    obs_space, network_input = network_view(envs.single_observation_space)  # goal envs: observation ++ goal
    try:  # before the run directory exists
        require(isinstance(envs.single_action_space, gym.spaces.Discrete),
                f"DQN needs a discrete action space, but {cfg.env_id} has {envs.single_action_space}; use ppo (or "
                "sac) for continuous actions")
        stacked = len(obs_space.shape) == 3 and is_atari(cfg.env_id)
        buffer = replay_buffer(cfg, envs, (), np.int64, obs_dtype=obs_space.dtype,
                               frame_stack=cfg.frame_stack if stacked else 1)  # --her relabels goal envs'
    except OmnigymError:
        envs.close()
        raise
    run = start_run(cfg, "dqn", cfg.env_id)
    device = torch.device(cfg.device)
    q_network = QNetwork(obs_space, int(envs.single_action_space.n), cfg.hidden).to(device)
    target_network = copy.deepcopy(q_network)
    optimizer = Adam(q_network.parameters(), lr=cfg.learning_rate)
    replay = Replay(buffer, cfg.seed, cfg.save_buffer)
    stats = EpisodeStats(cfg.print_episodes)
    cursor = EnvCursor(envs, cfg.seed, signal=signal)
    components = {"model": q_network, "target": target_network, "optimizer": optimizer, "replay": replay,
                  "episodes": stats, "envs": cursor}
    counters = run.begin(components)  # restores the checkpoint when resuming
    global_step = counters.get("global_step", 0)
    learning_starts = replay.learning_starts(cfg.learning_starts, global_step)
    buffer, rng = replay.buffer, replay.rng
    td_loss = q_mean = torch.tensor(float("nan"))

    progress = ProgressBar(cfg.total_timesteps, "dqn", start=global_step, enabled=cfg.progress)
    clock = Clock(global_step)
    while global_step < cfg.total_timesteps:
        previous_step = global_step
        # 1. Act epsilon-greedily and store the real transitions (not autoreset steps).
        obs = cursor.obs
        if rng.random() < epsilon(cfg, global_step):
            actions = np.array([cursor.envs.single_action_space.sample() for _ in range(cfg.num_envs)])
        else:
            with torch.inference_mode():
                actions = q_network(obs_tensor(network_input(obs), device)).argmax(-1).cpu().numpy()
        next_obs, rewards, terminated, truncated, info, valid = cursor.step(actions)
        buffer.add(obs, actions, rewards, next_obs, terminated, valid=valid, truncated=truncated)
        global_step += int(valid.sum())
        stats.add(info, global_step)

        # 2. TD steps toward the (double) DQN target.
        if global_step > learning_starts and crossed_multiple(global_step, previous_step, cfg.train_frequency):
            for _ in range(cfg.gradient_steps):
                batch = {k: v.to(device) for k, v in buffer.sample(cfg.batch_size, rng).items()}
                with torch.no_grad():
                    next_q = target_network(obs_tensor(batch["next_obs"], device))
                    if cfg.double_dqn:
                        best = q_network(obs_tensor(batch["next_obs"], device)).argmax(-1, keepdim=True)
                        next_value = next_q.gather(-1, best).squeeze(-1)
                    else:
                        next_value = next_q.max(-1).values
                    target = batch["rewards"] + cfg.gamma * (1.0 - batch["terminated"]) * next_value
                q = q_network(obs_tensor(batch["obs"], device)).gather(-1, batch["actions"].unsqueeze(-1)).squeeze(-1)
                td_loss = F.mse_loss(q, target)
                check_finite(td_loss, global_step)
                optimizer.zero_grad()
                td_loss.backward()
                optimizer.step()
                q_mean = q.detach().mean()
        if crossed_multiple(global_step, previous_step, cfg.target_network_frequency):
            with torch.no_grad():
                for target_param, param in zip(target_network.parameters(), q_network.parameters()):
                    target_param.lerp_(param, cfg.tau)

        # 3. Log, show, checkpoint.
        if crossed_multiple(global_step, previous_step, cfg.log_every) or global_step >= cfg.total_timesteps:
            run.log(global_step, {**stats.drain(), "losses/td_loss": td_loss.item(), "losses/q_values": q_mean.item(),
                                  "charts/epsilon": epsilon(cfg, global_step), "perf/sps": clock.sps(global_step)})
        progress.update(global_step, sps=int(clock.sps(global_step)), **stats.shown())
        if global_step >= cfg.total_timesteps or checkpoint_due(global_step, previous_step, cfg.checkpoint_every):
            run.save(components, global_step=global_step)
    progress.close()
    cursor.close()
    return close_control_run(run, stats, cfg.plot, global_step)


def load_policy(cfg: DQNConfig, components: dict, envs, greedy: bool = True):
    """The greedy policy of the trained Q-network, ``obs (numpy batch) -> actions (numpy)``."""
    return q_network_policy(cfg.hidden, components, envs, greedy)
