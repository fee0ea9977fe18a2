"""DrQ's image encoder, and the actor and critic that share it (SAC from pixels, algos/control/drq.py).

The encoder is DrQ's (Kostrikov et al., 2020; SAC-AE's before it; DrQ-v2 keeps it): four
3 x 3 convolutions of 32 channels, the first with stride 2, ReLU after each. Frames are
scaled to [0, 1] inside, so observations stay uint8 everywhere outside (replay, env).
Actor and critic each put their own trunk on the flattened maps (a linear layer to 50
features, LayerNorm, tanh) and their MLPs on that (models/continuous.py's
``SquashedGaussianActor`` and twin ``QNetwork``).

One encoder, trained by the critic alone: it lives in ``PixelCritic`` (so one Polyak step
moves the target encoder with the target Q-functions), and the actor reads its output
detached, so the actor's loss trains the actor's trunk and MLP and never the encoder.
Weights start orthogonal (DrQ: orthogonal linear layers, delta-orthogonal convolutions;
here both orthogonal, with ReLU's gain for the convolutions), biases at zero.
"""

from __future__ import annotations

import gymnasium as gym
import torch
from torch import nn

from omnigym.models.continuous import QNetwork, SquashedGaussianActor


def conv_output_size(size: int) -> int:
    """Side of the encoder's last feature map for ``size`` x ``size`` frames (84 -> 35)."""
    return (size - 3) // 2 + 1 - 3 * 2


def _orthogonal(module: nn.Module) -> None:
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            gain = nn.init.calculate_gain("relu") if isinstance(layer, nn.Conv2d) else 1.0
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)


class PixelEncoder(nn.Module):
    """``[n, C, H, W]`` uint8 frames -> ``[n, out_features]`` (the flattened feature maps)."""

    def __init__(self, obs_shape: tuple[int, ...], channels: int = 32):
        super().__init__()
        side = conv_output_size(obs_shape[1])
        if len(obs_shape) != 3 or side < 1 or obs_shape[1] != obs_shape[2]:
            raise ValueError(f"the encoder takes square C x H x W frames of 16 pixels or more, got {obs_shape}")
        self.convs = nn.Sequential(
            nn.Conv2d(obs_shape[0], channels, 3, stride=2), nn.ReLU(),
            nn.Conv2d(channels, channels, 3), nn.ReLU(),
            nn.Conv2d(channels, channels, 3), nn.ReLU(),
            nn.Conv2d(channels, channels, 3), nn.ReLU(), nn.Flatten())
        self.out_features = channels * side * side
        _orthogonal(self)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.convs(obs.float() / 255.0)


def trunk(n_in: int, features: int) -> nn.Sequential:
    """DrQ's projection of the feature maps: linear, LayerNorm, tanh."""
    layers = nn.Sequential(nn.Linear(n_in, features), nn.LayerNorm(features), nn.Tanh())
    _orthogonal(layers)
    return layers


class PixelCritic(nn.Module):
    """The shared encoder, the critic's trunk and the twin Q-functions: ``encoder(obs)`` gives
    the maps the actor reads too; ``q(maps, actions) -> [2, n]``."""

    def __init__(self, obs_shape: tuple[int, ...], action_dim: int, features: int = 50,
                 hidden: tuple[int, ...] = (1024, 1024)):
        super().__init__()
        self.encoder = PixelEncoder(obs_shape)
        self.trunk = trunk(self.encoder.out_features, features)
        self.qf = QNetwork(features, action_dim, hidden, n=2)

    def q(self, maps: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.qf(self.trunk(maps), actions)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.q(self.encoder(obs), actions)


class PixelActor(nn.Module):
    """The actor's trunk and SAC's squashed Gaussian on the encoder's maps (given detached)."""

    def __init__(self, maps: int, action_space: gym.spaces.Box, features: int = 50,
                 hidden: tuple[int, ...] = (1024, 1024)):
        super().__init__()
        self.trunk = trunk(maps, features)
        self.policy = SquashedGaussianActor(features, action_space, hidden)

    def sample(self, maps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy.sample(self.trunk(maps))

    def mode(self, maps: torch.Tensor) -> torch.Tensor:
        return self.policy.mode(self.trunk(maps))
