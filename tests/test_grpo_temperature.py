"""GRPO's ratio and its behaviour weight compare like with like: the trainer's log-probs are
taken at the run's --temperature, the one the engine sampled (and recorded mu) at. They were
taken at temperature 1 whatever --temperature said, so an on-policy batch sampled at 0.5 got
behaviour weights min(pi_old / mu, C) far from 1 (TRL and verl divide the logits by the
sampling temperature; so does omnigym's RLHF)."""

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from omnigym.algos.lm import grpo  # noqa: E402
from omnigym.inference.engine import SamplingParams  # noqa: E402
from omnigym.inference.kv import LlamaFamilyEngine  # noqa: E402
from omnigym.models.lm import build_tiny_model, load_model, load_tokenizer  # noqa: E402
from omnigym.models.tokens import make_completion_batch, padded  # noqa: E402
from omnigym.rl.losses import PolicyLossConfig  # noqa: E402


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_an_on_policy_batch_has_behaviour_weights_of_one(tmp_path, temperature):
    path = str(build_tiny_model(tmp_path, seed=0))
    model, tokenizer = load_model(path), load_tokenizer(path)
    torch.manual_seed(0)
    samples = [s for group in LlamaFamilyEngine(model, tokenizer).generate(
        [[4, 20, 21, 22, 5], [4, 30, 31, 5]], 3, SamplingParams(max_new_tokens=10, temperature=temperature))
        for s in group]
    tokens = make_completion_batch([s.prompt_ids for s in samples], [s.completion_ids for s in samples],
                                   tokenizer.pad_token_id)
    width = tokens.loss_mask.shape[1]
    advantages = torch.linspace(-1, 1, len(samples))[:, None].expand(-1, width).clone()
    behaviour = padded([s.logprobs for s in samples], width)
    cfg = grpo.GRPOConfig(temperature=temperature, beta=0.0)
    corrected, plain = (grpo.grpo_loss(model, grpo.PolicyBatch(tokens, advantages, None, None, mu), cfg,
                                       PolicyLossConfig(behaviour_cap=2.0), step=0)[0]
                        for mu in (behaviour, None))
    # the weight exp(log pi_old - log mu) is 1 on every token: the same loss as with no correction
    assert corrected.item() == pytest.approx(plain.item(), abs=1e-5)
