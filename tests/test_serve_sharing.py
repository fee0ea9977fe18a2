"""One run's training does not hold up another client's sampling: sampling requests run beside
the training queue (serve/worker.py), while each run's own requests still run in order."""

from __future__ import annotations

import threading

import pytest

tinker = pytest.importorskip("tinker")
pytest.importorskip("fastapi")

from serve_helpers import FakeHub, serving  # noqa: E402
from tinker import types  # noqa: E402

from omnigym.serve.app import Limits, make_app  # noqa: E402
from omnigym.serve.store import Store  # noqa: E402

BASE = "tiny-base"


class HeldHub(FakeHub):
    """A hub whose forward_backward waits until the test lets it finish (a long step)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.started, self.release = threading.Event(), threading.Event()

    def forward_backward(self, *args, **kwargs):
        self.started.set()
        assert self.release.wait(120), "the test never let the step finish"
        return super().forward_backward(*args, **kwargs)


def test_sampling_is_not_queued_behind_another_runs_long_step(tmp_path):
    hub = HeldHub(BASE, tmp_path / "hub")
    app = make_app(hub, Store(tmp_path / "serve.db"), limits=Limits(poll_s=2))
    with serving(app) as url:
        alice = tinker.ServiceClient(base_url=url, api_key="tml-alice-key")
        bob = tinker.ServiceClient(base_url=url, api_key="tml-bob-key-123")
        tc = alice.create_lora_training_client(base_model=BASE, rank=2, seed=0).result()
        datum = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]),
                            loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 1.0, 1.0]})
        step = tc.forward_backward([datum], "cross_entropy")
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
