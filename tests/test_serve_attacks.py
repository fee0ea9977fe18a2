"""omnigym serve under a hostile or careless client: each test is a request that got through
(a 5xx the SDK retries for minutes, a failure blamed on the server, memory that only grows, a
checkpoint overwritten in silence) before the fix it names, and checks the fix's outcome."""

from __future__ import annotations

import time

import httpx
import pytest

tinker = pytest.importorskip("tinker")
pytest.importorskip("fastapi")

from serve_helpers import FakeHub, free_port, serving  # noqa: E402
from tinker import types  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402

from omnigym.serve.app import Limits, make_app  # noqa: E402
from omnigym.serve.store import Store  # noqa: E402
from omnigym.serve.wire import hub_id  # noqa: E402

BASE = "tiny-base"
KEY = "tml-alice-key"


def server(tmp_path, **limits):
    hub = FakeHub(BASE, tmp_path / "hub")
    return hub, make_app(hub, Store(tmp_path / "serve.db"), limits=Limits(poll_s=2, **limits))


def post(url, path, key=KEY, **kw):
    return httpx.post(url + path, headers={"X-API-Key": key, **kw.pop("headers", {})}, timeout=30, **kw)


def datum(tokens, targets):
    return types.Datum(model_input=types.ModelInput.from_ints(tokens),
                       loss_fn_inputs={"target_tokens": targets, "weights": [1.0] * len(targets)})


def proto_body(model_id, data, loss_fn, seq_id=80):
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=loss_fn), model_id=model_id, seq_id=seq_id)
    return forward_backward_request_to_proto(request).SerializeToString()


def test_bad_values_are_4xx_at_the_door_not_server_faults(tmp_path):
    """Each was a 500 (the SDK retries those for minutes) or a future failed later, some as the
    server's fault: JSON nested past the decoder's recursion, a seed past 64 bits, an empty stop
    string (it cut every sample to one token), top_p 0, Adam eps 0; a megabyte loss name came
    back whole in its error (and was stored with it)."""
    hub, app = server(tmp_path)
    with serving(app) as url:
        sc = tinker.ServiceClient(base_url=url, api_key=KEY)
        tc = sc.create_lora_training_client(base_model=BASE, rank=2, seed=0).result()
        session = tc.model_id.split(":")[0]
        calls = len(hub.calls)
        prompt = {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]}

        def sample(**params):
            return {"base_model": BASE, "prompt": prompt, "num_samples": 1,
                    "sampling_params": {"max_tokens": 2, **params}}

        cases = [
            ("/api/v1/create_session", {"content": b"[" * 100_000 + b"]" * 100_000}, "nested too deeply"),
            ("/api/v1/create_model", {"json": {"session_id": session, "model_seq_id": 5, "base_model": BASE,
                                               "lora_config": {"rank": 2, "seed": 10**30}}}, "seed must be in"),
            ("/api/v1/asample", {"json": sample(seed=10**30)}, "seed must be in"),
            ("/api/v1/asample", {"json": sample(stop=["", "x"])}, "empty stop string"),
            ("/api/v1/asample", {"json": sample(top_p=0.0)}, "top_p must be in"),
            ("/api/v1/optim_step", {"json": {"model_id": tc.model_id, "seq_id": 90,
                                             "adam_params": {"eps": 0.0}}}, "eps must be in"),
            # a seq_id that is not a whole number went unchecked (and so never matched a retry)
            *[("/api/v1/optim_step", {"json": {"model_id": tc.model_id, "seq_id": seq, "adam_params": {}}},
               "seq_id must be a whole number") for seq in ("abc", [1], 2**70, True)],
            # "must be in [1e-30, None]"
            ("/api/v1/optim_step", {"json": {"model_id": tc.model_id, "seq_id": 91,
                                             "adam_params": {"grad_clip_norm": -1.0}}}, "must be at least 0.0, got"),
        ]
        for path, kw, text in cases:
            r = post(url, path, **kw)
            assert r.status_code == 400 and text in r.json()["detail"], (path, r.status_code, r.text[:200])
        body = proto_body(tc.model_id, [datum([1, 2], [2, 3])], loss_fn="x" * 1_000_000)
        r = post(url, "/api/v1/forward_backward", content=body, headers={"Content-Type": "application/x-protobuf"})
        assert r.status_code == 400 and "at most 64 characters" in r.text and len(r.text) < 300, r.text[:200]
        assert len(hub.calls) == calls  # nothing reached the hub
        for query in ("limit=-1", "offset=-5", "limit=0", "limit=5000"):  # the negative cursor was echoed back
            r = httpx.get(f"{url}/api/v1/training_runs?{query}", headers={"X-API-Key": KEY}, timeout=30)
            assert r.status_code == 400 and "limit must be 1 to 1000 and offset 0 or more" in r.text, (query, r.text)
        assert len(httpx.get(f"{url}/api/v1/training_runs?limit=1", headers={"X-API-Key": KEY},
                             timeout=30).json()["training_runs"]) == 1
        # the server is up and the same client goes on
        out = tc.forward_backward([datum([1, 2], [2, 3])], "cross_entropy").result()
        assert out.metrics["loss:sum"] > 0


def test_runs_held_in_memory_are_capped_and_ended_sessions_make_room(tmp_path):
    """Before, every create_model added an adapter and Adam state for good while its session
    lived, and a run of a finished session came back into memory on its next request and never
    left (its session would not expire again): a client could fill memory."""
    hub, app = server(tmp_path, max_runs=2)
    with serving(app) as url:
        alice = tinker.ServiceClient(base_url=url, api_key=KEY)
        a1 = alice.create_lora_training_client(base_model=BASE, rank=2, seed=0).result()
        a2 = alice.create_lora_training_client(base_model=BASE, rank=2, seed=1).result()
        with pytest.raises(tinker.BadRequestError, match="--max-runs"):  # at the door: no run recorded
            alice.create_lora_training_client(base_model=BASE, rank=2, seed=2).result()
        assert sorted(hub.runs) == sorted([hub_id(a1.model_id), hub_id(a2.model_id)])
        listed = tinker.RestClient(base_url=url, api_key=KEY).list_training_runs().result().training_runs
        assert sorted(r.training_run_id for r in listed) == sorted([a1.model_id, a2.model_id])

        # bob's session ends; his run is used again after that: it is loaded again, and is the
        # first to make room when a live session needs it
        bob = tinker.ServiceClient(base_url=url, api_key="tml-bob-key-123")
        alice_session = a1.model_id.split(":")[0]
        assert post(url, f"/api/v1/sessions/{alice_session}/finish").status_code == 204
        b1 = bob.create_lora_training_client(base_model=BASE, rank=2, seed=3).result()
        bob_session = b1.model_id.split(":")[0]
        assert post(url, f"/api/v1/sessions/{bob_session}/finish", "tml-bob-key-123").status_code == 204
        # a1's session ended, but its owner may still use the run: it comes back
        a1.forward_backward([datum([1, 2], [2, 3])], "cross_entropy").result()
        assert hub_id(a1.model_id) in hub.runs
        carol = tinker.ServiceClient(base_url=url, api_key="tml-carol-key-1")
        c1 = carol.create_lora_training_client(base_model=BASE, rank=2, seed=4).result()
        c2 = carol.create_lora_training_client(base_model=BASE, rank=2, seed=5).result()
        assert sorted(hub.runs) == sorted([hub_id(c1.model_id), hub_id(c2.model_id)])
        with pytest.raises(tinker.BadRequestError, match="--max-runs"):
            carol.create_lora_training_client(base_model=BASE, rank=2, seed=6).result()
        assert len(hub.runs) == 2


def test_checkpoint_names_that_differ_only_in_case_are_refused(tmp_path):
    """``s1`` and ``S1`` are one folder on macOS's and Windows' disks: the second save would
    overwrite the first while the store lists both."""
    hub, app = server(tmp_path)
    with serving(app) as url:
        tc = tinker.ServiceClient(base_url=url, api_key=KEY).create_lora_training_client(
            base_model=BASE, rank=2, seed=0).result()
        tc.save_state("step-1").result()
        tc.save_weights_for_sampler("w").result()
        saves = [c for c in hub.calls if c[0] == "save"]
        for path, name in (("/api/v1/save_weights", "STEP-1"), ("/api/v1/save_weights_for_sampler", "W")):
            r = post(url, path, json={"model_id": tc.model_id, "path": name, "seq_id": 70})
            assert r.status_code == 400 and "only in case" in r.json()["detail"], r.text
        assert [c for c in hub.calls if c[0] == "save"] == saves
        # the same name again is still an overwrite (allowed for sampler weights) and works
        assert tc.save_weights_for_sampler("w").result().path.endswith("/sampler_weights/w")


def test_max_runs_flag_is_checked(tmp_path, capsys, monkeypatch):
    from omnigym.cli import main
    from omnigym.serve.command import check

    from omnigym.models.lm import build_tiny_model

    base = build_tiny_model(tmp_path / "base")  # a whole model folder: check() reads its weights' headers
    monkeypatch.chdir(tmp_path)
    assert main(["serve", "--base-model", str(base), "--max-runs", "0", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["omnigym: error: --max-runs 0: must be at least 1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]
    for flag, value in (("--session-ttl", "nan"), ("--session-ttl", "inf"), ("--max-request-mb", "nan")):
        assert main(["serve", "--base-model", str(base), flag, value, "--port", str(free_port())]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"omnigym: error: {flag} {value}: must be at least"), err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]
    args = check(["--base-model", str(base), "--max-runs", "3", "--port", str(free_port())])
    assert args.limits.max_runs == 3


def test_futures_never_retrieved_leave_nothing_in_memory(tmp_path):
    """The worker kept a wake-up event per future until it was retrieved: a client that never
    retrieves grew it for good. Retrieval after the fact still returns the result."""
    hub, app = server(tmp_path)
    with serving(app) as url:
        tc = tinker.ServiceClient(base_url=url, api_key=KEY).create_lora_training_client(
            base_model=BASE, rank=2, seed=0).result()
        ids = [post(url, "/api/v1/optim_step", json={"model_id": tc.model_id, "seq_id": 100 + i,
                                                      "adam_params": {"learning_rate": 0.0}}).json()["request_id"]
               for i in range(50)]
        worker = app.state.worker
        deadline = time.time() + 20
        while worker._events and time.time() < deadline:
            time.sleep(0.05)
        assert worker._events == {}
        r = post(url, "/api/v1/retrieve_future", json={"request_id": ids[-1]})
        assert r.status_code == 200 and "metrics" in r.json(), r.text


def test_a_reused_seq_id_with_another_request_is_not_answered_with_the_first_result(tmp_path):
    """Retries were recognised by (run, seq_id) alone: a different request under a seq_id
    already used (here a raw optim_step, then the SDK's own forward_backward that got the same
    number) was answered with the first request's result and never ran."""
    hub, app = server(tmp_path)
    with serving(app) as url:
        tc = tinker.ServiceClient(base_url=url, api_key=KEY).create_lora_training_client(
            base_model=BASE, rank=2, seed=0).result()
        raw = post(url, "/api/v1/optim_step", json={"model_id": tc.model_id, "seq_id": 1,
                                                    "adam_params": {"learning_rate": 0.0}}).json()
        assert post(url, "/api/v1/retrieve_future", json=raw).status_code == 200
        out = tc.forward_backward([datum([1, 2, 3], [2, 3, 4])], "cross_entropy").result()  # the SDK's seq_id 1
        assert [o["logprobs"].shape for o in out.loss_fn_outputs] == [[3]] and out.metrics["loss:sum"] > 0
        assert [c[0] for c in hub.calls].count("forward_backward") == 1
        # the same request sent again (a retry) still runs once
        again = post(url, "/api/v1/optim_step", json={"model_id": tc.model_id, "seq_id": 1,
                                                      "adam_params": {"learning_rate": 0.0}}).json()
        assert again["request_id"] == raw["request_id"]
        assert [c[0] for c in hub.calls].count("optim_step") == 1


def test_the_base_model_named_with_a_trailing_slash_is_the_same(tmp_path):
    """A path typed with tab completion ends in '/': it was refused as another model."""
    hub = FakeHub(str(tmp_path / "models" / "base"), tmp_path / "hub")
    app = make_app(hub, Store(tmp_path / "serve.db"), limits=Limits(poll_s=2))
    with serving(app) as url:
        sc = tinker.ServiceClient(base_url=url, api_key=KEY)
        for name in (f"{tmp_path}/models/base/", f"{tmp_path}//models/./base", "base", "base/"):
            assert sc.create_lora_training_client(base_model=name, rank=1).result().model_id
        for name in (f"{tmp_path}/models/other", "../base", "", "base\x00"):
            with pytest.raises(tinker.BadRequestError, match="serves one base model"):
                sc.create_lora_training_client(base_model=name, rank=1).result()
