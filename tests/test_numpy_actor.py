"""The rollout's numpy actor (models/numpy_actor.py) is the torch actor: same log-probs for
the actions it samples, masks respected, and the collector's batched values are the
critic's."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from omnigym.models.control import ActorCritic
from omnigym.models.numpy_actor import NumpyActor, values_of

OBS = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)


def agent_for(action_space, seed=0):
    torch.manual_seed(seed)
    agent = ActorCritic(OBS, action_space, (16, 16))
    with torch.no_grad():  # a head far from its near-zero init, so the test sees real distributions
        for p in agent.head.parameters():
            p.add_(torch.randn_like(p))
    return agent


@pytest.mark.parametrize("space", [gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Discrete(4)])
def test_numpy_log_probs_equal_torch(space):
    agent = agent_for(space)
    actor = NumpyActor.of(agent)
    obs = np.random.default_rng(1).normal(size=(64, 5)).astype(np.float32)
    actions, log_probs = actor.act(obs, np.random.default_rng(2))
    with torch.no_grad():
        _, torch_log_probs, _, _ = agent.act(torch.from_numpy(obs), torch.from_numpy(actions))
    np.testing.assert_allclose(log_probs, torch_log_probs.numpy(), rtol=1e-5, atol=1e-5)
    assert actions.shape == ((64, 3) if isinstance(space, gym.spaces.Box) else (64,))


def test_numpy_categorical_samples_follow_the_probabilities_and_the_mask():
    agent = agent_for(gym.spaces.Discrete(4))
    actor = NumpyActor.of(agent)
    obs = np.repeat(np.random.default_rng(1).normal(size=(1, 5)).astype(np.float32), 20_000, 0)
    mask = np.ones((len(obs), 4), dtype=bool)
    mask[:, 1] = False
    actions, log_probs = actor.act(obs, np.random.default_rng(3), mask)
    assert not (actions == 1).any()
    with torch.no_grad():
        logits = agent.head.masked_logits(agent.actor_torso(torch.from_numpy(obs[:1])), torch.from_numpy(mask[:1]))
        probs = torch.softmax(logits, -1)[0].numpy()
    frequencies = np.bincount(actions, minlength=4) / len(actions)
    np.testing.assert_allclose(frequencies, probs, atol=0.015)  # 20k draws: ~3.5 standard errors
    np.testing.assert_allclose(log_probs[0], np.log(probs[actions[0]]), rtol=1e-5)


def test_numpy_gaussian_samples_have_the_policy_mean_and_std():
    agent = agent_for(gym.spaces.Box(-1, 1, (2,), np.float32))
    actor = NumpyActor.of(agent)
    obs = np.zeros((20_000, 5), dtype=np.float32)
    actions, _ = actor.act(obs, np.random.default_rng(4))
    with torch.no_grad():
        mean = agent.greedy(torch.from_numpy(obs[:1]))[0].numpy()
    std = agent.head.log_std.exp().detach().numpy()
    np.testing.assert_allclose(actions.mean(0), mean, atol=4 * std.max() / np.sqrt(len(obs)))
    np.testing.assert_allclose(actions.std(0), std, rtol=0.03)


def test_pixel_models_keep_the_torch_path_and_values_are_the_critics():
    pixels = ActorCritic(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(3))
    assert NumpyActor.of(pixels) is None
    agent = agent_for(gym.spaces.Discrete(3))
    obs = np.random.default_rng(5).normal(size=(7, 5)).astype(np.float32)
    with torch.no_grad():
        expected = agent.value(torch.from_numpy(obs))
    torch.testing.assert_close(values_of(agent, obs, "cpu"), expected)
