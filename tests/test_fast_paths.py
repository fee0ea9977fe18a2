"""The two fast paths of the language loop compute exactly what the plain ones do:
the lean KV-cache sampler against Hugging Face ``generate``, and shared-prompt
log-probs against a full forward pass over every padded sequence."""

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from omnigym.inference import kv, make_engine  # noqa: E402
from omnigym.inference.engine import Sample, SamplingParams, draw, processed_logits  # noqa: E402
from omnigym.inference.hf import HFEngine  # noqa: E402
from omnigym.inference.kv import LlamaFamilyEngine  # noqa: E402
from omnigym.errors import OmnigymError  # noqa: E402
from omnigym.models.lm import LoraSettings, build_tiny_model, load_model, load_tokenizer  # noqa: E402
from omnigym.models.tokens import completion_logprobs, make_batch, make_completion_batch, token_logprobs  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0))


def family_model(kind: str, vocab_size: int):
    """Small random models of each supported architecture, with the features that differ:
    Qwen2's q/k/v biases, Qwen3's per-head q/k norms, grouped-query attention, RoPE scaling."""
    import transformers

    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0)
    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(**common, rope_scaling={"rope_type": "linear", "factor": 2.0})
    elif kind == "qwen2":
        config = transformers.Qwen2Config(**common)
    else:
        config = transformers.Qwen3Config(**common, head_dim=16)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # random biases and norms, so that a path that ignored them would show
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    return model


PROMPTS = [[4, 20, 21, 22, 5], [4, 30, 31, 32, 33, 34, 35, 36, 5], [4, 40, 5]]


def shared_prompts_always(monkeypatch) -> list:
    """Decoding reads each prompt's cache once (``SharedPrompts``) even for these small batches;
    the returned list fills with one entry per decoding attention call it served."""
    calls, attend = [], kv.SharedPrompts.attend

    def counted(self, *args):
        calls.append(1)
        return attend(self, *args)

    monkeypatch.setattr(kv, "SHARED_PROMPT_MIN_TOKENS", 1)
    monkeypatch.setattr(kv.SharedPrompts, "attend", counted)
    return calls


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_kv_sampler_matches_generate(tiny, kind, shared, monkeypatch):
    tokenizer = load_tokenizer(tiny)
    model = family_model(kind, len(tokenizer))
    greedy = SamplingParams(max_new_tokens=12, greedy=True)
    expected = HFEngine(model, tokenizer).generate(PROMPTS, 2, greedy)
    calls = shared_prompts_always(monkeypatch) if shared else []
    got = LlamaFamilyEngine(model, tokenizer).generate(PROMPTS, 2, greedy)
    assert bool(calls) == shared
    for want_group, got_group in zip(expected, got):
        for want, have in zip(want_group, got_group):
            assert have.completion_ids == want.completion_ids
            assert torch.allclose(torch.tensor(have.logprobs), torch.tensor(want.logprobs), atol=1e-4)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_shared_prompt_decoding_equals_copied_caches(tiny, kind, monkeypatch):
    """Rows that sample the same prompt (a prompt given twice, n samples each, prompts of
    different lengths: groups of unequal size, out of order) decode to the same tokens with the
    same log-probs, up to float rounding, whether each row reads its own copy of its prompt's
    cache or every prompt's cache is read once for all its rows."""
    tokenizer = load_tokenizer(tiny)
    model = family_model(kind, len(tokenizer))
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[2]]
    for params in (SamplingParams(max_new_tokens=12, greedy=True), SamplingParams(max_new_tokens=12)):
        torch.manual_seed(0)
        copied = [s for g in LlamaFamilyEngine(model, tokenizer).generate(prompts, 3, params) for s in g]
        with monkeypatch.context() as patch:
            calls = shared_prompts_always(patch)
            torch.manual_seed(0)
            shared = [s for g in LlamaFamilyEngine(model, tokenizer).generate(prompts, 3, params) for s in g]
        assert calls
        for want, have in zip(copied, shared):
            assert have.completion_ids == want.completion_ids and have.finished == want.finished
            assert torch.allclose(torch.tensor(have.logprobs), torch.tensor(want.logprobs), atol=1e-5)


def test_stop_ids_end_samples_in_both_engines(tiny):
    """``stop_ids`` end a sample as the end token does, in the KV sampler and in ``generate``
    alike: cut after the first one, finished, and the rest of the row not sampled."""
    tokenizer = load_tokenizer(tiny)
    model = family_model("llama", len(tokenizer))
    free = LlamaFamilyEngine(model, tokenizer).generate(PROMPTS, 1, SamplingParams(max_new_tokens=12, greedy=True))
    full = free[1][0].completion_ids
    assert len(full) >= 4 and not free[1][0].finished
    stop = full[3]
    params = SamplingParams(max_new_tokens=12, greedy=True, stop_ids=(stop,))
    for engine in (HFEngine(model, tokenizer), LlamaFamilyEngine(model, tokenizer)):
        got = engine.generate(PROMPTS, 1, params)[1][0]
        assert got.completion_ids == full[:full.index(stop) + 1] and got.finished
        assert len(got.logprobs) == len(got.completion_ids)


def test_kv_sampler_logprobs_are_the_models(tiny):
    tokenizer, model = load_tokenizer(tiny), load_model(tiny)
    torch.manual_seed(0)
    samples = [s for g in LlamaFamilyEngine(model, tokenizer).generate(PROMPTS, 4, SamplingParams(max_new_tokens=16))
               for s in g]
    assert len({tuple(s.completion_ids) for s in samples}) > 3  # it samples, it does not repeat one answer
    full = token_logprobs(model, make_batch([(s.prompt_ids, s.completion_ids) for s in samples],
                                            tokenizer.pad_token_id))
    for i, s in enumerate(samples):
        start = len(s.prompt_ids) - 1
        assert torch.allclose(full[i, start:start + len(s.completion_ids)], torch.tensor(s.logprobs), atol=1e-4)


def test_top_k_and_top_p_filtering():
    torch.manual_seed(0)
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9]]).repeat(2000, 1)

    def sample(logits, top_k=0, top_p=1.0):
        return draw(processed_logits(logits, SamplingParams(top_k=top_k, top_p=top_p)))

    assert (sample(logits, top_k=1) == 1).all()
    assert (sample(logits, top_p=0.01) == 1).all()
    drawn = sample(logits, top_k=2)
    assert set(drawn.tolist()) == {1, 3}
    # probabilities 0.024, 0.479, 0.065, 0.433: tokens 1 and 3 hold 0.911 of the mass
    assert set(sample(logits, top_p=0.9).tolist()) == {1, 3}
    assert set(sample(logits, top_p=0.95).tolist()) == {1, 2, 3}


def test_kv_sampler_on_a_large_vocabulary_records_the_models_logprobs(tiny):
    """A vocabulary past RACE_MAX_VOCABULARY is drawn by its inverse CDF, inside the engine too:
    what it records is still the model's log-prob of the token drawn, and it samples."""
    from omnigym.inference.engine import RACE_MAX_VOCABULARY

    tokenizer = load_tokenizer(tiny)
    model = family_model("llama", RACE_MAX_VOCABULARY + 1000)
    torch.manual_seed(0)
    samples = [s for g in LlamaFamilyEngine(model, tokenizer).generate(PROMPTS, 4, SamplingParams(max_new_tokens=8))
               for s in g]
    assert len({tuple(s.completion_ids) for s in samples}) > 3
    assert max(t for s in samples for t in s.completion_ids) > len(tokenizer)  # drawn from the whole vocabulary
    full = token_logprobs(model, make_batch([(s.prompt_ids, s.completion_ids) for s in samples],
                                            tokenizer.pad_token_id))
    for i, s in enumerate(samples):
        start = len(s.prompt_ids) - 1
        assert torch.allclose(full[i, start:start + len(s.completion_ids)], torch.tensor(s.logprobs), atol=1e-4)


@pytest.mark.parametrize("past_the_race", [False, True])
def test_each_draw_follows_the_distribution_it_is_given(past_the_race):
    """Both ways ``draw`` picks a token (an exponential race up to RACE_MAX_VOCABULARY tokens, the
    inverse CDF past it) hit each token as often as its probability says, never a cut one (top-k,
    top-p, or a -inf logit after the last kept token), and repeat with a generator."""
    from omnigym.inference.engine import RACE_MAX_VOCABULARY

    logits = torch.full((2000, RACE_MAX_VOCABULARY + 1 if past_the_race else 4), float("-inf"))
    logits[:, :4] = torch.tensor([0.0, 3.0, 1.0, 2.9])
    for params, kept in [(SamplingParams(), [0, 1, 2, 3]), (SamplingParams(top_k=2), [1, 3]),
                         (SamplingParams(top_p=0.95), [1, 2, 3]), (SamplingParams(temperature=2.0), [0, 1, 2, 3])]:
        processed = processed_logits(logits, params)
        torch.manual_seed(0)
        counts = sum(torch.bincount(draw(processed), minlength=logits.shape[1]) for _ in range(5))
        assert set(counts.nonzero().flatten().tolist()) == set(kept)
        expected = processed[0].softmax(-1)
        assert (counts / counts.sum() - expected).abs().max() < 0.02  # ~4 standard errors at 10,000 draws
    generator = torch.Generator().manual_seed(3)
    first = draw(processed, generator)
    assert torch.equal(first, draw(processed, torch.Generator().manual_seed(3)))
    assert not torch.equal(first, draw(processed, generator))  # the generator's stream moves on


def test_engine_choice(tiny):
    tokenizer = load_tokenizer(tiny)
    assert isinstance(make_engine(load_model(tiny), tokenizer), LlamaFamilyEngine)
    lora = load_model(tiny, LoraSettings(r=4))
    assert type(make_engine(lora, tokenizer)) is HFEngine
    with pytest.raises(OmnigymError, match="--engine kv cannot run this model: not a plain causal LM"):
        make_engine(lora, tokenizer, "kv")
    with pytest.raises(OmnigymError, match="unknown engine 'vllm2'"):
        make_engine(lora, tokenizer, "vllm2")


HEADER = [4, 11, 12, 13, 14, 15, 16, 17, 18, 19]  # a system prompt every prompt of the batch starts with
PROMPT_SETS = {
    "distinct": PROMPTS,  # their common prefix is too short to run on its own
    "shared header": [HEADER + [20, 21, 5], HEADER + [30, 31, 32, 33, 5], HEADER + [5]],  # one rest is empty
    "header only": [HEADER + [5], HEADER + [6], HEADER + [7]],  # prompts differ in their last token only
}

# the shared context's levels: the distinct prompts less their last token, or the header once
# and then each prompt's rest
CONTEXT_SHAPES = {"distinct": [(3, 8)], "shared header": [(1, 10), (3, 4)], "header only": [(1, 10)]}


@pytest.mark.parametrize("lora,prompts", [(0, "distinct"), (4, "distinct"), (0, "shared header"), (4, "shared header"),
                                          (0, "header only")])
def test_shared_prompt_logprobs_equal_full_forward(tiny, lora, prompts):
    tokenizer, model = load_tokenizer(tiny), load_model(tiny, LoraSettings(r=lora))
    torch.manual_seed(1)
    completions = [torch.randint(10, 60, (n,)).tolist() for n in (5, 1, 9, 3, 7, 2)]
    name, prompts = prompts, PROMPT_SETS[prompts]
    samples = [Sample(prompts[i % 3], c, [0.0] * len(c), True) for i, c in enumerate(completions)]

    batch = make_completion_batch([s.prompt_ids for s in samples], [s.completion_ids for s in samples],
                                  tokenizer.pad_token_id)
    shared = completion_logprobs(model, batch)
    model.zero_grad()
    (shared * batch.loss_mask).sum().backward()
    shared_grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]

    full = token_logprobs(model, make_batch([(s.prompt_ids, s.completion_ids) for s in samples],
                                            tokenizer.pad_token_id))
    picked = [full[i, len(s.prompt_ids) - 1:len(s.prompt_ids) - 1 + len(s.completion_ids)]
              for i, s in enumerate(samples)]
    model.zero_grad()
    sum(p.sum() for p in picked).backward()
    for i, p in enumerate(picked):
        assert torch.allclose(shared[i, :len(p)], p, atol=1e-5)
    for a, b in zip(shared_grads, (p.grad for p in model.parameters() if p.requires_grad)):
        assert torch.allclose(a, b, atol=1e-4)
    # the replies that read one prompt ran packed: 6 replies of 1 to 9 tokens in 3 rows, not 6 rows of 9
    assert batch.packed.input_ids.shape[0] == 3 and batch.packed.input_ids.numel() < batch.input_ids.numel()
    # the shared context runs as a tree: the header once, then each prompt's rest
    assert [tuple(level.ids.shape) for level in batch.context] == CONTEXT_SHAPES[name]


def test_packed_replies_with_an_empty_reply(tiny):
    """An empty reply packs beside a full one (into the last row, which that one fills exactly)
    and is masked out; the other's log-probs equal the unpacked pass."""
    from omnigym.models.tokens import CompletionBatch

    model = load_model(tiny)
    batch = make_completion_batch([[4, 5, 6]] * 2, [[10, 11, 12, 13], []], 0)
    assert batch.packed is not None and batch.packed.input_ids.shape[0] == 1
    plain = CompletionBatch(batch.context, batch.rows, batch.input_ids, batch.position_ids, batch.targets,
                            batch.loss_mask, batch.attention)
    packed, unpacked = completion_logprobs(model, batch), completion_logprobs(model, plain)
    assert batch.loss_mask[1].sum() == 0
    assert torch.allclose(packed[0], unpacked[0], atol=1e-5)


@pytest.mark.parametrize("shape", ["sft", "pairs"])
def test_trained_batch_loss_equals_plain_batch(tiny, shape):
    """SFT's and DPO's batch gives the plain padded batch's loss and gradient. Distinct prompts
    (SFT) are split where the sequences stop agreeing, so the header runs once; repeated
    prompts (the two replies of a preference pair) are split at the first trained token, so
    each prompt runs once too. With a trained token at position 1 nothing is shared."""
    from omnigym.models.tokens import CompletionBatch, TokenBatch, batch_logprobs, make_sequence_batch, make_trained_batch
    from omnigym.rl.losses import nll_loss

    model = load_model(tiny)
    torch.manual_seed(2)
    sequences = []
    for n_prompt, n_reply, n_turn in ((3, 6, 0), (7, 2, 4), (1, 9, 3), (5, 5, 0)):
        prompt, reply, turn = (torch.randint(10, 60, (n,)).tolist() for n in (n_prompt, n_reply, n_turn))
        # header + prompt untrained, a reply trained, then (multi-turn) a user turn untrained and a reply
        ids = HEADER + prompt + reply + turn + reply
        trained = [0] * (len(HEADER) + n_prompt) + [1] * n_reply + [0] * n_turn + [1] * n_reply
        sequences += [(ids, trained)] if shape == "sft" else [(ids, trained), (ids[:-2], trained[:-2])]

    def loss_and_grads(batch):
        model.zero_grad()
        loss = nll_loss(batch_logprobs(model, batch), batch.loss_mask)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    split = make_trained_batch(sequences, 0)
    assert isinstance(split, CompletionBatch)
    # SFT: the header once, then whole rows; pairs: the header once, each prompt's rest once, the replies
    assert [level.ids.shape[0] for level in split.context] == ([1] if shape == "sft" else [1, 4])
    # (SFT's one level is the header less its last token, which starts the rows)
    assert split.context[0].ids.shape[1] == len(HEADER) - (shape == "sft")
    (loss, grads), (want, want_grads) = loss_and_grads(split), loss_and_grads(make_sequence_batch(sequences, 0))
    assert torch.allclose(loss, want, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads, want_grads))
    whole_text = [(ids, [0] + [1] * (len(ids) - 1)) for ids, _ in sequences]  # full loss: nothing to share
    assert isinstance(make_trained_batch(whole_text, 0), TokenBatch)
