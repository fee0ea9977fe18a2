"""omnigym serve shares the hardware: sampling requests of several clients and adapters decoded
in one batch (each equal to itself run alone, none seeing another's), a prefix cache per
sampling session, and sampling that does not wait behind another run's training."""

from __future__ import annotations

import threading

import pytest
import torch

pytest.importorskip("peft")

from omnigym.inference.engine import SamplingParams  # noqa: E402
from omnigym.models.lm import build_tiny_model  # noqa: E402
from omnigym.serve.contract import DatumIn, SampleParams, SamplerSource  # noqa: E402
from omnigym.serve.hub import ModelHub  # noqa: E402
from omnigym.serve.multilora import Job, PrefixCache  # noqa: E402
from omnigym.serve.sampler import read_adapter  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0))


def trained(hub, model_id, seed, tokens, steps=3, name="w"):
    from omnigym.serve.contract import AdamStep

    hub.create_model(model_id, 4, seed=seed)
    for _ in range(steps):
        hub.forward_backward(model_id, [DatumIn(tokens, {"target_tokens": torch.tensor(tokens[1:] + [tokens[0]])})],
                             "cross_entropy")
        hub.optim_step(model_id, AdamStep(learning_rate=5e-2))
    hub.save(model_id, name, "sampler")


def deltas(hub, model_id, name="w"):
    pool = hub._sampler
    return pool._deltas(model_id, name, lambda: (lambda t, m: (t, m["lora_alpha"] / m["rank"]))(
        *read_adapter(hub.root / "models" / model_id / "sampler" / name)))


def jobs(hub):
    """Four requests that differ in everything: adapter (two runs and the base), seed, n,
    temperature, top-k, top-p, greedy, length and prompt."""
    a, b = deltas(hub, "a"), deltas(hub, "b")
    return [Job([10, 20, 30, 40], 2, SamplingParams(max_new_tokens=12), 1, a),
            Job([5, 6], 3, SamplingParams(max_new_tokens=7, temperature=0.7, top_k=20), 2, b),
            Job([11, 12, 13, 14, 15, 16], 1, SamplingParams(max_new_tokens=9, greedy=True), 3, None),
            Job([7, 8, 9], 2, SamplingParams(max_new_tokens=10, top_p=0.9), 4, a)]


def test_a_batch_across_adapters_equals_each_request_alone(tiny, tmp_path):
    hub = ModelHub(tiny, tmp_path / "hub")
    trained(hub, "a", 1, [10, 20, 30, 40, 50])
    trained(hub, "b", 2, [5, 6, 7, 8])
    engine = hub._sampler.batcher
    alone = [engine.run_alone(job) for job in jobs(hub)]
    together = jobs(hub)
    for job in together:
        engine.prefill(job)
    steps = 0
    while any(not job.over for job in together):
        engine.decode([job for job in together if not job.over])
        steps += 1
    assert engine.largest_batch == 8  # all four requests' rows in one forward
    for one, both in zip(alone, together):
        assert one.step == both.step
        # bit for bit: no row of a request depends on another request's rows
        assert torch.equal(one.tokens, both.tokens), (one.tokens, both.tokens)
        assert torch.equal(one.logprobs, both.logprobs)
    # the adapters differ, so the requests really took different weights
    same_prompt = [Job([10, 20, 30, 40], 2, SamplingParams(max_new_tokens=12), 1, lora)
                   for lora in (deltas(hub, "a"), deltas(hub, "b"), None)]
    outs = [engine.run_alone(job).logprobs for job in same_prompt]
    assert not torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])


def test_requests_from_many_threads_join_one_batch_and_get_their_own_results(tiny, tmp_path):
    hub = ModelHub(tiny, tmp_path / "hub")
    trained(hub, "a", 1, [10, 20, 30, 40, 50])
    trained(hub, "b", 2, [5, 6, 7, 8])
    asks = [(SamplerSource("a", "w"), [10, 20, 30], 2, SampleParams(max_tokens=10, seed=1, prompt_logprobs=True)),
            (SamplerSource("b", "w"), [10, 20, 30], 2, SampleParams(max_tokens=10, seed=1)),
            (SamplerSource(), [4, 5, 6, 7], 1, SampleParams(max_tokens=8, temperature=0.0)),
            (SamplerSource("a", "w"), [9], 3, SampleParams(max_tokens=6, seed=7, top_k=5))]
    alone = [hub.sample(*ask) for ask in asks]
    pool = hub._sampler
    pool.stop()  # the decoding thread starts again once every request waits in its inbox
    start, pool._start = pool._start, lambda: None
    pool.batcher.largest_batch = 0
    results: dict = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, hub.sample(*asks[i])))
               for i in range(len(asks))]
    for t in threads:
        t.start()
    while pool._inbox.qsize() < len(asks):
        threading.Event().wait(0.01)
    pool._start = start
    pool._start()
    for t in threads:
        t.join(timeout=120)
    assert pool.batcher.largest_batch == 8
    for i, one in enumerate(alone):
        got = results[i]
        assert [s.tokens for s in got.sequences] == [s.tokens for s in one.sequences], i
        assert [s.logprobs for s in got.sequences] == [s.logprobs for s in one.sequences], i
        assert [s.stop_reason for s in got.sequences] == [s.stop_reason for s in one.sequences]
        assert got.prompt_logprobs == one.prompt_logprobs
    assert results[0].prompt_logprobs is not None and results[0].prompt_logprobs[0] is None


def conversation(hub, session, turns=3):
    """A multi-turn conversation: each turn's prompt is the last prompt, its completion and a
    new user message."""
    prompt, out, prefilled = [10, 20, 30, 40, 50], [], []
    for turn in range(turns):
        before = hub._sampler.batcher.prefilled_tokens
        result = hub.sample(SamplerSource("a", "w", session), prompt, 1, SampleParams(max_tokens=8, seed=turn))
        prefilled.append(hub._sampler.batcher.prefilled_tokens - before)
        seq = result.sequences[0]
        out.append((list(prompt), seq.tokens, seq.logprobs))
        prompt = prompt + seq.tokens + [60 + turn, 61, 62]
    return out, prefilled


def test_prefix_cache_prefills_only_new_tokens_and_changes_no_sample(tiny, tmp_path):
    cached = ModelHub(tiny, tmp_path / "c")
    plain = ModelHub(tiny, tmp_path / "p", prefix_cache_bytes=0)  # every entry is over the bound: none kept
    for hub in (cached, plain):
        trained(hub, "a", 1, [10, 20, 30, 40, 50])
    with_cache, counts = conversation(cached, "s1")
    without, full = conversation(plain, "s1")
    assert full == [len(prompt) for prompt, _, _ in without]
    # the second and third turns prefill the new user tokens and the last sampled token (the only
    # one whose keys were never computed): nothing the session prefilled or decoded before
    assert counts[0] == 5 and counts[1:] == [4, 4], counts
    for (p1, t1, l1), (p2, t2, l2) in zip(with_cache, without):
        assert p1 == p2 and t1 == t2
        # float rounding only: the cached turn's attention runs over fewer query rows than the whole
        # prompt's (largest difference 8.5e-5 on an Intel Xeon with AVX-512, under 1e-5 on an AMD Zen 3)
        torch.testing.assert_close(torch.tensor(l1), torch.tensor(l2), atol=2e-4, rtol=1e-4)
    # another session does not read this one's entries
    _, other = conversation(cached, "s2", turns=1)
    assert other == [5]
    # new weights under the same name: the old prefixes are gone, the whole prompt is prefilled
    prompt = with_cache[1][0]
    before = cached._sampler.batcher.prefilled_tokens
    cached.forward_backward("a", [DatumIn([1, 2, 3], {"target_tokens": torch.tensor([2, 3, 4])})], "cross_entropy")
    from omnigym.serve.contract import AdamStep
    cached.optim_step("a", AdamStep(learning_rate=5e-2))
    cached.save("a", "w", "sampler")
    cached.sample(SamplerSource("a", "w", "s1"), prompt, 1, SampleParams(max_tokens=4, seed=0))
    assert cached._sampler.batcher.prefilled_tokens - before == len(prompt)


def test_prefix_cache_is_bounded_in_bytes_least_recently_used_out():
    cache = PrefixCache(max_bytes=3 * 2 * 4 * 10)  # three entries of 10 floats of keys and 10 of values
    entry = ([torch.zeros(1, 10)], [torch.zeros(1, 10)])
    for i in range(3):
        cache.put(("s", None, "", 0), [i, 1, 2], *entry)
    assert len(cache) == 3 and cache.bytes == 240
    assert cache.longest(("s", None, "", 0), [0, 1, 2, 3])[0] == 3  # entry 0 now the most recent
    cache.put(("s", None, "", 0), [9, 9], *entry)
    assert len(cache) == 3 and cache.bytes <= cache.max_bytes
    assert cache.longest(("s", None, "", 0), [1, 1, 2, 3])[0] == 0  # entry 1, least recently used, left
    assert cache.longest(("s", None, "", 0), [0, 1, 2, 3])[0] == 3
    assert cache.longest(("other", None, "", 0), [0, 1, 2, 3])[0] == 0


@pytest.mark.parametrize("width", [64, 128, 512])
def test_a_product_of_few_rows_rounds_as_in_a_large_batch(width):
    """The padding to each weight's measured threshold: a product of 1-8 rows equals, bit for bit,
    those rows in a batch of 40 (unpadded, on an Intel Xeon with AVX-512, rows under 16 differ at
    width 512; on an AMD Zen 3 rows under 4 did at the tiny model's widths)."""
    import torch.nn.functional as F

    from omnigym.serve.multilora import MultiLoRAEngine

    generator = torch.Generator().manual_seed(width)
    weight, x = torch.randn(96, width, generator=generator), torch.randn(40, width, generator=generator)
    batch = F.linear(x, weight)
    for rows in range(1, 9):
        assert torch.equal(MultiLoRAEngine._product(x[:rows], weight), batch[:rows]), rows
