"""GRPO's loss against TRL's ``GRPOTrainer``: the same tiny Llama, the same batch (prompts,
completions of unequal lengths, per-sequence advantages, stored old log-probs that put some
ratios outside the clip range, a reference model's log-probs), TRL's own ``compute_loss``.

TRL's ``loss_type`` names an aggregation; omnigym's ``--loss-aggregation`` is the same choice:

    grpo    -> seq-mean-token-mean      (each sequence weighs the same; the GRPO paper)
    dr_grpo -> seq-mean-token-sum-norm  (token sums over batch x max_completion_length; Dr. GRPO)
    dapo    -> token-mean               (every token of the batch weighs the same; DAPO)
    bnpo    -> token-mean               (the same on one process and one accumulation step)

Both add ``beta`` times the k3 estimate of KL(policy || reference) per token, aggregated like
the policy term, and take DAPO's clip-higher as an upper bound above the lower. The loss and
its gradient agree to float32 rounding with TRL's ``use_bias_correction_kl=False``.

One difference, on purpose: TRL (since 0.2x, default on) multiplies each token's KL by the
ratio pi / pi_old (DeepSeek-V3.2's unbiased KL gradient); omnigym keeps the GRPO paper's
unweighted k3 term. The ratio carries a gradient even where it is 1, so the two gradients
differ whenever beta > 0; the last test asserts TRL's default loss is exactly omnigym's plus
``beta * aggregate(kl * (ratio - 1))``. Skips when TRL is not installed (``[bench]`` in ``[dev]``).
"""

from __future__ import annotations

import pytest
import torch

from omnigym.algos.lm.grpo import GRPOConfig, PolicyBatch, grpo_loss
from omnigym.models.tokens import completion_logprobs, make_completion_batch
from omnigym.rl.losses import PolicyLossConfig

trl = pytest.importorskip("trl", reason="TRL is not installed (pip install 'omnigym[bench]', in [dev])")

TOLERANCE = 1e-5
AGGREGATION = {"grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm", "dapo": "token-mean",
               "bnpo": "token-mean"}
MAX_COMPLETION = 10
BETA, CLIP_LOW, CLIP_HIGH = 0.04, 0.2, 0.28
# TRL left-pads prompts and gives the model no position ids, so prompts of one length keep both
# sides' positions the same; the completions differ in length, which is what the aggregations weigh.
PROMPTS = ["2+2=", "7*3=", "9-4=", "1+8="]
COMPLETIONS = ["4", "21 is it", "five, I think", "9."]
ADVANTAGES = [1.0, -0.6, 0.8, -1.3]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    from omnigym.models.lm import build_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    policy_dir, reference_dir = build_tiny_model(root / "policy", seed=0), build_tiny_model(root / "ref", seed=1)
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    reference = AutoModelForCausalLM.from_pretrained(reference_dir)
    trainers = {}
    for loss_type, corrected in [(name, False) for name in AGGREGATION] + [("dapo", True)]:
        args = TRLConfig(output_dir=str(root / f"trl-{loss_type}"), report_to="none", use_cpu=True, bf16=False,
                         loss_type=loss_type, beta=BETA, epsilon=CLIP_LOW, epsilon_high=CLIP_HIGH, num_generations=2,
                         per_device_train_batch_size=2, max_completion_length=MAX_COMPLETION,
                         use_bias_correction_kl=corrected)
        trainers[loss_type, corrected] = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(policy_dir),
                                          reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                                          train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]),
                                          processing_class=tokenizer)
    return trainers, reference, tokenizer


def fixed_batch(model, reference, tokenizer):
    """The batch both sides score: token ids, masks, and log-probs the loss takes as given."""
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    completions = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in COMPLETIONS]
    assert len({len(p) for p in prompts}) == 1 and len({len(c) for c in completions}) > 2
    tokens = make_completion_batch(prompts, completions, tokenizer.pad_token_id)
    with torch.no_grad():
        current = completion_logprobs(model, tokens)
        ref_logprobs = completion_logprobs(reference, tokens)
    # old log-probs away from the current ones: ratios from about 0.6 to 1.6, some past each bound
    shift = torch.linspace(-0.5, 0.45, current.numel()).view_as(current)
    old_logprobs = (current + shift) * tokens.loss_mask
    advantages = torch.tensor(ADVANTAGES)
    return tokens, advantages, old_logprobs, ref_logprobs * tokens.loss_mask


def trl_inputs(tokens, advantages, old_logprobs, ref_logprobs, prompts_ids):
    return {"prompt_ids": prompts_ids, "prompt_mask": torch.ones_like(prompts_ids),
            "completion_ids": tokens.targets, "completion_mask": tokens.loss_mask.long(),
            "advantages": advantages, "old_per_token_logps": old_logprobs, "ref_per_token_logps": ref_logprobs,
            "num_items_in_batch": tokens.loss_mask.sum()}


def losses_and_gradients(loss_type, setup, corrected=False):
    trainers, reference, tokenizer = setup
    trainer = trainers[loss_type, corrected]
    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by TRL's training loop; one step, no accumulation
    tokens, advantages, old_logprobs, ref_logprobs = fixed_batch(model, reference, tokenizer)
    prompt_ids = torch.tensor([tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS])

    model.zero_grad()
    theirs = trainer.compute_loss(model, trl_inputs(tokens, advantages, old_logprobs, ref_logprobs, prompt_ids))
    theirs.backward()
    their_grads = [p.grad.clone() for p in model.parameters()]

    cfg = GRPOConfig(beta=BETA, loss_aggregation=AGGREGATION[loss_type], clip_low=CLIP_LOW, clip_high=CLIP_HIGH,
                     max_new_tokens=MAX_COMPLETION, kl_estimator="k3")
    # as grpo.train builds it: the sum-norm constant is --max-new-tokens, TRL's max_completion_length
    loss_cfg = PolicyLossConfig(cfg.clip_low, cfg.clip_high, cfg.loss_aggregation, normalizer=cfg.max_new_tokens)
    per_token_advantages = advantages[:, None].expand_as(tokens.loss_mask).contiguous()
    model.zero_grad()
    ours, stats = grpo_loss(model, PolicyBatch(tokens, per_token_advantages, old_logprobs, ref_logprobs, None), cfg,
                            loss_cfg, step=0)
    ours.backward()
    our_grads = [p.grad.clone() for p in model.parameters()]
    stats["batch"] = (tokens, old_logprobs, ref_logprobs, loss_cfg)
    return theirs.detach(), ours.detach(), their_grads, our_grads, stats


@pytest.mark.parametrize("loss_type", list(AGGREGATION))
def test_grpo_loss_and_gradient_match_trls_grpo_trainer(loss_type, setup):
    theirs, ours, their_grads, our_grads, stats = losses_and_gradients(loss_type, setup)
    assert ours.item() == pytest.approx(theirs.item(), abs=TOLERANCE)
    largest = max((a - b).abs().max().item() for a, b in zip(their_grads, our_grads))
    scale = max(g.abs().max().item() for g in their_grads)
    assert largest <= TOLERANCE * max(1.0, scale), (largest, scale)
    # the batch exercises both clip bounds: a test of the clip would pass without it otherwise
    assert 0 < stats["clipped_objective_fraction"].item() < 1


def test_the_aggregations_differ_on_this_batch(setup):
    """Unequal lengths make the three aggregations give three losses (so each match above says something)."""
    values = {loss_type: losses_and_gradients(loss_type, setup)[1].item() for loss_type in ("grpo", "dr_grpo", "dapo")}
    assert len({round(v, 4) for v in values.values()}) == 3, values


def test_trls_default_kl_is_weighted_by_the_ratio_where_omnigyms_is_not(setup):
    from omnigym.rl.losses import aggregate, kl_estimate

    trainers, reference, tokenizer = setup
    theirs, ours, their_grads, our_grads, stats = losses_and_gradients("dapo", setup, corrected=True)
    tokens, old_logprobs, ref_logprobs, loss_cfg = stats["batch"]
    with torch.no_grad():
        new = completion_logprobs(trainers["dapo", True].model, tokens)
    kl = kl_estimate(new, ref_logprobs, "k3")
    extra = BETA * aggregate(kl * ((new - old_logprobs).exp() - 1), tokens.loss_mask, loss_cfg.aggregation)
    # the tiny models' KL is small, so is the extra term: compared to float32 rounding of the loss
    assert extra.abs().item() > 1e-6
    assert theirs.item() - ours.item() == pytest.approx(extra.item(), abs=1e-7)
    # the weight's gradient (kl x grad log pi) is what changes training
    assert max((a - b).abs().max().item() for a, b in zip(their_grads, our_grads)) > 100 * TOLERANCE
