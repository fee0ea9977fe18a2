"""An actor-critic with memory: one LSTM cell reads the observation, and an actor MLP and a
critic MLP read the cell's output (sb3-contrib's ``MlpLstmPolicy`` with one LSTM shared by
actor and critic, as in CleanRL's ``ppo_atari_lstm``, which puts its CNN before the cell).

The hidden state travels outside the module, as a ``[2, envs, size]`` tensor (h and c), so a
rollout can carry it step to step and an update can replay a whole sequence from the state
the rollout began with. ``starts[t]`` marks the envs whose observation at step ``t`` begins an
episode: their state is zeroed before that step, in rollouts and in replays alike, so memory
never crosses an episode boundary.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from omnigym.errors import OmnigymError
from omnigym.models.control import CategoricalHead, GaussianHead, mlp, torso


class RecurrentActorCritic(nn.Module):
    def __init__(self, observation_space: gym.Space, action_space: gym.Space, hidden: tuple[int, ...] = (64,),
                 lstm_size: int = 64):
        """``hidden``: the widths of the actor's and the critic's MLPs after the cell."""
        super().__init__()
        if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
            raise OmnigymError(f"the recurrent policy reads vector (1-D Box) observations, got {observation_space}")
        self.lstm = nn.LSTM(int(np.prod(observation_space.shape)), lstm_size)
        for name, param in self.lstm.named_parameters():  # CleanRL's init: orthogonal weights, zero biases
            nn.init.orthogonal_(param, 1.0) if "weight" in name else nn.init.zeros_(param)
        self.lstm_size, width = lstm_size, hidden[-1] if hidden else lstm_size
        self.actor_torso = nn.Sequential(*torso(lstm_size, hidden))
        self.critic = mlp(lstm_size, hidden, 1, 1.0)
        if isinstance(action_space, gym.spaces.Discrete):
            self.head = CategoricalHead(width, int(action_space.n))
        elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            self.head = GaussianHead(width, action_space.shape[0])
        else:
            raise OmnigymError(f"the recurrent policy takes Discrete or 1-D Box actions, got {action_space}")

    def initial_state(self, num_envs: int, device="cpu") -> torch.Tensor:
        return torch.zeros(2, num_envs, self.lstm_size, device=device)

    def unroll(self, obs: torch.Tensor, starts: torch.Tensor, state: torch.Tensor):
        """``obs [T, N, obs]``, ``starts [T, N]`` bool, ``state [2, N, size]`` -> the LSTM's
        outputs ``[T, N, size]`` and the state after the last step. The sequence is cut where any
        env begins an episode, each piece one LSTM call from a state zeroed for those envs: the
        same as a cell call per step, in a few calls once episodes outlast the rollout."""
        h, c = state[:1], state[1:]  # nn.LSTM's [layers, N, size]
        cuts = [0, *(torch.nonzero(starts[1:].any(-1)).flatten() + 1).tolist(), len(obs)]
        outputs = []
        for begin, end in zip(cuts[:-1], cuts[1:]):
            keep = (~starts[begin]).unsqueeze(-1).to(obs.dtype)
            out, (h, c) = self.lstm(obs[begin:end], (h * keep, c * keep))
            outputs.append(out)
        return torch.cat(outputs), torch.cat((h, c))

    def act(self, obs, starts, state, action=None, mask=None):
        """``(action, log_prob, entropy, value, state)``, each ``[T, N, ...]`` but the state;
        samples when ``action`` is None. ``mask``: the valid actions ``[T, N, n]`` (discrete only)."""
        features, state = self.unroll(obs, starts, state)
        T, N = features.shape[:2]
        flat = features.reshape(T * N, -1)  # the heads sample from [rows, ...]
        action = None if action is None else action.reshape(T * N, *action.shape[2:])
        mask = None if mask is None else mask.reshape(T * N, -1)
        action, log_prob, entropy = self.head.sample(self.actor_torso(flat), action, mask)
        value = self.critic(flat).squeeze(-1)
        return (action.reshape(T, N, *action.shape[1:]), log_prob.reshape(T, N), entropy.reshape(T, N),
                value.reshape(T, N), state)

    def value(self, obs, starts, state):
        """``V [T, N]`` of a sequence, without the actor."""
        features, _ = self.unroll(obs, starts, state)
        return self.critic(features).squeeze(-1)

    def greedy(self, obs, starts, state, mask=None):
        """The most likely action of each step ``[T, N]`` and the state after the last."""
        features, state = self.unroll(obs, starts, state)
        return self.head.mode(self.actor_torso(features), mask), state
