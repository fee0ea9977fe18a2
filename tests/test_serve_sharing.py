"""One run's training does not hold up another client's sampling: sampling requests run beside
the training queue (serve/worker.py), while each run's own requests still run in order."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch

tinker = pytest.importorskip("tinker")
pytest.importorskip("fastapi")

from serve_helpers import FakeHub, serving  # noqa: E402
from tinker import types  # noqa: E402

from omnigym.serve.app import Limits, make_app  # noqa: E402
from omnigym.serve.store import Store  # noqa: E402
from omnigym.serve.wire import hub_id  # noqa: E402

BASE = "tiny-base"


class HeldHub(FakeHub):
    """A hub whose forward_backward waits until the test lets it finish (a long step); with
    ``hold`` given, only that run's does."""

    def __init__(self, *args, hold=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.started, self.release, self.hold = threading.Event(), threading.Event(), hold

    def forward_backward(self, model_id, *args, **kwargs):
        if self.hold is None or model_id == self.hold:
            self.started.set()
            assert self.release.wait(120), "the test never let the step finish"
        return super().forward_backward(model_id, *args, **kwargs)


DATUM = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]),
                    loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 1.0, 1.0]})


@contextlib.contextmanager
def alice_and_bob(tmp_path):
    """A server over a ``HeldHub``, and two users' service clients."""
    hub = HeldHub(BASE, tmp_path / "hub")
    with serving(make_app(hub, Store(tmp_path / "serve.db"), limits=Limits(poll_s=2))) as url:
        yield (hub, tinker.ServiceClient(base_url=url, api_key="tml-alice-key"),
               tinker.ServiceClient(base_url=url, api_key="tml-bob-key-123"))


def test_sampling_is_not_queued_behind_another_runs_long_step(tmp_path):
    with alice_and_bob(tmp_path) as (hub, alice, bob):
        tc = alice.create_lora_training_client(base_model=BASE, rank=2, seed=0).result()
        step = tc.forward_backward([DATUM], "cross_entropy")
        assert hub.started.wait(60)
        try:
            sampler = bob.create_sampling_client(base_model=BASE).result()
            # before: this waited in the one queue behind alice's step, which never ends here
            result = sampler.sample(types.ModelInput.from_ints([1, 2]), 2,
                                    types.SamplingParams(max_tokens=3, seed=0)).result(timeout=60)
            assert len(result.sequences) == 2 and not hub.release.is_set()
            assert "forward_backward" not in [c[0] for c in hub.calls]  # alice's step is still held
        finally:
            hub.release.set()
        assert step.result(timeout=60).metrics["loss:sum"] > 0
        # a run's own sampling still comes after its queued save: the SDK's usual loop
        saved = tc.save_weights_and_get_sampling_client().result(timeout=60)
        again = saved.sample(types.ModelInput.from_ints([1, 2]), 1,
                             types.SamplingParams(max_tokens=3, seed=0)).result(timeout=60)
        assert len(again.sequences) == 1


def test_a_runs_jobs_run_beside_another_runs_long_forward_backward(tmp_path):
    """Each run's jobs touch only its own adapter and model over the shared weights: they run
    beside another run's forward_backward. Before, every client's job waited behind every
    forward_backward queued before it, so the clients' loops moved in step and sampling and
    training took turns instead of overlapping. A run's own jobs still run in its order."""
    with alice_and_bob(tmp_path) as (hub, alice, bob):
        alice_tc = alice.create_lora_training_client(base_model=BASE, rank=2, seed=0).result()
        bob_tc = bob.create_lora_training_client(base_model=BASE, rank=2, seed=1).result()
        hub.hold = hub_id(alice_tc.model_id)
        alice_step = alice_tc.forward_backward([DATUM], "cross_entropy")
        assert hub.started.wait(60)
        try:
            # bob's whole loop, queued after alice's held forward_backward, finishes before it
            saved = bob_tc.save_weights_and_get_sampling_client().result(timeout=60)
            assert saved.sample(types.ModelInput.from_ints([1, 2]), 1,
                                types.SamplingParams(max_tokens=3, seed=0)).result(timeout=60).sequences
            assert bob_tc.forward_backward([DATUM], "cross_entropy").result(timeout=60).metrics["loss:sum"] > 0
            bob_tc.optim_step(types.AdamParams(learning_rate=0.1)).result(timeout=60)
            # alice's own step waits for her forward_backward
            alice_adam = alice_tc.optim_step(types.AdamParams(learning_rate=0.1))
            with pytest.raises(TimeoutError):
                alice_adam.result(timeout=1)
            assert not hub.release.is_set()
        finally:
            hub.release.set()
        assert alice_step.result(timeout=60).metrics["loss:sum"] > 0
        alice_adam.result(timeout=60)
    order = [(c[0], c[1]) for c in hub.calls if c[0] in ("forward_backward", "optim_step")]
    alice_id, bob_id = (hub_id(tc.model_id) for tc in (alice_tc, bob_tc))
    assert order.index(("forward_backward", bob_id)) < order.index(("forward_backward", alice_id))
    assert order.index(("forward_backward", alice_id)) < order.index(("optim_step", alice_id))


def test_runs_trained_together_on_the_real_hub_end_as_each_trained_alone(tmp_path):
    """Two clients' RL loops (save, sample, forward_backward, optim_step) on one server of the
    real hub, their jobs side by side on the training threads: each run's weights end
    bit-identical to the same loop run alone, and the two runs differ."""
    from omnigym.models.lm import build_tiny_model
    from omnigym.serve.hub import ModelHub

    base = str(build_tiny_model(tmp_path / "tiny", seed=0))

    def loop(url, key, seed, prompt, out):
        tc = tinker.ServiceClient(base_url=url, api_key=key).create_lora_training_client(
            base_model=base, rank=4, seed=seed).result()
        for step in range(3):
            sampler = tc.save_weights_and_get_sampling_client().result()
            result = sampler.sample(types.ModelInput.from_ints(prompt), 2,
                                    types.SamplingParams(max_tokens=6, seed=step)).result()
            data = []
            for seq in result.sequences:
                tokens = prompt + list(seq.tokens)
                data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                                        loss_fn_inputs={"target_tokens": tokens[1:],
                                                        "weights": [1.0] * (len(tokens) - 1)}))
            fb = tc.forward_backward(data, "cross_entropy")
            tc.optim_step(types.AdamParams(learning_rate=0.05)).result()
            fb.result()
        out[key] = tc.model_id

    clients = (("tml-alice-key", 1, [5, 6, 7]), ("tml-bob-key-123", 2, [8, 9]))

    def weights(hub, model_id):
        return hub._runs[hub_id(model_id)].backend.state_dict()["model"]

    alone = {}
    for key, seed, prompt in clients:
        hub = ModelHub(base, tmp_path / f"hub-{key}")
        with serving(make_app(hub, Store(tmp_path / f"{key}.db"), limits=Limits(poll_s=2))) as url:
            ids: dict = {}
            loop(url, key, seed, prompt, ids)
            alone[key] = weights(hub, ids[key])
    hub = ModelHub(base, tmp_path / "hub-together")
    with serving(make_app(hub, Store(tmp_path / "together.db"), limits=Limits(poll_s=2))) as url:
        ids = {}
        threads = [threading.Thread(target=loop, args=(url, *c, ids)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert sorted(ids) == sorted(alone), "a client failed (see the captured output)"
        for key in alone:
            together = weights(hub, ids[key])
            assert all(torch.equal(together[name], alone[key][name]) for name in together), key
    a, b = (alone[key] for key, _, _ in clients)
    assert any(not torch.equal(a[name], b[name]) for name in a)
