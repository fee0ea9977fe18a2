import pytest
import torch

from omnigym.errors import OmnigymError
from omnigym.rl.advantages import discounted_returns, gae, get_advantage, normalize


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
    adv, ret = gae(rewards, values, bootstrap, terminated, truncated, gamma, lam)
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
    adv, _ = gae(rewards, values, bootstrap, terminated, truncated, 0.97, 1.0)
    adv_mc, returns = discounted_returns(rewards, values, bootstrap, terminated, truncated, 0.97)
    torch.testing.assert_close(adv, adv_mc)
    torch.testing.assert_close(adv + values, returns)


def test_discounted_returns_by_hand():
    rewards = column(1.0, 2.0, 3.0, 4.0)
    bootstrap = column(0.0, 0.0, 7.0, 5.0)
    terminated = column(False, True, False, False, dtype=torch.bool)
    truncated = column(False, False, True, False, dtype=torch.bool)
    adv, ret = discounted_returns(rewards, None, bootstrap, terminated, truncated, 0.5)
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


def test_registry_names_the_known_estimators():
    assert get_advantage("gae") is gae
    with pytest.raises(OmnigymError, match="unknown advantage estimator 'nope'; known: .*gae"):
        get_advantage("nope")


def test_group_estimators_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])  # two prompts, groups of 3
    grpo = get_advantage("grpo")(rewards, 3)
    std = torch.tensor([1.0, 0.0, 0.0]).std()
    torch.testing.assert_close(grpo[:3], torch.tensor([2 / 3, -1 / 3, -1 / 3]) / (std + 1e-4))
    torch.testing.assert_close(grpo[3:], torch.zeros(3))  # all equal: no signal
    torch.testing.assert_close(get_advantage("dr_grpo")(rewards, 3)[:3], torch.tensor([2 / 3, -1 / 3, -1 / 3]))
    # RLOO: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5
    torch.testing.assert_close(get_advantage("rloo")(rewards, 3)[:3], torch.tensor([1.0, -0.5, -0.5]))
    rpp = get_advantage("reinforce_pp")(rewards)
    torch.testing.assert_close(rpp.mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(rpp.std(), torch.tensor(1.0))


def test_groups_must_divide_the_batch():
    with pytest.raises(OmnigymError, match="5 rewards do not split into groups of 2"):
        get_advantage("grpo")(torch.zeros(5), 2)
