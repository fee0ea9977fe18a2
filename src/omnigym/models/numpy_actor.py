"""The actor of an MLP ``ActorCritic`` evaluated in numpy, for rollouts.

Why: a rollout asks the policy for one action per env step, on a batch of a few rows. At
that size torch spends its time in per-op dispatch, not arithmetic: the actor and critic
forward passes cost ~340 us a step on HalfCheetah at one env (bench/ppo_step_profile.py),
more than the MuJoCo simulation. The same layers in numpy cost a tenth of that. The
weights are views of the torch parameters (no copy on CPU), so the snapshot taken at the
start of a rollout is the policy the update then improves; nothing may change them while
the rollout runs, and nothing does.

Only the actor runs per step: the critic's values are computed for the whole rollout in
one batched torch call afterwards (``RolloutCollector``). A board game's symmetric actor
(``BoardSymmetries``, --symmetric) reads the board's views and averages their logits here as
there. Pixel models keep the torch path
(``NumpyActor.of`` returns None): there the convolutions are the cost, and the value comes
with the shared encoder.

Sampling draws from a numpy ``Generator`` the collector owns and checkpoints, so a run is
reproducible and resumes exactly. Masked logits follow ``CategoricalHead``: invalid
actions get a logit of -1e8, probability 0.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from omnigym.models.control import ActorCritic, BoardSymmetries, CategoricalHead, GaussianHead


def _weights(linear: nn.Linear) -> tuple[np.ndarray, np.ndarray]:
    return linear.weight.detach().cpu().numpy().T, linear.bias.detach().cpu().numpy()


class NumpyActor:
    def __init__(self, torso: list, head: tuple, gaussian: bool, log_std: np.ndarray | None):
        self.torso, self.head, self.gaussian, self.log_std = torso, head, gaussian, log_std
        self.std = None if log_std is None else np.exp(log_std)  # once per snapshot, not per step
        self._rows = np.arange(0)
        self.views = None
        """a board's symmetries: ``(features [G, D], inverse [G, A])``, BoardSymmetries' index arrays"""

    @classmethod
    def of(cls, agent: ActorCritic) -> "NumpyActor | None":
        """A snapshot of ``agent``'s actor, or None where the numpy path does not apply."""
        if not isinstance(agent, ActorCritic) or not isinstance(agent.encoder, (nn.Identity, nn.Flatten,
                                                                                BoardSymmetries)):
            return None
        modules = list(agent.actor_torso)
        if not all(isinstance(m, (nn.Linear, nn.Tanh)) for m in modules):
            return None
        torso = [_weights(m) for m in modules if isinstance(m, nn.Linear)]
        if isinstance(agent.head, GaussianHead):
            return cls(torso, _weights(agent.head.mean), True, agent.head.log_std.detach().cpu().numpy())
        if isinstance(agent.head, CategoricalHead):
            actor = cls(torso, _weights(agent.head.logits), False, None)
            if isinstance(agent.encoder, BoardSymmetries):
                actor.views = agent.encoder.features.cpu().numpy(), agent.encoder.inverse.cpu().numpy()
            return actor
        return None

    def act(self, obs: np.ndarray, rng: np.random.Generator, mask: np.ndarray | None = None):
        """``(actions, log_probs)`` for a batch of observations (float32). Reductions call their
        ufuncs directly: the same sums as ``ndarray.sum``/``max``, without their Python wrappers,
        which on a few rows cost more than the sums (~25 numpy calls a step in all)."""
        x = obs.reshape(len(obs), -1)
        if self.views is not None:
            x = x[:, self.views[0]]  # [B, G, D]: each of the board's views
        for weight, bias in self.torso:
            x = np.tanh(x @ weight + bias)
        out = x @ self.head[0] + self.head[1]
        if self.views is not None:  # each view's logits back on the original actions, averaged (as BoardSymmetries)
            out = np.take_along_axis(out, self.views[1][None], -1).mean(1)
        if self.gaussian:
            noise = rng.standard_normal(out.shape, dtype=np.float32)
            actions = out + self.std * noise
            log_prob = np.add.reduce(-0.5 * (noise * noise) - self.log_std - 0.5 * math.log(2 * math.pi), axis=-1)
            return actions, log_prob.astype(np.float32, copy=False)
        if mask is not None:
            out = np.where(mask, out, np.float32(-1e8))
        shifted = out - np.maximum.reduce(out, axis=-1, keepdims=True)
        log_probs = shifted - np.log(np.add.reduce(np.exp(shifted), axis=-1, keepdims=True))
        # Inverse-CDF sampling: one uniform draw per row.
        cdf = np.exp(log_probs).cumsum(-1)
        u = rng.random((len(out), 1), dtype=np.float32) * cdf[:, -1:]
        actions = np.minimum(np.add.reduce(cdf < u, axis=-1), out.shape[-1] - 1)
        if len(self._rows) != len(out):
            self._rows = np.arange(len(out))
        rows = self._rows
        if mask is not None:  # rounding at a zero-probability edge must not pick an invalid action
            actions = np.where(mask[rows, actions], actions, log_probs.argmax(-1))
        return actions, log_probs[rows, actions].astype(np.float32, copy=False)


def values_of(agent: ActorCritic, obs: np.ndarray, device) -> torch.Tensor:
    """The critic's values for a stack of observations, in one torch call."""
    with torch.inference_mode():
        return agent.value(torch.from_numpy(obs).to(device)).cpu()
