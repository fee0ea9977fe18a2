"""PPO-RLHF's per-token reward, GAE, advantage whitening and value loss against the formulas of
OpenRLHF 0.11 (``openrlhf.models.utils.compute_reward`` and ``compute_approx_kl``,
``PPOTrainer``'s ``get_advantages_and_returns`` and advantage normalisation,
``openrlhf.models.loss.ValueLoss``), written out here: TRL 1.x no longer ships a PPO trainer
and OpenRLHF cannot be imported without DeepSpeed and flash-attn (a CUDA build), which
``[dev]`` does not install. On one fixed batch of replies of unequal lengths:

- the reward of token t is ``-beta * (log pi_old - log ref)`` (OpenRLHF's and TRL's ``k1``), plus
  the reply's score at its last token (less ``--missing-eos-penalty`` for a reply that never
  ended, TRL's ``missing_eos_penalty``);
- GAE over the reply's tokens, the value after the last token 0; returns = advantages + values;
- the value loss ``0.5 * mean over tokens of max((V - R)^2, (V_clipped - R)^2)``.

One difference, asserted: the advantages are whitened with the unbiased (n - 1) variance and
``std + 1e-8`` (as TRL's ``masked_whiten`` did), where OpenRLHF divides by the biased standard
deviation, so omnigym's whitened advantages are OpenRLHF's times ``sqrt((n - 1) / n)`` for
``n`` valid tokens (0.978 for the 23 tokens here).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from omnigym.algos.lm.rlhf import RLHFConfig, ScoredBatch, token_advantages
from omnigym.rl.losses import value_loss

TOLERANCE = 1e-5
LENGTHS = [7, 3, 1, 5, 7]
WIDTH = max(LENGTHS)
BETA, GAMMA, LAM, EOS_PENALTY, VALUE_CLIP = 0.05, 0.97, 0.95, 1.0, 0.2


def fixed_batch() -> tuple[ScoredBatch, dict]:
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1.0] * n + [0.0] * (WIDTH - n) for n in LENGTHS])
    old_logprobs = -torch.rand(len(LENGTHS), WIDTH, generator=g) * 3 * mask
    ref_logprobs = -torch.rand(len(LENGTHS), WIDTH, generator=g) * 3 * mask
    values = torch.randn(len(LENGTHS), WIDTH, generator=g) * mask
    scores = torch.randn(len(LENGTHS), generator=g)
    finished = torch.tensor([True, False, True, True, False])
    batch = ScoredBatch(prompt_ids=None, completions=[[0] * n for n in LENGTHS], pad_id=0,
                        tokens=SimpleNamespace(loss_mask=mask), finished=finished, old_logprobs=old_logprobs,
                        behaviour_logprobs=None, kl=(old_logprobs - ref_logprobs) * mask, scores=scores,
                        penalised=scores - EOS_PENALTY * (~finished).float(), old_values=values)
    return batch, {"mask": mask, "logprobs": old_logprobs, "ref": ref_logprobs, "values": values, "scores": scores,
                   "finished": finished}


def openrlhf_rewards(x: dict) -> torch.Tensor:
    """compute_reward: -kl_coef * kl everywhere, the (penalised) score added at the last valid token."""
    kl = (x["logprobs"] - x["ref"]) * x["mask"]  # compute_approx_kl, k1
    score = x["scores"] - EOS_PENALTY * (~x["finished"]).float()
    last = x["mask"].size(1) - 1 - x["mask"].long().fliplr().argmax(dim=1)
    rewards = -BETA * kl
    rewards[torch.arange(len(last)), last] += score
    return rewards


def openrlhf_gae(values, rewards, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """get_advantages_and_returns: the masked GAE recursion over the whole width."""
    values, rewards = values * mask, rewards * mask
    advantages, running = torch.zeros_like(rewards), torch.zeros(len(rewards))
    for t in reversed(range(rewards.size(1))):
        next_values = values[:, t + 1] if t + 1 < rewards.size(1) else 0.0
        running = rewards[:, t] + GAMMA * next_values - values[:, t] + GAMMA * LAM * running
        advantages[:, t] = running
    return advantages, advantages + values


def openrlhf_whiten(advantages, mask) -> torch.Tensor:
    n = mask.sum()
    mean = (advantages * mask).sum() / n
    var = ((advantages - mean) ** 2 * mask).sum() / n  # biased
    return (advantages - mean) * var.clamp(min=1e-8).rsqrt()


def test_kl_penalised_rewards_gae_and_returns_match_openrlhfs_formulas():
    batch, x = fixed_batch()
    cfg = RLHFConfig(gamma=GAMMA, lam=LAM, whiten_rewards=False)
    advantages, returns = token_advantages(cfg, batch, BETA)
    their_advantages, their_returns = openrlhf_gae(x["values"], openrlhf_rewards(x), x["mask"])
    mask = x["mask"].bool()
    assert (returns - their_returns)[mask].abs().max() < TOLERANCE
    n = x["mask"].sum()
    rescaled = openrlhf_whiten(their_advantages, x["mask"]) * ((n - 1) / n).sqrt()
    assert (advantages - rescaled)[mask].abs().max() < TOLERANCE
    assert (advantages[~mask] == 0).all()
    # the unbiased/biased factor is visible at this size (n = 23): the difference is a real one
    assert (advantages - openrlhf_whiten(their_advantages, x["mask"]))[mask].abs().max() > 100 * TOLERANCE


def test_a_reply_that_never_ended_pays_the_penalty_on_its_last_token_only():
    batch, x = fixed_batch()
    cfg = RLHFConfig(gamma=1.0, lam=1.0, whiten_rewards=False)
    _, returns = token_advantages(cfg, batch, beta=0.0)  # no KL: the return of every token is the score
    for row, (n, done) in enumerate(zip(LENGTHS, x["finished"].tolist())):
        expected = x["scores"][row] - (0.0 if done else EOS_PENALTY)
        assert torch.allclose(returns[row, :n], expected.expand(n), atol=TOLERANCE)


def test_value_loss_matches_openrlhfs_clipped_value_loss():
    batch, x = fixed_batch()
    g = torch.Generator().manual_seed(1)
    new_values = (x["values"] + torch.randn(x["values"].shape, generator=g) * 0.4) * x["mask"]
    returns = token_advantages(RLHFConfig(gamma=GAMMA, lam=LAM), batch, BETA)[1]
    ours = value_loss(new_values, x["values"], returns, x["mask"], VALUE_CLIP)
    clipped = x["values"] + (new_values - x["values"]).clamp(-VALUE_CLIP, VALUE_CLIP)
    per_token = torch.max((clipped - returns) ** 2, (new_values - returns) ** 2)
    theirs = 0.5 * (per_token * x["mask"]).sum() / x["mask"].sum()  # ValueLoss, token-level aggregation
    assert ours.item() == pytest.approx(theirs.item(), abs=TOLERANCE)
    # the clip bites on this batch: without it the loss is another number
    assert value_loss(new_values, x["values"], returns, x["mask"], None).item() != pytest.approx(theirs.item(),
                                                                                                 abs=1e-3)
