"""Networks for control: an actor-critic with a head per action space, and a Q-network.

Distributions are computed by hand rather than with ``torch.distributions``: on tiny
networks its argument validation costs more than the network itself.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from omnigym.errors import OmnigymError
from omnigym.models.goal_view import network_view


def obs_tensor(obs, device="cpu") -> torch.Tensor:
    """Observations as a tensor: images stay uint8 (the encoder scales them), the rest float32."""
    tensor = torch.as_tensor(obs, device=device)
    return tensor if tensor.dtype == torch.uint8 else tensor.float()


def layer(n_in: int, n_out: int, gain: float = math.sqrt(2)) -> nn.Linear:
    """Linear layer with orthogonal init, the PPO implementation-details default."""
    linear = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(linear.weight, gain)
    nn.init.zeros_(linear.bias)
    return linear


def torso(n_in: int, hidden: tuple[int, ...], activation=nn.Tanh) -> list[nn.Module]:
    layers, width = [], n_in
    for h in hidden:
        layers += [layer(width, h), activation()]
        width = h
    return layers


def mlp(n_in: int, hidden: tuple[int, ...], n_out: int, out_gain: float, activation=nn.Tanh) -> nn.Sequential:
    width = hidden[-1] if hidden else n_in
    return nn.Sequential(*torso(n_in, hidden, activation), layer(width, n_out, out_gain))


def nature_cnn_side(size: int) -> int:
    """Side of the Nature CNN's last feature map for ``size`` x ``size`` frames (84 -> 7; 36 -> 1)."""
    return ((size - 8) // 4 + 1 - 4) // 2 + 1 - 2


class NatureCNN(nn.Module):
    """The DQN-Nature encoder for stacked 84x84 frames (uint8 in, features out); other square
    sizes of 36 pixels or more (``--pixels --image-size``) get a flatten layer of their size."""

    def __init__(self, channels: int, features: int = 512, size: int = 84):
        super().__init__()
        side = nature_cnn_side(size)
        self.net = nn.Sequential(
            nn.Conv2d(channels, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(),
            layer(64 * side * side, features), nn.ReLU(),
        )
        self.out_features = features

    def forward(self, obs):
        return self.net(obs.float() / 255.0)


class BoardSymmetries(nn.Module):
    """A board game's symmetries as the encoder of an ``ActorCritic`` (envs/games/symmetry.py):
    observations ``[B, D]`` in, their ``G`` transformed views ``[B, G, D]`` out, which the
    torsos read like any batch; ``pool_logits`` maps each view's logits back to the original
    actions and averages them, ``pool_values`` averages the values. The policy and value are
    then exactly the same on symmetric positions (moves permuted), whatever the weights.
    No parameters: a checkpoint's keys are a plain ``ActorCritic``'s."""

    def __init__(self, features: np.ndarray, actions: np.ndarray):
        super().__init__()
        # actions[g, i]: the original action of view g's action i; its inverse picks, for each
        # original action, the logit of view g that stands for it
        inverse = np.argsort(actions, axis=1)
        self.register_buffer("features", torch.as_tensor(features, dtype=torch.long), persistent=False)
        self.register_buffer("inverse", torch.as_tensor(inverse, dtype=torch.long), persistent=False)
        self.register_buffer("views", torch.arange(len(inverse))[:, None], persistent=False)

    # Plain indexing, no len() or expand(shape): a traced export (omnigym export) keeps the batch size free.
    def forward(self, obs):
        return obs[..., self.features]

    def pool_logits(self, logits):
        return logits[..., self.views, self.inverse].mean(-2)

    def pool_values(self, values):
        return values.mean(-1)


class CategoricalHead(nn.Module):
    def __init__(self, n_in: int, n_actions: int):
        super().__init__()
        self.logits = layer(n_in, n_actions, 0.01)
        self.pool = None
        """``BoardSymmetries.pool_logits`` when the features are a board's symmetric views"""

    def sample(self, features, action=None, mask=None):
        """Returns ``(action, log_prob, entropy)``; samples when ``action`` is None. ``mask``
        (bool, True = valid) gives invalid actions probability 0 (Huang & Ontanon, 2020)."""
        log_probs = torch.log_softmax(self.masked_logits(features, mask), -1)
        if action is None:
            action = torch.multinomial(log_probs.exp(), 1).squeeze(-1)
        log_prob = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return action, log_prob, entropy

    def masked_logits(self, features, mask=None):
        logits = self.logits(features)
        if self.pool is not None:
            logits = self.pool(logits)
        # A large finite negative, not -inf: probabilities of exactly 0 without 0 * inf in the entropy.
        return logits if mask is None else logits.masked_fill(~mask, -1e8)

    def mode(self, features, mask=None):
        return self.masked_logits(features, mask).argmax(-1)


class GaussianHead(nn.Module):
    """Diagonal Gaussian with a state-independent log-std, as in PPO for MuJoCo."""

    def __init__(self, n_in: int, action_dim: int):
        super().__init__()
        self.mean = layer(n_in, action_dim, 0.01)
        self.log_std = nn.Parameter(torch.zeros(action_dim))

    def sample(self, features, action=None, mask=None):
        mean = self.mean(features)
        if action is None:
            action = mean + self.log_std.exp() * torch.randn_like(mean)
        # Terms that do not depend on the sample summed once, not per row: a minibatch step
        # on PPO's small networks is dispatch-bound, and each op saved shows.
        dims, log_std_sum = mean.shape[-1], self.log_std.sum()
        z = (action - mean) * (-self.log_std).exp()
        log_prob = -0.5 * (z * z).sum(-1) - (log_std_sum + 0.5 * math.log(2 * math.pi) * dims)
        entropy = (log_std_sum + (0.5 + 0.5 * math.log(2 * math.pi)) * dims).expand(mean.shape[:-1])
        return action, log_prob, entropy

    def mode(self, features, mask=None):
        return self.mean(features)


def check_observation_space(space: gym.Space) -> None:
    """The observations the networks here read: a Box of numbers, or C x 84 x 84 images."""
    if not isinstance(space, gym.spaces.Box):
        raise OmnigymError(f"the networks take Box observations (a vector, or C x 84 x 84 images), got {space}; "
                           "wrap the env in gymnasium.wrappers.FlattenObservation")
    if len(space.shape) == 3 and (space.shape[1] != space.shape[2] or nature_cnn_side(space.shape[1]) < 1):
        raise OmnigymError(f"image observations must be channels-first C x 84 x 84 (the Nature CNN's input; any "
                           f"square of 36 pixels or more works too), got {space.shape}; resize them "
                           "(gymnasium.wrappers.ResizeObservation) and put channels first")


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs on vectors; one shared CNN encoder on pixels.
    ``symmetries``: a board game's ``(features, actions)`` index arrays (envs/games/symmetry.py,
    ``--symmetric``): the policy and value are averaged over the board's transformed views."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, hidden: tuple[int, ...] = (64, 64),
                 symmetries: tuple[np.ndarray, np.ndarray] | None = None):
        super().__init__()
        check_observation_space(observation_space)
        self.symmetries = None
        if symmetries is not None:
            if not isinstance(action_space, gym.spaces.Discrete) or len(observation_space.shape) != 1:
                raise OmnigymError("board symmetries are for vector observations and discrete actions (a board "
                                   f"game's), got {observation_space} and {action_space}")
            self.encoder = self.symmetries = BoardSymmetries(*symmetries)
            n_in = int(np.prod(observation_space.shape))
        elif len(observation_space.shape) == 3:
            self.encoder = NatureCNN(observation_space.shape[0], size=observation_space.shape[1])
            n_in, hidden = self.encoder.out_features, ()
        else:
            self.encoder = nn.Flatten() if len(observation_space.shape) > 1 else nn.Identity()
            n_in = int(np.prod(observation_space.shape))
        self.actor_torso = nn.Sequential(*torso(n_in, hidden))
        self.critic = mlp(n_in, hidden, 1, 1.0)
        width = hidden[-1] if hidden else n_in
        if isinstance(action_space, gym.spaces.Discrete):
            self.head = CategoricalHead(width, int(action_space.n))
        elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            self.head = GaussianHead(width, action_space.shape[0])
        else:
            raise OmnigymError(f"PPO and REINFORCE take Discrete or 1-D Box actions, got {action_space}")
        if self.symmetries is not None:
            self.head.pool = self.symmetries.pool_logits

    def _value(self, features):
        values = self.critic(features).squeeze(-1)
        return values if self.symmetries is None else self.symmetries.pool_values(values)

    def value(self, obs):
        return self._value(self.encoder(obs))

    def act(self, obs, action=None, mask=None):
        """Returns ``(action, log_prob, entropy, value)``; samples when ``action`` is None.
        ``mask``: the valid actions (discrete only), where the env gives them."""
        features = self.encoder(obs)
        action, log_prob, entropy = self.head.sample(self.actor_torso(features), action, mask)
        return action, log_prob, entropy, self._value(features)

    def greedy(self, obs, mask=None):
        return self.head.mode(self.actor_torso(self.encoder(obs)), mask)


class QNetwork(nn.Module):
    def __init__(self, observation_space: gym.Space, n_actions: int, hidden: tuple[int, ...] = (120, 84)):
        super().__init__()
        check_observation_space(observation_space)
        if len(observation_space.shape) == 3:
            encoder = NatureCNN(observation_space.shape[0], size=observation_space.shape[1])
            self.net = nn.Sequential(encoder, layer(encoder.out_features, n_actions, 1.0))
        else:
            self.net = mlp(int(np.prod(observation_space.shape)), hidden, n_actions, 1.0, activation=nn.ReLU)

    def forward(self, obs):
        return self.net(obs)


def q_network_policy(hidden: tuple[int, ...], components: dict, envs, greedy: bool = True):
    """A checkpointed ``QNetwork`` (DQN) as ``obs batch (numpy) -> greedy actions``."""
    obs_space, network_input = network_view(envs.single_observation_space)  # goal envs: observation ++ goal
    q_network = QNetwork(obs_space, int(envs.single_action_space.n), tuple(hidden))
    q_network.load_state_dict(components["model"])

    @torch.inference_mode()
    def policy(obs, mask=None):  # the best valid action, where the env gives a mask
        q = q_network(obs_tensor(network_input(obs), "cpu"))
        return (q if mask is None else q.masked_fill(~torch.as_tensor(mask), -torch.inf)).argmax(-1).numpy()

    return policy
