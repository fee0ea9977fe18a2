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
from omnigym.models.control import ActorCritic, obs_tensor
from omnigym.models.numpy_actor import NumpyActor, values_of
from omnigym.rl.running_stats import RewardScaler, RunningMeanStd


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
    behaviour_logprobs: torch.Tensor | None = None  # [T, N] the sampler's, where it is not the policy trained

    def flat(self, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
        """Each ``[T, N, ...]`` tensor as ``[valid steps, ...]`` (None stays None)."""
        keep = self.valid.reshape(-1)
        return [None if x is None else x.reshape(-1, *x.shape[2:])[keep] for x in tensors]


class RolloutCollector:
    """``num_steps`` vector steps of the current policy at a time, for PPO and REINFORCE.

    Buffers are numpy arrays (a row write costs a microsecond, a torch index-assign ten);
    the rollout hands them out as tensors that share their memory. MLP policies act
    through a numpy snapshot of the actor (``models/numpy_actor.py``) and get their values
    in one batched call after the last step; pixel policies act in torch."""

    def __init__(self, envs: gym.vector.VectorEnv, num_steps: int, stats, device, seed: int,
                 normalize_obs: bool = False, reward_scaler: RewardScaler | None = None,
                 signal: LearningSignal = LearningSignal()):
        self.num_steps, self.stats, self.device, self.reward_scaler = num_steps, stats, device, reward_scaler
        self.obs_rms = RunningMeanStd(envs.single_observation_space.shape) if normalize_obs else None
        self.continuous = isinstance(envs.single_action_space, gym.spaces.Box)
        self.rng = np.random.default_rng(seed)  # the numpy actor's samples
        T, N = num_steps, envs.num_envs
        obs_shape, pixels = envs.single_observation_space.shape, len(envs.single_observation_space.shape) == 3
        # One row more than the rollout: the observation after its last step, for bootstrapping.
        self.obs_buf = np.zeros((T + 1, N, *obs_shape), dtype=np.uint8 if pixels else np.float32)
        self.actions_buf = np.zeros((T, N, *envs.single_action_space.shape),
                                    dtype=np.float32 if self.continuous else np.int64)
        self.logprobs_buf, self.rewards_buf = (np.zeros((T, N), dtype=np.float32) for _ in range(2))
        self.values_buf = np.zeros((T + 1, N), dtype=np.float32)  # V(s_0) ... V(s_T): values and bootstraps
        self.terminated_buf, self.truncated_buf, self.valid_buf = (np.zeros((T, N), dtype=bool) for _ in range(3))
        self.cursor = EnvCursor(envs, seed, self.prepare, signal)
        self.action_masks = ActionMasks.find(envs, self.cursor.info)
        self.masks_buf = None if self.action_masks is None else np.zeros((T, N, self.action_masks.n_actions), dtype=bool)
        self.masks = self._current_masks()

    def _current_masks(self) -> np.ndarray | None:
        if self.action_masks is None:
            return None
        return self.action_masks(self.envs, self.cursor.info, self.cursor.steps)

    @property
    def envs(self) -> gym.vector.VectorEnv:
        return self.cursor.envs

    def prepare(self, raw_obs: np.ndarray) -> np.ndarray:
        if self.obs_rms is not None:
            self.obs_rms.update(raw_obs)
            return self.obs_rms.normalize(raw_obs)
        return raw_obs if raw_obs.dtype == np.uint8 else raw_obs.astype(np.float32, copy=False)

    def _act_torch(self, agent, t: int):
        mask = None if self.masks is None else torch.from_numpy(self.masks).to(self.device)
        with torch.inference_mode():
            action, logprob, _, value = agent.act(torch.from_numpy(self.obs_buf[t]).to(self.device), mask=mask)
        self.values_buf[t] = value.cpu().numpy()
        return action.cpu().numpy(), logprob.cpu().numpy()

    def collect(self, agent, global_step: int, values: bool = True) -> tuple[Rollout, int]:
        """Run ``num_steps`` vector steps with ``agent``; returns the rollout and the new step count.
        ``values`` False skips the critic where it is a separate call (a learner recomputes them)."""
        space, cursor, stats, scaler = self.envs.single_action_space, self.cursor, self.stats, self.reward_scaler
        low, high = (space.low, space.high) if self.continuous else (None, None)
        obs_buf, actions_buf, logprobs_buf, masks_buf = self.obs_buf, self.actions_buf, self.logprobs_buf, self.masks_buf
        actor = NumpyActor.of(agent)
        for t in range(self.num_steps):
            obs_buf[t] = cursor.obs
            if actor is not None:
                action, logprob = actor.act(obs_buf[t], self.rng, self.masks)
            else:
                action, logprob = self._act_torch(agent, t)
            actions_buf[t], logprobs_buf[t] = action, logprob
            if masks_buf is not None:
                masks_buf[t] = self.masks
            if low is not None:  # the Gaussian is unbounded; the env sees actions inside its box (np.clip's numbers)
                action = np.minimum(np.maximum(action, low), high)
            counted = cursor.steps
            _, reward, terminated, truncated, info, valid = cursor.step(action)
            global_step += cursor.steps - counted  # the valid steps, as the cursor counted them
            reward = np.asarray(reward, dtype=np.float32)
            if scaler is not None:
                reward = scaler(reward, terminated, valid)
            self.valid_buf[t], self.rewards_buf[t] = valid, reward
            self.terminated_buf[t], self.truncated_buf[t] = terminated, truncated
            stats.add(info, global_step)
            if self.action_masks is not None:
                self.masks = self._current_masks()
        self.obs_buf[-1] = self.cursor.obs
        if values and actor is not None:  # every value at once
            flat_obs = self.obs_buf.reshape(-1, *self.obs_buf.shape[2:])
            self.values_buf[:] = values_of(agent, flat_obs, self.device).numpy().reshape(self.values_buf.shape)
        elif values:  # the torch path wrote V(s_0) ... V(s_T-1) as it went
            self.values_buf[-1] = values_of(agent, self.obs_buf[-1], self.device).numpy()
        values = torch.from_numpy(self.values_buf)
        tensors = (torch.from_numpy(x) for x in (self.obs_buf[:-1], self.actions_buf, self.logprobs_buf))
        rollout = Rollout(*tensors, values[:-1], values[1:], torch.from_numpy(self.rewards_buf),
                          torch.from_numpy(self.terminated_buf), torch.from_numpy(self.truncated_buf),
                          torch.from_numpy(self.valid_buf),
                          None if self.masks_buf is None else torch.from_numpy(self.masks_buf))
        return rollout, global_step

    def state_dict(self) -> dict:
        return {"cursor": self.cursor.state_dict(), "obs_rms": self.obs_rms.state_dict() if self.obs_rms else None,
                "reward_scaler": self.reward_scaler.state_dict() if self.reward_scaler else None,
                "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        if self.obs_rms is not None and state.get("obs_rms"):
            self.obs_rms.load_state_dict(state["obs_rms"])
        if self.reward_scaler is not None and state.get("reward_scaler"):
            self.reward_scaler.load_state_dict(state["reward_scaler"])
        self.cursor.load_state_dict(state["cursor"])
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]
        self.masks = self._current_masks()


def actor_critic_policy(hidden: tuple[int, ...], components: dict, envs, greedy: bool = False, symmetries=None):
    """A checkpointed ``ActorCritic`` (PPO, REINFORCE) as ``obs batch (numpy) -> actions``,
    with the run's observation normalization (the collector's, saved with it) and actions
    clipped into a Box as in training. It lives beside the collector, whose state it reads.
    ``symmetries``: the board's, for a run trained with them (PPO's --symmetric)."""
    agent = ActorCritic(envs.single_observation_space, envs.single_action_space, tuple(hidden), symmetries)
    agent.load_state_dict(components["model"])
    obs_rms = None
    if components["collector"].get("obs_rms"):
        obs_rms = RunningMeanStd(envs.single_observation_space.shape)
        obs_rms.load_state_dict(components["collector"]["obs_rms"])
    space = envs.single_action_space

    @torch.inference_mode()
    def policy(obs, mask=None):
        x = obs_tensor(obs_rms.normalize(obs) if obs_rms else obs, "cpu")
        mask = None if mask is None else torch.as_tensor(mask)
        actions = (agent.greedy(x, mask) if greedy else agent.act(x, mask=mask)[0]).numpy()
        return np.clip(actions, space.low, space.high) if isinstance(space, gym.spaces.Box) else actions

    return policy
