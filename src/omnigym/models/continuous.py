"""Networks for continuous control (SAC, TD3): Q-functions of ``(obs, action)`` and actors
whose actions are squashed by tanh into the env's Box bounds.

Layers keep torch's default ``nn.Linear`` init, as CleanRL's SAC and TD3 do. The twin
Q-functions are one module evaluated in one batched pass (``torch.baddbmm`` over a leading
ensemble axis): the same two independent networks, half the kernel launches. Log-probs are
computed by hand rather than with ``torch.distributions`` (see models/control.py).
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from omnigym.models.goal_view import network_view
from omnigym.errors import OmnigymError

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
"""the SAC actor's log-std range (CleanRL's bounds)"""


def check_spaces(algo: str, observation_space: gym.Space, action_space: gym.Space) -> None:
    """What SAC and TD3 here can train on: a bounded 1-D Box of actions, vector observations.
    Called before the run directory exists, so a refusal leaves nothing behind."""
    if not isinstance(action_space, gym.spaces.Box):
        raise OmnigymError(f"{algo.upper()} needs a continuous (Box) action space, but the env has {action_space}; "
                           "use dqn or ppo for discrete actions")
    if len(action_space.shape) != 1 or not (np.isfinite(action_space.low).all() and
                                            np.isfinite(action_space.high).all()):
        raise OmnigymError(f"{algo.upper()} needs a bounded 1-D Box of actions (tanh is rescaled to its low and "
                           f"high), got {action_space}; wrap the env (gymnasium.wrappers.RescaleAction)")
    if not isinstance(observation_space, gym.spaces.Box):
        raise OmnigymError(f"{algo.upper()} here takes vector observations (a 1-D Box), got {observation_space}; "
                           "wrap the env in gymnasium.wrappers.FlattenObservation")
    if len(observation_space.shape) != 1:
        image = " (images need a CNN encoder, which it does not have; drq, ppo and dqn train on pixels)" \
            if len(observation_space.shape) == 3 else "; wrap the env in gymnasium.wrappers.FlattenObservation"
        raise OmnigymError(f"{algo.upper()} here takes vector observations (a 1-D Box), got shape "
                           f"{observation_space.shape}{image}")


class Temperature(nn.Module):
    """The entropy coefficient ``alpha = exp(log_alpha)``; learned with ``autotune`` (SAC's and
    CQL's; CQL's always learns, from 0)."""

    def __init__(self, alpha: float, autotune: bool):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.zeros(1) if autotune else torch.tensor([alpha]).log(),
                                      requires_grad=autotune)


class QNetwork(nn.Module):
    """``n`` independent MLP Q-functions ``Q_i(s, a)`` (ReLU, default init), evaluated together:
    ``forward(obs, actions) -> [n, batch]``."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...] = (256, 256), n: int = 2):
        super().__init__()
        widths = [obs_dim + action_dim, *hidden, 1]
        self.weights, self.biases = nn.ParameterList(), nn.ParameterList()
        for n_in, n_out in zip(widths[:-1], widths[1:]):
            bound = 1.0 / math.sqrt(n_in)  # nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
            self.weights.append(nn.Parameter(torch.empty(n, n_in, n_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(n, 1, n_out).uniform_(-bound, bound)))

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, actions], -1).expand(len(self.weights[0]), -1, -1)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = torch.baddbmm(b, x, w)
            if i < last:
                x = torch.relu(x)
        return x.squeeze(-1).float()  # float32 under --precision bf16's autocast: the losses are taken in it

    def q1(self, obs: torch.Tensor, actions: torch.Tensor, frozen: bool = False) -> torch.Tensor:
        """The first Q-function alone, ``[batch]`` (TD3's actor loss reads only Q_1). ``frozen``: its
        weights out of the graph, so that the actor's backward computes no gradient for them (a
        compiled backward computes every gradient its graph has, whatever ``backward(inputs=)`` asks)."""
        x = torch.cat([obs, actions], -1)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            if frozen:
                w, b = w.detach(), b.detach()
            x = torch.addmm(b[0], x, w[0])
            if i < last:
                x = torch.relu(x)
        return x.squeeze(-1).float()


def _torso(n_in: int, hidden: tuple[int, ...]) -> nn.Sequential:
    layers, width = [], n_in
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers)


class _BoxActor(nn.Module):
    """An MLP whose tanh output is rescaled to the action Box: ``scale * tanh(u) + bias``."""

    def __init__(self, obs_dim: int, action_space: gym.spaces.Box, hidden: tuple[int, ...], n_out: int):
        super().__init__()
        self.torso = _torso(obs_dim, hidden)
        self.head = nn.Linear(hidden[-1] if hidden else obs_dim, n_out)
        low, high = (torch.as_tensor(np.asarray(x, dtype=np.float32)) for x in (action_space.low, action_space.high))
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)


class SquashedGaussianActor(_BoxActor):
    """SAC's actor: a Gaussian with state-dependent mean and log-std (squashed into
    [LOG_STD_MIN, LOG_STD_MAX] by tanh, as CleanRL does), sampled, then tanh-squashed."""

    def __init__(self, obs_dim: int, action_space: gym.spaces.Box, hidden: tuple[int, ...] = (256, 256)):
        action_dim = action_space.shape[0]
        super().__init__(obs_dim, action_space, hidden, 2 * action_dim)  # mean and log-std from one layer

    def _mean_log_std(self, obs):
        mean, log_std = self.head(self.torso(obs)).chunk(2, -1)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(log_std) + 1)
        return mean, log_std

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterized action and its log-prob under the squashed Gaussian:
        ``log N(u; mean, std) - sum log(scale * (1 - tanh(u)^2) + 1e-6)``."""
        mean, log_std = self._mean_log_std(obs)
        noise = torch.randn_like(mean)
        u = mean + log_std.exp() * noise
        y = torch.tanh(u)
        log_prob = (-0.5 * noise.square() - log_std - 0.5 * math.log(2 * math.pi)
                    - torch.log(self.action_scale * (1 - y.square()) + 1e-6)).sum(-1)
        return y * self.action_scale + self.action_bias, log_prob

    def mode(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action: the squashed mean."""
        return torch.tanh(self._mean_log_std(obs)[0]) * self.action_scale + self.action_bias


class DeterministicActor(_BoxActor):
    """TD3's actor: ``scale * tanh(mu(s)) + bias``."""

    def __init__(self, obs_dim: int, action_space: gym.spaces.Box, hidden: tuple[int, ...] = (256, 256)):
        super().__init__(obs_dim, action_space, hidden, action_space.shape[0])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.head(self.torso(obs)).float()) * self.action_scale + self.action_bias


def squashed_gaussian_policy(hidden: tuple[int, ...], components: dict, envs, greedy: bool = False):
    """A checkpointed ``SquashedGaussianActor`` (SAC) as ``obs batch (numpy) -> actions (numpy)``:
    sampled actions, or with ``greedy`` the squashed mean."""
    obs_space, network_input = network_view(envs.single_observation_space)  # goal envs: observation ++ goal
    actor = SquashedGaussianActor(obs_space.shape[0], envs.single_action_space, tuple(hidden))
    actor.load_state_dict(components["actor"])

    @torch.inference_mode()
    def policy(obs):
        x = torch.as_tensor(network_input(obs), dtype=torch.float32)
        return (actor.mode(x) if greedy else actor.sample(x)[0]).numpy()

    return policy


def deterministic_policy(hidden: tuple[int, ...], components: dict, envs, greedy: bool = True):
    """A checkpointed ``DeterministicActor`` (TD3) as ``obs batch (numpy) -> actions (numpy)``,
    without exploration noise (``greedy`` changes nothing: the policy is deterministic)."""
    obs_space, network_input = network_view(envs.single_observation_space)
    actor = DeterministicActor(obs_space.shape[0], envs.single_action_space, tuple(hidden))
    actor.load_state_dict(components["actor"])

    @torch.inference_mode()
    def policy(obs):
        return actor(torch.as_tensor(network_input(obs), dtype=torch.float32)).numpy()

    return policy


class StateValueNetwork(nn.Module):
    """``V(s)``: an MLP (ReLU, default init) to one value per observation, ``[batch]`` (IQL's value function)."""

    def __init__(self, obs_dim: int, hidden: tuple[int, ...] = (256, 256)):
        super().__init__()
        self.torso = _torso(obs_dim, hidden)
        self.head = nn.Linear(hidden[-1] if hidden else obs_dim, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.torso(obs)).squeeze(-1).float()


class GaussianActor(_BoxActor):
    """IQL's actor (as CORL writes it): a Gaussian whose mean is ``scale * tanh(mu(s)) + bias`` and
    whose log-std is one learned vector for all states (clamped to [-20, 2]); acts with its mean."""

    LOG_STD_RANGE = (-20.0, 2.0)

    def __init__(self, obs_dim: int, action_space: gym.spaces.Box, hidden: tuple[int, ...] = (256, 256)):
        super().__init__(obs_dim, action_space, hidden, action_space.shape[0])
        self.log_std = nn.Parameter(torch.zeros(action_space.shape[0]))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The mean action."""
        return torch.tanh(self.head(self.torso(obs)).float()) * self.action_scale + self.action_bias

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``log N(actions; mean(obs), std)`` summed over the action's dimensions, ``[batch]``."""
        log_std = self.log_std.clamp(*self.LOG_STD_RANGE)
        z = (actions - self(obs)) / log_std.exp()
        return (-0.5 * z.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
