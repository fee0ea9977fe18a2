import pytest
import torch

from omnigym.errors import OmnigymError
from omnigym.rl.advantages import (ADVANTAGE_ESTIMATORS, AdvantageConfig, EpisodeEnds, discounted_returns, gae,
                                   get_advantage, normalize, outcome_rewards, turn_gae)


def steps(fn, rewards, values, bootstrap, terminated, truncated, gamma, lam=1.0):
    """A time-major [T, N] control rollout through the [N, T] contract."""
    adv, ret = fn(rewards.T, torch.ones_like(rewards.T), values=None if values is None else values.T,
                  cfg=AdvantageConfig(gamma, lam), ends=EpisodeEnds(terminated.T, truncated.T, bootstrap.T))
    return adv.T, ret.T


def column(*xs, dtype=torch.float32):
    return torch.tensor(xs, dtype=dtype).unsqueeze(1)


def test_gae_bootstraps_on_truncation_not_on_termination():
    # Episode A: steps 0-1, terminated at 1. Episode B: step 2, truncated, final obs value 10.
    rewards = column(1.0, 1.0, 1.0)
    values = column(0.5, 0.4, 0.3)
    bootstrap = column(0.4, 99.0, 10.0)  # 99 must be ignored: step 1 terminated
    terminated = column(False, True, False, dtype=torch.bool)
    truncated = column(False, False, True, dtype=torch.bool)
    gamma, lam = 0.9, 0.8
    adv, ret = steps(gae, rewards, values, bootstrap, terminated, truncated, gamma, lam)
    d2 = 1.0 + 0.9 * 10.0 - 0.3         # truncated: bootstrap from final obs
    d1 = 1.0 - 0.4                      # terminated: no bootstrap
    d0 = 1.0 + 0.9 * 0.4 - 0.5
    a1 = d1                             # chain cut at the end of episode A
    a0 = d0 + gamma * lam * a1
    torch.testing.assert_close(adv.squeeze(1), torch.tensor([a0, a1, d2]))
    torch.testing.assert_close(ret, adv + values)


def test_gae_with_lambda_one_equals_discounted_returns_minus_values():
    torch.manual_seed(0)
    rewards, values, bootstrap = torch.randn(6, 3), torch.randn(6, 3), torch.randn(6, 3)
    terminated = torch.zeros(6, 3, dtype=torch.bool)
    terminated[2, 0] = True
    truncated = torch.zeros(6, 3, dtype=torch.bool)
    truncated[4, 1] = True
    # Within an episode bootstrap[t] == values[t+1] for GAE to telescope.
    bootstrap[:-1] = values[1:]
    adv, _ = steps(gae, rewards, values, bootstrap, terminated, truncated, 0.97, 1.0)
    adv_mc, returns = steps(discounted_returns, rewards, values, bootstrap, terminated, truncated, 0.97)
    torch.testing.assert_close(adv, adv_mc)
    torch.testing.assert_close(adv + values, returns)


def test_discounted_returns_by_hand():
    rewards = column(1.0, 2.0, 3.0, 4.0)
    bootstrap = column(0.0, 0.0, 7.0, 5.0)
    terminated = column(False, True, False, False, dtype=torch.bool)
    truncated = column(False, False, True, False, dtype=torch.bool)
    adv, ret = steps(discounted_returns, rewards, None, bootstrap, terminated, truncated, 0.5)
    # step 3: rollout end, bootstrap 5; step 2: truncated, bootstrap 7; step 1 terminated.
    expected = [1.0 + 0.5 * 2.0, 2.0, 3.0 + 0.5 * 7.0, 4.0 + 0.5 * 5.0]
    torch.testing.assert_close(ret.squeeze(1), torch.tensor(expected))
    torch.testing.assert_close(adv, ret)


def test_normalize_with_mask_ignores_padding():
    x = torch.tensor([1.0, 2.0, 3.0, 100.0])
    mask = torch.tensor([1, 1, 1, 0])
    out = normalize(x, mask)
    torch.testing.assert_close(out[:3], torch.tensor([-1.0, 0.0, 1.0]), atol=1e-6, rtol=0)
    assert out[3] == 0


def test_normalize_leaves_a_single_entry_as_it_is():
    """A minibatch of one transition: its std is nan, which made REINFORCE's loss nan."""
    torch.testing.assert_close(normalize(torch.tensor([2.5])), torch.tensor([2.5]))
    torch.testing.assert_close(normalize(torch.tensor([1.0, 3.0])), torch.tensor([-0.7071, 0.7071]), atol=1e-4, rtol=0)


def test_registry_names_the_known_estimators():
    assert get_advantage("returns") is discounted_returns
    assert get_advantage("gae") is turn_gae  # GRPO's --advantage gae: over turns (tests/test_multiturn_credit.py)
    with pytest.raises(OmnigymError, match="unknown advantage estimator 'nope'; known: .*gae"):
        get_advantage("nope")


def group(name, rewards, group_ids):
    """Sequence rewards through the token-level contract, one token per sequence."""
    mask = torch.ones(len(rewards), 1)
    advantages, _ = get_advantage(name)(rewards[:, None], mask, torch.tensor(group_ids))
    return advantages[:, 0]


def test_group_estimators_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])  # two prompts, groups of 3
    ids = [0, 0, 0, 1, 1, 1]
    grpo = group("grpo", rewards, ids)
    std = torch.tensor([1.0, 0.0, 0.0]).std()
    torch.testing.assert_close(grpo[:3], torch.tensor([2 / 3, -1 / 3, -1 / 3]) / (std + 1e-4))
    torch.testing.assert_close(grpo[3:], torch.zeros(3))  # all equal: no signal
    torch.testing.assert_close(group("dr_grpo", rewards, ids)[:3], torch.tensor([2 / 3, -1 / 3, -1 / 3]))
    # RLOO: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5
    torch.testing.assert_close(group("rloo", rewards, ids)[:3], torch.tensor([1.0, -0.5, -0.5]))
    rpp = group("reinforce_pp", rewards, ids)
    torch.testing.assert_close(rpp.mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(rpp.std(), torch.tensor(1.0))


def test_groups_may_be_interleaved_and_of_different_sizes():
    rewards = torch.tensor([1.0, 5.0, 0.0, 7.0, 2.0, 9.0])
    ids = [0, 1, 0, 2, 0, 1]  # group 0 has three members, group 1 two, group 2 one
    torch.testing.assert_close(group("dr_grpo", rewards, ids), torch.tensor([0.0, -2.0, -1.0, 0.0, 1.0, 2.0]))
    with pytest.raises(OmnigymError, match="needs group_ids"):
        get_advantage("grpo")(rewards[:, None], torch.ones(6, 1))


def test_every_estimator_takes_token_rewards_with_a_mask():
    """One contract: the same call works for every registered estimator (GRPO --advantage gae
    used to crash with a TypeError), advantages are 0 off the mask, and an outcome reward on
    the last completion token reaches every generated token."""
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0]])  # row 0: a tool turn, then padding
    rewards = outcome_rewards(torch.tensor([1.0, 0.0]), mask)
    assert rewards.tolist() == [[0, 0, 0, 1, 0], [0, 0, 0, 0, 0]]
    for name, estimator in ADVANTAGE_ESTIMATORS.items():
        advantages, returns = estimator(rewards, mask, torch.tensor([0, 0]))
        assert advantages.shape == returns.shape == mask.shape, name
        assert (advantages[mask == 0] == 0).all(), name
        assert min(advantages[0, 0], advantages[0, 3]) > advantages[1, 0], name
        if name != "gae":  # gae credits each turn apart: turn 1 has no other episode to compare with
            assert advantages[0, 0] == advantages[0, 3], name
    gae_adv, _ = gae(rewards, mask, values=torch.full((2, 5), 0.25))
    torch.testing.assert_close(gae_adv[0, 3], torch.tensor(0.75))  # r - V at the last token
