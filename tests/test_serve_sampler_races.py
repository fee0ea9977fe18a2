"""Sampling beside the training queue (serve/worker.py): a sampling thread can read a run's saved
weights while the worker thread saves that run's weights again under the same name. Nothing a
request read before the save may outlive it: not its adapter, not its prefixes' keys and values."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft")

from omnigym.inference.engine import SamplingParams  # noqa: E402
from omnigym.models.lm import build_tiny_model  # noqa: E402
from omnigym.serve.contract import AdamStep, DatumIn, SampleParams  # noqa: E402
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


def test_a_save_landing_while_a_request_reads_the_old_weights_leaves_nothing_stale(tiny, tmp_path):
    hub = ModelHub(tiny, tmp_path / "hub")
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
        # the request has read the old files; the worker thread's save lands before it samples
        hub.save("a", "w", "sampler")
        return old

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

    pool.model_for("a", "w", read_then_saved)
    used = pool.model_for("a", "w", read)
    fresh = pool._merge(*read())
    probe = torch.tensor([PROMPT])
    # before: the merge of the overwritten files stayed kept under the name
    assert torch.equal(used(probe).logits, fresh(probe).logits)
