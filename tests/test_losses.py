import math

import pytest
import torch

from omnigym.errors import OmnigymError
from omnigym.rl.losses import (POLICY_LOSSES, PolicyLossConfig, aggregate, check_finite, get_policy_loss,
                               kl_estimate, nll_loss, value_loss)

ppo_clip = get_policy_loss("ppo_clip")


def test_ppo_clip_by_hand():
    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.5, 0.5, 1.1, 0.7]))  # ratios
    adv = torch.tensor([1.0, -1.0, -2.0, 1.0])
    loss, stats = ppo_clip(new, old, adv, cfg=PolicyLossConfig(clip_low=0.2))
    # per-sample max(-A r, -A clip(r)): 1.5,A=1 -> -1.2 ; 0.5,A=-1 -> 0.8 ; 1.1,A=-2 -> 2.2 ; 0.7,A=1 -> -0.7
    torch.testing.assert_close(loss, torch.tensor((-1.2 + 0.8 + 2.2 - 0.7) / 4))
    # 1.5 and 0.5 took the clipped term (no gradient); 0.7 is outside the range too, but its advantage
    # pushes it back inside, so its loss is the unclipped one
    assert stats["clipped_objective_fraction"].item() == pytest.approx(0.5)


def test_clip_fraction_is_cleanrls_ratio_outside_the_clip_range():
    """CleanRL's ``losses/clipfrac``, ``((ratio - 1).abs() > clip_coef).mean()``, whatever the
    advantage's sign (the PPO scripts bench/control_vs_cleanrl.py runs); with clip-higher, the
    range is [1 - clip_low, 1 + clip_high]."""
    ratios = torch.tensor([1.5, 0.5, 1.1, 0.7, 1.25, 0.85])
    new, old = torch.log(ratios), torch.zeros(6)
    advantages = torch.tensor([1.0, -1.0, -2.0, 1.0, 1.0, -1.0])
    _, stats = ppo_clip(new, old, advantages, cfg=PolicyLossConfig(clip_low=0.2))
    assert stats["clip_fraction"].item() == pytest.approx(4 / 6)  # 1.5, 0.5, 0.7 and 1.25 are outside [0.8, 1.2]
    mask = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    _, stats = ppo_clip(new, old, advantages, mask, PolicyLossConfig(clip_low=0.1, clip_high=0.3))
    assert stats["clip_fraction"].item() == pytest.approx(3 / 5)  # 1.5, 0.5, 0.7 outside [0.9, 1.3]; 0.85 masked


def test_ppo_mask_and_clip_higher():
    old = torch.zeros(3)
    new = torch.log(torch.tensor([1.3, 1.3, 5.0]))
    adv = torch.ones(3)
    mask = torch.tensor([1.0, 1.0, 0.0])
    loss, _ = ppo_clip(new, old, adv, mask, PolicyLossConfig(clip_low=0.2, clip_high=0.28))
    torch.testing.assert_close(loss, torch.tensor(-1.28))


def test_aggregations_weigh_tokens_and_sequences_differently():
    loss = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(8 / 5)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((1 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", normalizer=4).item() == pytest.approx((4 + 4) / 2 / 4)
    with pytest.raises(OmnigymError, match="unknown loss aggregation"):
        aggregate(loss, mask, "nope")


def test_value_loss_clipped_is_pessimistic():
    new, old, ret = torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([3.0])
    assert value_loss(new, old, ret).item() == pytest.approx(0.5)
    # clipped prediction 0.5 is further from 3 than 2 is: the max picks it
    assert value_loss(new, old, ret, clip=0.5).item() == pytest.approx(0.5 * 2.5**2)


def test_kl_estimators():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    r = math.log(2)
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(r)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * r * r)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.5 - 1 + r)
    assert kl_estimate(ref, ref, "k3").item() == 0.0


def test_nan_loss_is_a_clear_error():
    with pytest.raises(OmnigymError, match="loss became nan at step 7"):
        check_finite(torch.tensor(float("nan")), 7)


def test_policy_losses_share_one_signature_and_weigh_stale_samples():
    """Every registered loss takes (new, old, advantages, mask, cfg, behaviour); with a cap,
    each token is weighted by min(pi_old / pi_behaviour, cap) (truncated importance sampling)."""
    new = torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_()
    old = new.detach().clone()
    behaviour = torch.log(torch.tensor([[0.25, 0.5]]))  # the sampler gave token 0 half the probability
    adv, mask = torch.ones(1, 2), torch.ones(1, 2)
    for name, loss_fn in POLICY_LOSSES.items():
        plain, _ = loss_fn(new, old, adv, mask, PolicyLossConfig())
        weighted, _ = loss_fn(new, old, adv, mask, PolicyLossConfig(behaviour_cap=1.5), behaviour)
        unweighted, _ = loss_fn(new, old, adv, mask, PolicyLossConfig(), behaviour)  # no cap: no correction
        assert unweighted.item() == plain.item(), name
        # token 0: weight min(0.5 / 0.25, 1.5) = 1.5; token 1: weight 1
        per_token = plain.item()  # both tokens contribute the same unweighted value
        assert weighted.item() == pytest.approx(per_token * (1.5 + 1.0) / 2), name
    with pytest.raises(OmnigymError, match="unknown policy loss 'nope'"):
        get_policy_loss("nope")


def test_nll_loss_counts_masked_tokens_only():
    logprobs = torch.log(torch.tensor([[0.5, 0.25, 0.1]]))
    assert nll_loss(logprobs, torch.tensor([[1.0, 1.0, 0.0]])).item() == pytest.approx(-(math.log(0.5) + math.log(0.25)) / 2)


def test_bradley_terry_matches_its_formula_and_centres_scores():
    from omnigym.rl.losses import bradley_terry

    chosen, rejected = torch.tensor([2.0, -1.0]), torch.tensor([0.5, 1.0])
    loss, stats = bradley_terry(chosen, rejected)
    expected = (math.log1p(math.exp(-1.5)) + math.log1p(math.exp(2.0))) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert stats["accuracy"].item() == 0.5 and stats["margin"].item() == pytest.approx(-0.25)
    with_margin, _ = bradley_terry(chosen, rejected, margin=torch.tensor([1.0, 0.0]))
    assert with_margin.item() == pytest.approx((math.log1p(math.exp(-0.5)) + math.log1p(math.exp(2.0))) / 2, rel=1e-6)
    centred, _ = bradley_terry(chosen, rejected, center_coef=0.01)
    assert centred.item() == pytest.approx(expected + 0.01 * (2.5 ** 2 + 0.0 ** 2) / 2, rel=1e-6)


@pytest.mark.parametrize("kind", ["sigmoid", "ipo", "hinge", "simpo"])
def test_preference_losses_match_their_formulas(kind):
    from omnigym.rl.losses import preference_loss

    pol_c, pol_r = torch.tensor([-3.0, -5.0]), torch.tensor([-4.0, -4.0])
    ref_c, ref_r = torch.tensor([-3.5, -5.0]), torch.tensor([-3.5, -4.5])
    beta = 0.5
    loss, stats = preference_loss(pol_c, pol_r, None if kind == "simpo" else ref_c, None if kind == "simpo" else ref_r,
                                  kind, beta, simpo_gamma=0.25)
    if kind == "simpo":
        h = [(c - r) for c, r in zip(pol_c.tolist(), pol_r.tolist())]
        logits = [beta * x - 0.25 for x in h]
    else:
        h = [(c - rc) - (r - rr) for c, rc, r, rr in zip(pol_c.tolist(), ref_c.tolist(), pol_r.tolist(), ref_r.tolist())]
        logits = [beta * x for x in h]
    per_pair = {"sigmoid": [math.log1p(math.exp(-z)) for z in logits], "simpo": [math.log1p(math.exp(-z)) for z in logits],
                "ipo": [(x - 1 / (2 * beta)) ** 2 for x in h], "hinge": [max(0.0, 1 - z) for z in logits]}[kind]
    assert loss.item() == pytest.approx(sum(per_pair) / 2, rel=1e-6)
    assert stats["rewards/margin"].item() == pytest.approx(beta * sum(h) / 2, rel=1e-6)
    assert stats["rewards/accuracy"].item() == sum(x > 0 for x in h) / 2


def test_conservative_dpo_and_the_reference_requirement():
    from omnigym.rl.losses import preference_loss

    c, r, zero = torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([0.0])
    smoothed, _ = preference_loss(c, r, zero, zero, "sigmoid", beta=1.0, label_smoothing=0.1)
    assert smoothed.item() == pytest.approx(0.9 * math.log1p(math.exp(-2.0)) + 0.1 * math.log1p(math.exp(2.0)), rel=1e-6)
    with pytest.raises(OmnigymError, match="needs the reference model's log-probs"):
        preference_loss(c, r, None, None, "sigmoid")
    with pytest.raises(OmnigymError, match="unknown preference loss 'kto'"):
        preference_loss(c, r, zero, zero, "kto")
