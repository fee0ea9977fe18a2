"""On-policy rollouts from a vector env, shared by PPO and REINFORCE.

The vector env autoresets on the step after an episode ends (NEXT_STEP mode): that step
returns the reset observation and reward 0 and is not a real transition, so ``valid``
marks it False and the losses skip it. On a truncated step the observation that follows
is the episode's true final observation, so ``bootstrap_values`` holds its value.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from omnigym.rl.running_stats import RunningMeanStd


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

    def flat(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        """Each ``[T, N, ...]`` tensor as ``[valid steps, ...]``."""
        keep = self.valid.reshape(-1)
        return [x.reshape(-1, *x.shape[2:])[keep] for x in tensors]


class RolloutCollector:
    def __init__(self, envs: gym.vector.VectorEnv, num_steps: int, stats, device, seed: int | None,
                 normalize_obs: bool = False):
        """``seed`` seeds the first reset; None leaves the envs alone for ``load_state_dict``."""
        self.envs, self.num_steps, self.stats, self.device = envs, num_steps, stats, device
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
        self.obs = self.prepare(envs.reset(seed=seed)[0]) if seed is not None else None
        self.autoreset = np.zeros(N, dtype=bool)

    def prepare(self, raw_obs: np.ndarray) -> torch.Tensor:
        if self.obs_rms is not None:
            self.obs_rms.update(raw_obs)
            raw_obs = self.obs_rms.normalize(raw_obs)
        return obs_tensor(raw_obs)

    def collect(self, agent, global_step: int) -> tuple[Rollout, int]:
        """Run ``num_steps`` vector steps with ``agent.act``; returns the rollout and the new step count."""
        low, high = (self.envs.single_action_space.low, self.envs.single_action_space.high) if self.continuous else (None, None)
        for t in range(self.num_steps):
            with torch.inference_mode():
                action, logprob, _, value = agent.act(self.obs.to(self.device))
            self.obs_buf[t], self.actions_buf[t] = self.obs, action
            self.logprobs_buf[t], self.values_buf[t] = logprob, value
            self.valid_buf[t] = torch.from_numpy(~self.autoreset)
            env_action = action.cpu().numpy()
            if self.continuous:
                env_action = np.clip(env_action, low, high)
            next_obs, reward, terminated, truncated, info = self.envs.step(env_action)
            global_step += int((~self.autoreset).sum())
            self.rewards_buf[t] = torch.from_numpy(np.asarray(reward, dtype=np.float32))
            self.terminated_buf[t] = torch.from_numpy(terminated)
            self.truncated_buf[t] = torch.from_numpy(truncated)
            self.autoreset = terminated | truncated
            self.stats.add(info, global_step)
            self.obs = self.prepare(next_obs)
        with torch.inference_mode():
            last_value = agent.value(self.obs.to(self.device)).cpu()
        bootstrap = torch.cat([self.values_buf[1:], last_value.unsqueeze(0)])
        rollout = Rollout(self.obs_buf, self.actions_buf, self.logprobs_buf, self.values_buf, bootstrap,
                          self.rewards_buf, self.terminated_buf, self.truncated_buf, self.valid_buf)
        return rollout, global_step

    def state_dict(self) -> dict:
        return {"obs": self.obs, "autoreset": self.autoreset,
                "obs_rms": self.obs_rms.state_dict() if self.obs_rms else None}

    def load_state_dict(self, state: dict, exact: bool, seed: int) -> None:
        """``exact``: the env was restored mid-episode, so the saved observation is current."""
        if self.obs_rms is not None and state.get("obs_rms"):
            self.obs_rms.load_state_dict(state["obs_rms"])
        if exact:
            self.obs, self.autoreset = state["obs"], state["autoreset"]
        else:
            self.obs = self.prepare(self.envs.reset(seed=seed)[0])
            self.autoreset = np.zeros(self.envs.num_envs, dtype=bool)
