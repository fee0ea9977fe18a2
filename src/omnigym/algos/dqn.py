"""Deep Q-Network (Mnih et al., 2015), with the double-DQN target as an option.

Act epsilon-greedily, store transitions in a replay buffer, and every ``train_frequency``
env steps take ``gradient_steps`` TD-regression steps toward
``r + gamma * max_a' Q_target(s', a')`` (double DQN: the online net picks ``a'``, the target
net scores it). A truncated transition still bootstraps from its next observation; only
termination stops the bootstrap. Defaults are RL-Zoo's tuned CartPole-v1 settings.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from omnigym.algos.common import Clock, CommonConfig, EpisodeStats, checkpoint_state, due, finish, restore_envs, restore_rng, start
from omnigym.envs.vector import make_vec
from omnigym.errors import OmnigymError
from omnigym.models.control import QNetwork
from omnigym.rl.buffers import ReplayBuffer
from omnigym.rl.losses import check_finite
from omnigym.rl.optim import Adam
from omnigym.rl.rollout import obs_tensor
from omnigym.track.progress import ProgressBar


@dataclass
class DQNConfig(CommonConfig):
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


def epsilon(cfg: DQNConfig, step: int) -> float:
    decay_steps = cfg.exploration_fraction * cfg.total_timesteps
    return max(cfg.end_e, cfg.start_e + (cfg.end_e - cfg.start_e) * step / max(decay_steps, 1))


def train(cfg: DQNConfig) -> dict:
    envs = make_vec(cfg.env_id, cfg.num_envs, backend=cfg.backend, seed=cfg.seed)
    if not isinstance(envs.single_action_space, gym.spaces.Discrete):
        envs.close()
        raise OmnigymError(f"DQN needs a discrete action space, but {cfg.env_id} has {envs.single_action_space}; "
                           "use ppo (or sac) for continuous actions")
    run = start(cfg, "dqn")
    device = torch.device(cfg.device)
    q_network = QNetwork(envs.single_observation_space, int(envs.single_action_space.n), cfg.hidden).to(device)
    target_network = copy.deepcopy(q_network)
    optimizer = Adam(q_network.parameters(), lr=cfg.learning_rate)
    obs_space = envs.single_observation_space
    buffer = ReplayBuffer(cfg.buffer_size, obs_space.shape, (), obs_dtype=obs_space.dtype)
    rng = np.random.default_rng(cfg.seed)
    stats = EpisodeStats(cfg.print_episodes)
    global_step = 0
    obs, _ = envs.reset(seed=cfg.seed)
    autoreset = np.zeros(cfg.num_envs, dtype=bool)
    td_loss = q_mean = torch.tensor(float("nan"))
    if run.checkpoint is not None:
        ckpt = run.checkpoint
        q_network.load_state_dict(ckpt["model"])
        target_network.load_state_dict(ckpt["target"])
        optimizer.load_state_dict(ckpt["optimizer"])
        buffer.load_state_dict(ckpt["buffer"])
        rng.bit_generator.state = ckpt["sampler"]
        stats.load_state_dict(ckpt["episodes"])
        global_step = ckpt["global_step"]
        envs, exact = restore_envs(run, envs)
        obs, autoreset = (ckpt["obs"], ckpt["autoreset"]) if exact else (envs.reset(seed=cfg.seed + global_step)[0],
                                                                          np.zeros(cfg.num_envs, dtype=bool))
        restore_rng(run)

    progress = ProgressBar(cfg.total_timesteps, "dqn", start=global_step, enabled=cfg.progress)
    clock = Clock(global_step)
    while global_step < cfg.total_timesteps:
        previous_step = global_step
        # 1. Act epsilon-greedily and store the real transitions (not autoreset steps).
        if rng.random() < epsilon(cfg, global_step):
            actions = np.array([envs.single_action_space.sample() for _ in range(cfg.num_envs)])
        else:
            with torch.inference_mode():
                actions = q_network(obs_tensor(obs, device)).argmax(-1).cpu().numpy()
        next_obs, rewards, terminated, truncated, info = envs.step(actions)
        buffer.add(obs, actions, rewards, next_obs, terminated, keep=~autoreset)
        global_step += int((~autoreset).sum())
        autoreset = terminated | truncated
        stats.add(info, global_step)
        obs = next_obs

        # 2. TD steps toward the (double) DQN target.
        if global_step > cfg.learning_starts and due(global_step, previous_step, cfg.train_frequency):
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
        if due(global_step, previous_step, cfg.target_network_frequency):
            with torch.no_grad():
                for target_param, param in zip(target_network.parameters(), q_network.parameters()):
                    target_param.lerp_(param, cfg.tau)

        # 3. Log, show, checkpoint.
        if due(global_step, previous_step, cfg.log_every):
            run.log(global_step, {**stats.drain(), "losses/td_loss": td_loss.item(), "losses/q_values": q_mean.item(),
                                  "charts/epsilon": epsilon(cfg, global_step), "perf/sps": clock.sps(global_step)})
        progress.update(global_step, sps=int(clock.sps(global_step)), ret=stats.mean_recent)
        if global_step >= cfg.total_timesteps or due(global_step, previous_step, cfg.checkpoint_every):
            run.save(checkpoint_state(envs, model=q_network.state_dict(), target=target_network.state_dict(),
                                      optimizer=optimizer.state_dict(), buffer=buffer.state_dict(),
                                      sampler=rng.bit_generator.state, episodes=stats.state_dict(),
                                      global_step=global_step, obs=obs, autoreset=autoreset))
    progress.close()
    envs.close()
    return finish(run, stats, cfg, global_step)


def load_policy(cfg: DQNConfig, checkpoint: dict, envs, greedy: bool = True):
    q_network = QNetwork(envs.single_observation_space, int(envs.single_action_space.n), tuple(cfg.hidden))
    q_network.load_state_dict(checkpoint["model"])

    @torch.inference_mode()
    def policy(obs):
        return q_network(obs_tensor(obs, "cpu")).argmax(-1).numpy()

    return policy
