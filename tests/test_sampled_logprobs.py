"""Every engine records the log-prob of the distribution it drew each token from: the
temperature, top-k and top-p it sampled with included (an importance ratio against a
log-prob of another distribution is not one). Checked against a hand computation, against
Hugging Face's own logits warpers, and on both in-process engines end to end."""

import math
import re

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from omnigym.inference.engine import SamplingParams, drawn_logprobs, processed_logits  # noqa: E402
from omnigym.inference.hf import HFEngine  # noqa: E402
from omnigym.inference.kv import LlamaFamilyEngine  # noqa: E402
from omnigym.inference.recurrent import RecurrentEngine  # noqa: E402
from omnigym.models.lm import build_tiny_model, load_model, load_policy_and_tokenizer, load_tokenizer  # noqa: E402

ENGINES = {"hf": HFEngine, "kv": LlamaFamilyEngine, "recurrent": RecurrentEngine}
PROMPTS = [[4, 20, 21, 22, 5], [4, 30, 31, 5]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = str(build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0))
    return load_model(path), load_tokenizer(path)


@pytest.fixture(scope="module")
def policies(tiny):
    """The model each engine samples: the recurrent one an LSTM LM (``--model lstm``)."""
    lstm = load_policy_and_tokenizer("lstm", seed=0, lstm_hidden=32)
    return {"hf": tiny, "kv": tiny, "recurrent": lstm}


def test_processed_logprobs_by_hand():
    """Four tokens, logits 0, 3, 1, 2.9, temperature 0.5, top-k 3, top-p 0.9, in plain floats."""
    logits = [0.0, 3.0, 1.0, 2.9]
    scaled = [x / 0.5 for x in logits]
    kept = sorted(range(4), key=lambda i: -scaled[i])[:3]  # top-k 3: tokens 1, 3, 2
    total = sum(math.exp(scaled[i]) for i in kept)
    probs = {i: math.exp(scaled[i]) / total for i in kept}  # 0.5465, 0.4475, 0.0060
    # top-p 0.9: token 2 goes (the least likely alone holds 0.006 <= 0.1), then token 3 would
    # take 0.4535 > 0.1 with it, so 1 and 3 stay
    assert probs[2] <= 0.1 < probs[2] + probs[3]
    z = probs[1] + probs[3]
    expected = [float("-inf"), math.log(probs[1] / z), float("-inf"), math.log(probs[3] / z)]

    params = SamplingParams(temperature=0.5, top_k=3, top_p=0.9)
    got = drawn_logprobs(processed_logits(torch.tensor([logits]), params).expand(4, 4), torch.arange(4))
    assert got[[0, 2]].tolist() == [float("-inf")] * 2
    assert got[[1, 3]].tolist() == pytest.approx([expected[1], expected[3]], abs=1e-6)
    # the same token under the full distribution at that temperature: what the trainer computes
    full = math.log(math.exp(scaled[1]) / sum(math.exp(x) for x in scaled))
    assert got[1].item() - full == pytest.approx(-math.log(z * total / sum(math.exp(x) for x in scaled)), abs=1e-6)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 1, 1.0), (0.8, 5, 1.0),
                                                     (1.3, 0, 0.5), (0.6, 20, 0.9), (1.0, 0, 0.999), (2.0, 3, 0.3)])
def test_processed_logits_agree_with_transformers_warpers(temperature, top_k, top_p):
    """Hugging Face's own TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper, in
    the order ``generate`` applies them, cut the same tokens and leave the same values."""
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)

    torch.manual_seed(temperature * 100 + top_k)
    logits = torch.randn(64, 50) * 3
    logits[0, :10] = 1.5  # ties at the top-k and top-p boundaries
    reference = logits.clone()
    if temperature != 1.0:
        reference = TemperatureLogitsWarper(temperature)(None, reference)
    if top_k:
        reference = TopKLogitsWarper(top_k)(None, reference)
    if top_p < 1.0:
        reference = TopPLogitsWarper(top_p)(None, reference)
    ours = processed_logits(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    assert torch.equal(ours.isinf(), reference.isinf())
    assert torch.equal(ours, reference)


def recomputed(model, sample, params: SamplingParams) -> torch.Tensor:
    """The sampled tokens' log-probs from a fresh forward over prompt + completion, processed
    by Hugging Face's warpers (not omnigym's): the distribution each was drawn from."""
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)

    ids = torch.tensor([sample.prompt_ids + sample.completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(sample.prompt_ids) - 1:-1].float()
    for warper in (TemperatureLogitsWarper(params.temperature), TopKLogitsWarper(params.top_k) if params.top_k else None,
                   TopPLogitsWarper(params.top_p) if params.top_p < 1 else None):
        if warper is not None:
            logits = warper(None, logits)
    return logits.log_softmax(-1).gather(-1, torch.tensor(sample.completion_ids)[:, None]).squeeze(-1)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_top_k_1_sample_is_certain(policies, engine):
    """With top-k 1 there is one token to draw: each log-prob is 0 (it was -3.9 and lower when
    engines recorded the temperature's full distribution)."""
    model, tokenizer = policies[engine]
    torch.manual_seed(0)
    samples = [s for group in ENGINES[engine](model, tokenizer).generate(
        PROMPTS, 3, SamplingParams(max_new_tokens=12, temperature=0.7, top_k=1)) for s in group]
    assert sum(len(s.logprobs) for s in samples) >= 12
    assert max(abs(x) for s in samples for x in s.logprobs) < 1e-6
    # and it drew the greedy answer
    greedy = ENGINES[engine](model, tokenizer).generate(PROMPTS, 1, SamplingParams(max_new_tokens=12, greedy=True))
    assert [s.completion_ids for s in samples[::3]] == [g[0].completion_ids for g in greedy]


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 5, 1.0), (1.2, 0, 0.8), (0.9, 8, 0.7), (1.0, 0, 1.0)])
def test_engines_record_the_distribution_they_drew_from(policies, engine, temperature, top_k, top_p):
    model, tokenizer = policies[engine]
    params = SamplingParams(max_new_tokens=16, temperature=temperature, top_k=top_k, top_p=top_p)
    torch.manual_seed(1)
    samples = [s for group in ENGINES[engine](model, tokenizer).generate(PROMPTS, 4, params) for s in group]
    assert len({tuple(s.completion_ids) for s in samples}) > 2  # it samples
    for s in samples:
        want = recomputed(model, s, params)
        assert want.isfinite().all()  # every drawn token was inside the cut
        assert torch.allclose(torch.tensor(s.logprobs), want, atol=1e-4)
    if top_k or top_p < 1:  # the cut distribution is not the full one: the old record differs
        full = [recomputed(model, s, SamplingParams(temperature=temperature)) for s in samples]
        assert max((torch.tensor(s.logprobs) - f).abs().max().item() for s, f in zip(samples, full)) > 1e-3


@pytest.mark.parametrize("settings, message", [
    ({"temperature": 0.0}, "temperature must be a finite number above 0"),
    ({"temperature": float("nan")}, "temperature must be a finite number above 0"),
    ({"temperature": -1.0}, "temperature must be a finite number above 0"),
    ({"top_k": -5}, "top_k must be a whole number"),
    ({"top_p": 0.0}, "top_p must be in (0, 1]"),
    ({"max_new_tokens": -1}, "max_new_tokens must be a whole number"),
])
def test_sampling_params_refuse_what_no_engine_can_draw_from(settings, message):
    """The kv engine drew token 0 with NaN log-probs at temperature 0 or nan, and took the rest in silence."""
    with pytest.raises(ValueError, match=re.escape(message)):
        SamplingParams(**settings)
    SamplingParams(temperature=0.0, greedy=True)  # greedy ignores the temperature


def test_a_negative_sample_count_is_refused():
    from omnigym.inference.engine import check_samples_asked

    with pytest.raises(ValueError, match="n \\(samples per prompt\\) must be a whole number, 1 or more, got -1"):
        check_samples_asked(-1)
