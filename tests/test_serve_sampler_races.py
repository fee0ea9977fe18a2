"""Sampling beside the training queue (serve/worker.py): a sampling thread can read a run's saved
weights while the worker thread saves that run's weights again under the same name. Nothing a
request read before the save may outlive it: not its adapter, not its prefixes' keys and values."""

from __future__ import annotations

import math
import os
import threading

import pytest
import torch

pytest.importorskip("peft")

from omnigym.inference.engine import SamplingParams  # noqa: E402
from omnigym.models.lm import build_tiny_model  # noqa: E402
from omnigym.serve.contract import AdamStep, DatumIn, SampleParams, SamplerSource  # noqa: E402
from omnigym.serve.hub import ModelHub  # noqa: E402
from omnigym.serve.multilora import Job  # noqa: E402
from omnigym.serve.sampler import read_adapter  # noqa: E402

PROMPT = [10, 20, 30, 40, 50]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0))


def step(hub, model_id):
    hub.forward_backward(model_id, [DatumIn(PROMPT, {"target_tokens": torch.tensor(PROMPT[1:] + [1])})],
                         "cross_entropy")
    hub.optim_step(model_id, AdamStep(learning_rate=5e-2))


def saved_then_overwritten(hub):
    """Run "a" saved as sampler weights "w", then trained a step more: ``read`` reads the files as
    they are; ``read_then_saved`` returns the old weights after saving the new ones over them
    (a request that read the old files, overtaken by the worker thread's save)."""
    hub.create_model("a", 4, seed=1)
    step(hub, "a")
    hub.save("a", "w", "sampler")
    folder = hub.root / "models" / "a" / "sampler" / "w"

    def read():
        tensors, meta = read_adapter(folder)
        return tensors, meta["lora_alpha"] / meta["rank"]

    old = read()
    step(hub, "a")

    def read_then_saved():
        hub.save("a", "w", "sampler")
        return old

    return read, read_then_saved


def test_a_save_landing_while_a_request_reads_the_old_weights_leaves_nothing_stale(tiny, tmp_path):
    hub = ModelHub(tiny, tmp_path / "hub")
    read, read_then_saved = saved_then_overwritten(hub)
    pool, params = hub._sampler, SampleParams(max_tokens=6, seed=3)
    before = pool.sample_from("a", "w", read_then_saved, PROMPT, 1, params, session="s")
    after = pool.sample_from("a", "w", read, PROMPT, 1, params, session="s")
    # what the new weights give, computed from their files with no cache of any kind
    engine = pool.batcher
    fresh = engine.run_alone(Job(list(PROMPT), 1, pool._settings(params), 3, engine.deltas(*read())))
    assert before.sequences[0].logprobs != fresh.logprobs[0, :fresh.step].tolist()  # the save changed them
    # before: the old adapter stayed cached under the name (and the old prefix under the new
    # weights' key), so every later request sampled the overwritten weights
    assert after.sequences[0].tokens == fresh.tokens[0, :fresh.step].tolist()
    assert after.sequences[0].logprobs == fresh.logprobs[0, :fresh.step].tolist()


def test_the_one_at_a_time_path_keeps_no_merge_of_overwritten_weights_either(tiny, tmp_path):
    hub = ModelHub(tiny, tmp_path / "hub", engine="hf")  # not batched: merged views, kept per name
    pool = hub._sampler
    assert not pool.batched
    read, read_then_saved = saved_then_overwritten(hub)
    pool.model_for("a", "w", read_then_saved)
    used = pool.model_for("a", "w", read)
    fresh = pool._merge(*read())
    probe = torch.tensor([PROMPT])
    # before: the merge of the overwritten files stayed kept under the name
    assert torch.equal(used(probe).logits, fresh(probe).logits)


class SpyLock:
    """A lock that says when a thread other than the test's own waits for it."""

    def __init__(self, other_waits: threading.Event):
        self.lock, self.other_waits, self.mine = threading.Lock(), other_waits, threading.get_ident()

    def __enter__(self):
        if threading.get_ident() != self.mine:
            self.other_waits.set()
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()


def test_a_request_for_weights_being_saved_again_under_their_name_waits_for_the_new_files(tiny, tmp_path,
                                                                                        monkeypatch):
    """save_weights_for_sampler moves the old folder aside, then the new one in: a sampling
    thread that looked between the two found no weights (404) or failed reading them (500)."""
    import omnigym.serve.hub as hub_module

    hub = ModelHub(tiny, tmp_path / "hub")
    hub.create_model("a", 4, seed=1)
    step(hub, "a")
    hub.save("a", "w", "sampler")
    moved = threading.Event()  # the sampling thread waits for the files, or has failed
    hub._files = SpyLock(moved)
    outcome: dict = {}

    def sample():
        try:
            outcome["result"] = hub.sample(SamplerSource("a", "w"), PROMPT, 1, SampleParams(max_tokens=3, seed=0))
        except Exception as exc:  # what the client would have got
            outcome["error"] = exc
        moved.set()

    real, reader = os.replace, threading.Thread(target=sample)

    def replace(src, dst):
        real(src, dst)
        if str(dst).endswith(f".old-w-{os.getpid()}") and not reader.is_alive():
            reader.start()  # the old folder is aside, the new one not yet in
            assert moved.wait(120), "the sampling thread neither waited nor failed"

    monkeypatch.setattr(hub_module.os, "replace", replace)
    hub.save("a", "w", "sampler")
    reader.join(120)
    assert "error" not in outcome, outcome.get("error")
    assert len(outcome["result"].sequences[0].tokens) == 3


class NoStore:
    def finish_future(self, *args):
        pass

    def fail_future(self, *args):
        pass


def test_sampling_that_waits_for_its_own_runs_training_holds_no_thread_another_client_needs():
    """A sampling request over a run's weights waits for that run's training jobs queued before
    it; it used to wait on one of the sampling threads, so a client that sent as many such
    requests as there are threads (an RL loop pipelining its next batch behind its step) held up
    every other client's sampling until its own training finished."""
    import asyncio

    from omnigym.serve.worker import Worker

    async def scenario() -> bool:
        worker = Worker(None, NoStore(), session_ttl_s=0, sampling_threads=2)
        step_may_end, bob_sampled = threading.Event(), threading.Event()
        try:
            worker.submit("alice-step", lambda: (step_may_end.wait(600), ("x", b""))[1], model_id="alice-run")
            for i in range(2):  # alice's samples come after her step (her run's order)
                worker.submit_sampling(f"alice-{i}", lambda: ("x", b""), after="alice-run")
            worker.submit_sampling("bob", lambda: (bob_sampled.set(), ("x", b""))[1])
            return bob_sampled.wait(60)  # before: never, both threads waited for alice's step
        finally:
            step_may_end.set()
            worker.stop()

    assert asyncio.run(scenario())


def test_a_temperature_too_small_for_float32_samples_greedily_not_token_0(tiny, tmp_path):
    """Logits divided by a temperature under ~1e-37 overflow float32: every sample was token 0
    with log-probs of -inf or NaN, silently; such temperatures now sample as temperature 0 does."""
    hub = ModelHub(tiny, tmp_path / "hub")
    greedy = hub.sample(SamplerSource(), PROMPT, 2, SampleParams(max_tokens=5, temperature=0.0))
    for temperature in (1e-40, 1e-300):
        tiny_t = hub.sample(SamplerSource(), PROMPT, 2, SampleParams(max_tokens=5, temperature=temperature, seed=0))
        assert [s.tokens for s in tiny_t.sequences] == [s.tokens for s in greedy.sequences]
        assert all(math.isfinite(x) for s in tiny_t.sequences for x in s.logprobs)


def test_a_new_runs_lora_init_never_overlaps_a_sample_drawing_from_the_process_rng(tiny, tmp_path):
    """The one-at-a-time path seeds torch's process-wide RNG and Hugging Face's generate draws
    from it, on a sampling thread; a run's LoRA init seeds and draws from the same RNG on the
    worker thread. Overlapping, each took numbers from the other's stream: a seeded run's
    initial adapter, and a seeded sample, depended on what else ran. Both now hold one lock."""
    hub = ModelHub(tiny, tmp_path / "hub", engine="hf")
    pool = hub._sampler
    seen = []
    real_add, real_sample = hub._adapters.add, pool.sample

    def add(*args, **kwargs):
        seen.append(("init", pool.global_rng.locked()))
        return real_add(*args, **kwargs)

    def sample(*args, **kwargs):
        seen.append(("sample", pool.global_rng.locked()))
        return real_sample(*args, **kwargs)

    hub._adapters.add, pool.sample = add, sample
    hub.create_model("a", 4, seed=1)
    hub.sample(SamplerSource(), PROMPT, 1, SampleParams(max_tokens=2, seed=0))
    assert seen == [("init", True), ("sample", True)]


def test_a_job_that_adds_or_removes_runs_runs_alone_and_in_its_place():
    """Jobs of different runs run side by side, but one that adds or removes runs (a session's
    end, load_state, a run not loaded yet) waits for every job before it and holds up every
    job after it: an adapter is never added or dropped under another run's pass."""
    import asyncio

    from omnigym.serve.worker import Worker

    async def scenario():  # futures wake waiters on the server's event loop
        scenario_body()

    worker = Worker(None, NoStore(), session_ttl_s=0)
    worker.loaded |= {"a", "b"}
    events, log = {k: threading.Event() for k in ("a", "b")}, []

    def job(name, wait=None):
        def run():
            log.append(f"{name} starts")
            if wait is not None:
                assert wait.wait(60)
            log.append(f"{name} ends")
            return "x", b""
        return run

    def scenario_body():
        worker.submit("a1", job("a1", events["a"]), model_id="a")
        worker.submit("b1", job("b1", events["b"]), model_id="b")
        worker.submit("alone", job("alone"), alone=True)
        worker.submit("b2", job("b2"), model_id="b")
        worker.submit("c1", job("c1"), model_id="c")  # a run not loaded: alone too

    try:
        asyncio.run(scenario())
        for _ in range(100):
            if log.count("a1 starts") and log.count("b1 starts"):
                break
            threading.Event().wait(0.05)
        assert sorted(log) == ["a1 starts", "b1 starts"]  # two runs side by side
        events["b"].set()
        threading.Event().wait(0.3)
        assert "alone starts" not in log and "b2 starts" not in log  # a1 still runs
        events["a"].set()
    finally:
        events["a"].set()
        events["b"].set()
        worker.stop()
    assert log.index("a1 ends") < log.index("alone starts") < log.index("alone ends") < log.index("b2 starts")
    assert log.index("b2 ends") < log.index("c1 starts")  # alone, and after b2 in the queue
