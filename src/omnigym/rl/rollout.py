"""On-policy rollouts from a vector env, shared by PPO and REINFORCE.

Autoreset steps (see ``envs/cursor.py``) are marked not ``valid`` and the losses skip
them. On a truncated step the observation that follows is the episode's true final
observation, so ``bootstrap_values`` holds its value. Rewards are what the algorithm learns
from: clipped on Atari (``LearningSignal``), scaled with ``RewardScaler`` when asked
(MuJoCo); episode returns are logged from the env's own rewards. Where the env gives
action masks (``ActionMasks``), they are kept with the observations they belong to.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from omnigym.envs.cursor import ActionMasks, EnvCursor, LearningSignal
from omnigym.rl.running_stats import RewardScaler, RunningMeanStd


def obs_tensor(obs, device="cpu") -> torch.Tensor:
    """Observations as a tensor: images stay uint8 (the encoder scales them), the rest float32."""
    tensor = torch.as_tensor(obs, device=device)
    return tensor if tensor.dtype == torch.uint8 else tensor.float()


@dataclass
class Rollout:
    obs: torch.Tensor              # [T, N, *obs_shape]
    actions: torch.Tensor          # [T, N, *action_shape]
    logprobs: torch.Tensor         # [T, N]
    values: torch.Tensor           # [T, N]  V(s_t)
    bootstrap_values: torch.Tensor  # [T, N]  V(s_{t+1})
    rewards: torch.Tensor          # [T, N]
    terminated: torch.Tensor       # [T, N] bool
    truncated: torch.Tensor        # [T, N] bool
    valid: torch.Tensor            # [T, N] bool, False on autoreset steps
    masks: torch.Tensor | None = None  # [T, N, n_actions] bool, the valid actions, where the env gives them

    def flat(self, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
        """Each ``[T, N, ...]`` tensor as ``[valid steps, ...]`` (None stays None)."""
        keep = self.valid.reshape(-1)
        return [None if x is None else x.reshape(-1, *x.shape[2:])[keep] for x in tensors]


class RolloutCollector:
    """``num_steps`` vector steps of the current policy at a time, for PPO and REINFORCE."""

    def __init__(self, envs: gym.vector.VectorEnv, num_steps: int, stats, device, seed: int,
                 normalize_obs: bool = False, reward_scaler: RewardScaler | None = None,
                 signal: LearningSignal = LearningSignal()):
        self.num_steps, self.stats, self.device, self.reward_scaler = num_steps, stats, device, reward_scaler
        self.obs_rms = RunningMeanStd(envs.single_observation_space.shape) if normalize_obs else None
        self.continuous = isinstance(envs.single_action_space, gym.spaces.Box)
        T, N = num_steps, envs.num_envs
        obs_shape, pixels = envs.single_observation_space.shape, len(envs.single_observation_space.shape) == 3
        self.obs_buf = torch.zeros((T, N, *obs_shape), dtype=torch.uint8 if pixels else torch.float32)
        self.actions_buf = torch.zeros((T, N, *envs.single_action_space.shape),
                                       dtype=torch.float32 if self.continuous else torch.long)
        self.logprobs_buf, self.rewards_buf, self.values_buf = (torch.zeros((T, N)) for _ in range(3))
        self.terminated_buf, self.truncated_buf, self.valid_buf = (torch.zeros((T, N), dtype=torch.bool)
                                                                   for _ in range(3))
        self.cursor = EnvCursor(envs, seed, self.prepare, signal)
        self.action_masks = ActionMasks.find(envs, self.cursor.info)
        self.masks_buf = None if self.action_masks is None else \
            torch.zeros((T, N, self.action_masks.n_actions), dtype=torch.bool)
        self.masks = self._current_masks()

    def _current_masks(self) -> torch.Tensor | None:
        if self.action_masks is None:
            return None
        return torch.from_numpy(self.action_masks(self.envs, self.cursor.info, self.cursor.steps))

    @property
    def envs(self) -> gym.vector.VectorEnv:
        return self.cursor.envs

    def prepare(self, raw_obs: np.ndarray) -> torch.Tensor:
        if self.obs_rms is not None:
            self.obs_rms.update(raw_obs)
            raw_obs = self.obs_rms.normalize(raw_obs)
        return obs_tensor(raw_obs)

    def collect(self, agent, global_step: int) -> tuple[Rollout, int]:
        """Run ``num_steps`` vector steps with ``agent.act``; returns the rollout and the new step count."""
        space = self.envs.single_action_space
        for t in range(self.num_steps):
            mask = None if self.masks is None else self.masks.to(self.device)
            with torch.inference_mode():
                action, logprob, _, value = agent.act(self.cursor.obs.to(self.device), mask=mask)
            self.obs_buf[t], self.actions_buf[t] = self.cursor.obs, action
            self.logprobs_buf[t], self.values_buf[t] = logprob, value
            if self.masks is not None:
                self.masks_buf[t] = self.masks
            env_action = action.cpu().numpy()
            if self.continuous:  # the Gaussian is unbounded; the env sees actions inside its box
                env_action = np.clip(env_action, space.low, space.high)
            _, reward, terminated, truncated, info, valid = self.cursor.step(env_action)
            global_step += int(valid.sum())
            reward = np.asarray(reward, dtype=np.float32)
            if self.reward_scaler is not None:
                reward = self.reward_scaler(reward, terminated, valid)
            self.valid_buf[t] = torch.from_numpy(valid)
            self.rewards_buf[t] = torch.from_numpy(reward)
            self.terminated_buf[t] = torch.from_numpy(terminated)
            self.truncated_buf[t] = torch.from_numpy(truncated)
            self.stats.add(info, global_step)
            self.masks = self._current_masks()
        with torch.inference_mode():
            last_value = agent.value(self.cursor.obs.to(self.device)).cpu()
        bootstrap = torch.cat([self.values_buf[1:], last_value.unsqueeze(0)])
        rollout = Rollout(self.obs_buf, self.actions_buf, self.logprobs_buf, self.values_buf, bootstrap,
                          self.rewards_buf, self.terminated_buf, self.truncated_buf, self.valid_buf, self.masks_buf)
        return rollout, global_step

    def state_dict(self) -> dict:
        return {"cursor": self.cursor.state_dict(), "obs_rms": self.obs_rms.state_dict() if self.obs_rms else None,
                "reward_scaler": self.reward_scaler.state_dict() if self.reward_scaler else None}

    def load_state_dict(self, state: dict) -> None:
        if self.obs_rms is not None and state.get("obs_rms"):
            self.obs_rms.load_state_dict(state["obs_rms"])
        if self.reward_scaler is not None and state.get("reward_scaler"):
            self.reward_scaler.load_state_dict(state["reward_scaler"])
        self.cursor.load_state_dict(state["cursor"])
        self.masks = self._current_masks()
