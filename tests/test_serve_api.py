"""omnigym serve's HTTP layer against the official tinker SDK client: sessions, runs, training,
sampling, futures, a restart, isolation between callers, and each bad input one clear error.

The hub here is tests/serve_helpers.FakeHub (it keeps serve/contract.py's promises); the last
test runs the same calls against the real hub (serve/hub.py) on a tiny model."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

tinker = pytest.importorskip("tinker")
pytest.importorskip("fastapi")

from serve_helpers import FakeHub, free_port, serving  # noqa: E402
from tinker import types  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402

from omnigym.serve.app import Limits, make_app  # noqa: E402
from omnigym.serve.store import LOST, Store  # noqa: E402
from omnigym.serve.wire import hub_id  # noqa: E402

BASE = "tiny-base"


def datum(tokens, targets, weights=None):
    return types.Datum(model_input=types.ModelInput.from_ints(tokens),
                       loss_fn_inputs={"target_tokens": targets, "weights": weights or [1.0] * len(targets)})


def server(tmp_path, **limits):
    hub = FakeHub(BASE, tmp_path / "hub")
    app = make_app(hub, Store(tmp_path / "serve.db"), limits=Limits(poll_s=2, **limits))
    return hub, app


def client(url, key="tml-alice-key"):
    return tinker.ServiceClient(base_url=url, api_key=key)


def proto_body(model_id, data, loss_fn="cross_entropy", seq_id=1):
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=loss_fn),
        model_id=model_id, seq_id=seq_id)
    return forward_backward_request_to_proto(request).SerializeToString()


def post(url, path, key="tml-alice-key", **kw):
    return httpx.post(url + path, headers={"X-API-Key": key, **kw.pop("headers", {})}, timeout=30, **kw)


def test_sdk_trains_samples_and_lists(tmp_path):
    hub, app = server(tmp_path)
    with serving(app) as url:
        sc = client(url)
        caps = tinker.RestClient(base_url=url, api_key="tml-alice-key").get_server_capabilities().result()
        assert caps.supported_models[0].model_name == BASE
        tc = sc.create_lora_training_client(base_model=BASE, rank=4, seed=3).result()
        assert ("create_model", hub_id(tc.model_id), 4, 3) in hub.calls
        info = tc.get_info()
        assert info.lora_rank == 4 and info.model_data.tokenizer_id == BASE
        data = [datum([1, 2, 3], [2, 3, 4]), datum([5, 6], [6, 7], [0.0, 1.0])]
        losses = []
        for _ in range(4):
            fb = tc.forward_backward(data, "cross_entropy")
            opt = tc.optim_step(types.AdamParams(learning_rate=0.2))
            out = fb.result()
            losses.append(out.metrics["loss:sum"])
            assert "grad_norm" in opt.result().metrics
        # per-datum outputs, one log-prob per input position, equal to the hub's own values
        assert [o["logprobs"].shape for o in out.loss_fn_outputs] == [[3], [2]]
        logits = hub.runs[hub_id(tc.model_id)]["logits"].detach()
        # (the hub took one more optimizer step after this forward pass: compare before it)
        assert losses[-1] < losses[0] - 0.5, losses
        fwd = tc.forward(data, "cross_entropy").result()
        want = torch.log_softmax(logits, -1)[torch.tensor([2, 3, 4])]
        assert torch.allclose(torch.tensor(fwd.loss_fn_outputs[0]["logprobs"].tolist()), want, atol=1e-6)

        saved = tc.save_state("step4").result()
        assert saved.path == f"tinker://{tc.model_id}/weights/step4"
        sampler = tc.save_weights_and_get_sampling_client().result()
        res = sampler.sample(types.ModelInput.from_ints([1, 2]), 3,
                             types.SamplingParams(max_tokens=5, seed=1), include_prompt_logprobs=True).result()
        assert len(res.sequences) == 3 and all(len(s.tokens) == 5 == len(s.logprobs) for s in res.sequences)
        assert res.prompt_logprobs[0] is None and isinstance(res.prompt_logprobs[1], float)
        assert hub.calls[-1][0] == "sample" and hub.calls[-1][1] == hub_id(tc.model_id)
        # the learned unigram shows in the samples: token 3/4/6/7 targets were pushed up
        drawn = [t for s in res.sequences for t in s.tokens]
        assert sum(t in (2, 3, 4, 7) for t in drawn) > len(drawn) / 2

        scored = sampler.compute_logprobs(types.ModelInput.from_ints([1, 2, 3, 4]), prompt_logprobs_last_n=2).result()
        assert scored[:2] == [None, None] and all(isinstance(v, float) for v in scored[2:])

        named = tc.save_weights_for_sampler("final").result().path
        base_sampler = sc.create_sampling_client(base_model=BASE).result()
        assert len(base_sampler.sample(types.ModelInput.from_ints([1]), 1,
                                       types.SamplingParams(max_tokens=2)).result().sequences) == 1
        from_path = sc.create_sampling_client(model_path=named).result()
        again = from_path.sample(types.ModelInput.from_ints([1, 2]), 3, types.SamplingParams(max_tokens=5, seed=1)).result()
        assert [list(s.tokens) for s in again.sequences] == [list(s.tokens) for s in res.sequences]

        resumed = sc.create_training_client_from_state_with_optimizer(saved.path).result()
        assert hub.calls[-1] == ("load", hub_id(resumed.model_id), hub_id(tc.model_id), "step4", True)
        assert torch.equal(hub.runs[hub_id(resumed.model_id)]["logits"], hub.runs[hub_id(tc.model_id)]["logits"])

        rest = tinker.RestClient(base_url=url, api_key="tml-alice-key")
        runs = rest.list_training_runs().result().training_runs
        assert {r.training_run_id for r in runs} == {tc.model_id, resumed.model_id}
        marks = {c.tinker_path for c in rest.list_checkpoints(tc.model_id).result().checkpoints}
        assert saved.path in marks and named in marks


def test_restart_serves_the_same_runs_and_futures(tmp_path):
    port = free_port()
    hub, app = server(tmp_path)
    with serving(app, port, close_clients=False) as url:  # the client lives on across the restart
        sc = client(url)
        tc = sc.create_lora_training_client(base_model=BASE, rank=2, seed=0).result()
        tc.forward_backward([datum([1, 2], [3, 4])], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=0.5)).result()
        path = tc.save_state("s1").result().path
        trained = hub.runs[hub_id(tc.model_id)]["logits"].detach().clone()
        fb = post(url, "/api/v1/forward_backward", content=proto_body(tc.model_id, [datum([1], [2])], seq_id=99),
                  headers={"Content-Type": "application/x-protobuf"}).json()["request_id"]
        finished = post(url, "/api/v1/retrieve_future", json={"request_id": fb}).content
    store = Store(tmp_path / "serve.db")
    store.add_future("f-was-pending", store.model(tc.model_id)["owner"], tc.model_id, None)
    store.close()

    hub2 = FakeHub(BASE, tmp_path / "hub")  # a fresh process: nothing in memory
    app2 = make_app(hub2, Store(tmp_path / "serve.db"), limits=Limits(poll_s=2))
    with serving(app2, port) as url:
        # the same client, same session, goes on: its run comes back with its saved state
        out = tc.forward_backward([datum([1, 2], [3, 4])], "cross_entropy").result()
        hid = hub_id(tc.model_id)
        assert hub2.calls[:2] == [("create_model", hid, 2, 0), ("load", hid, hid, "s1", True)]
        assert torch.equal(hub2.runs[hub_id(tc.model_id)]["logits"].detach(), trained)
        assert out.metrics["loss:sum"] > 0
        assert post(url, "/api/v1/retrieve_future", json={"request_id": fb}).content == finished
        lost = post(url, "/api/v1/retrieve_future", json={"request_id": "f-was-pending"}).json()
        assert lost == {"error": LOST, "category": "server"}
        marks = tinker.RestClient(base_url=url, api_key="tml-alice-key").list_checkpoints(tc.model_id).result()
        assert [c.tinker_path for c in marks.checkpoints] == [path]
        sc.create_sampling_client(model_path=tc.save_weights_for_sampler("after").result().path).result()
        sc.close("success").result(timeout=10)


def test_two_callers_are_isolated(tmp_path):
    hub, app = server(tmp_path)
    with serving(app) as url:
        alice = client(url, "tml-alice-key")
        tc = alice.create_lora_training_client(base_model=BASE, rank=2, seed=0).result()
        path = tc.save_state("mine").result().path
        sampler_path = tc.save_weights_for_sampler("mine").result().path
        fut = post(url, "/api/v1/optim_step", json={"model_id": tc.model_id, "seq_id": 50,
                                                    "adam_params": {"learning_rate": 0.1}}).json()["request_id"]
        # alice's step runs on the server's worker: on a loaded machine it was still in flight
        # here and landed among bob's calls; bob's are counted from after it has finished
        assert finished(url, fut).status_code == 200
        before = list(hub.calls)
        bob = client(url, "tml-bob-key-123")
        with pytest.raises(tinker.NotFoundError, match="no checkpoint|unknown model"):
            bob.create_training_client_from_state(path).result()
        with pytest.raises(tinker.NotFoundError):
            bob.create_sampling_client(model_path=sampler_path).result()
        for path_, body in (("/api/v1/forward_backward", None), ("/api/v1/optim_step", {"model_id": tc.model_id, "adam_params": {}}),
                            ("/api/v1/get_info", {"model_id": tc.model_id}),
                            ("/api/v1/retrieve_future", {"request_id": fut})):
            if body is None:
                r = post(url, path_, "tml-bob-key-123", content=proto_body(tc.model_id, [datum([1], [2])]),
                         headers={"Content-Type": "application/x-protobuf"})
            else:
                r = post(url, path_, "tml-bob-key-123", json=body)
            assert r.status_code == 404, (path_, r.text)
        r = httpx.get(f"{url}/api/v1/training_runs/{tc.model_id}/checkpoints", headers={"X-API-Key": "tml-bob-key-123"})
        assert r.status_code == 404
        assert tinker.RestClient(base_url=url, api_key="tml-bob-key-123").list_training_runs().result().training_runs == []
        assert [c for c in hub.calls[len(before):] if c[0] != "create_model"] == []  # bob touched nothing
        # and the owner still can
        assert finished(url, fut).status_code == 200


def finished(url, request_id, key="tml-alice-key", patience_s=120.0):
    """``retrieve_future`` asked again while it answers 408 ("not done yet, ask again", the
    SDK's own rule): how long a job takes on a loaded machine is not what a test is about."""
    deadline = time.monotonic() + patience_s
    while True:
        answer = post(url, "/api/v1/retrieve_future", key, json={"request_id": request_id})
        if answer.status_code != 408 or time.monotonic() > deadline:
            return answer


def test_api_key_required_when_set(tmp_path):
    hub = FakeHub(BASE, tmp_path / "hub")
    app = make_app(hub, Store(tmp_path / "serve.db"), api_key="tml-the-secret-key", limits=Limits(poll_s=1))
    with serving(app) as url:
        r = post(url, "/api/v1/create_session", "tml-wrong-key-000", json={})
        assert r.status_code == 401 and "API key" in r.json()["detail"]
        assert httpx.get(url + "/api/v1/healthz").json() == {"status": "ok"}
        sc = client(url, "tml-the-secret-key")
        assert sc.create_lora_training_client(base_model=BASE, rank=1).result().model_id


def test_bad_input_one_clear_error_and_nothing_changes(tmp_path):
    hub, app = server(tmp_path, max_data=4, max_request_bytes=200_000)
    with serving(app) as url:
        sc = client(url)
        tc = sc.create_lora_training_client(base_model=BASE, rank=2, seed=0).result()
        mid = tc.model_id
        start = hub.runs[hub_id(mid)]["logits"].detach().clone()
        n_calls = len(hub.calls)

        def fb(data, **kw):
            return post(url, "/api/v1/forward_backward", content=proto_body(mid, data, **kw),
                        headers={"Content-Type": "application/x-protobuf"})
        cases = [
            (fb([datum([1, 99], [2, 3])]), 400, "token 99 is out of the vocabulary"),
            (fb([datum([1, 2], [2, 300])]), 400, "target_tokens: token 300 is out of the vocabulary"),
            (fb([datum([1, 2, 3], [2, 3])]), 400, "has 2 rows for 3 input tokens"),
            (fb([datum([1], [2])] * 5), 413, "5 data in one request, the limit is 4"),
            (fb([datum(list(range(1, 30)) * 3, list(range(1, 30)) * 3)]), 413, "the longest sequence is 64"),
            (post(url, "/api/v1/forward_backward", content=b"\xff\x00garbage",
                  headers={"Content-Type": "application/x-protobuf"}), 400, "not a tinker ForwardBackwardRequest"),
            (post(url, "/api/v1/optim_step", content=b"{not json", headers={"Content-Type": "application/json"}),
             400, "not JSON"),
            (post(url, "/api/v1/optim_step", json={"model_id": mid, "adam_params": {"learning_rate": "fast"}}),
             400, "learning_rate must be float"),
            (post(url, "/api/v1/optim_step", json={"model_id": "nobody:train:0", "adam_params": {}}),
             404, "unknown model id"),
            (post(url, "/api/v1/save_weights", json={"model_id": mid, "path": "../../etc"}), 400, "bad checkpoint name"),
            (post(url, "/api/v1/load_weights", json={"model_id": mid, "path": f"tinker://{mid}/weights/../x",
                                                      "optimizer": False}), 400, "bad path"),
            (post(url, "/api/v1/load_weights", json={"model_id": mid, "path": "/etc/passwd", "optimizer": False}),
             400, "bad path"),
            (post(url, "/api/v1/create_model", json={"session_id": "x", "model_seq_id": 0, "base_model": BASE}),
             404, "unknown session"),
            (post(url, "/api/v1/asample", json={"base_model": "Qwen/Qwen3-8B", "prompt": {"chunks": []},
                                                "sampling_params": {}}), 400, "serves one base model"),
            (post(url, "/api/v1/asample", json={"base_model": BASE, "num_samples": 1000,
                                                "prompt": {"chunks": [{"tokens": [1]}]}, "sampling_params": {}}),
             400, "num_samples must be in [1, 64]"),
            (post(url, "/api/v1/optim_step", content=b"x" * 300_000), 413, "over 200000 bytes"),
            (post(url, "/api/v1/copy_weights", json={}), 404, "not supported by omnigym serve"),
        ]
        for response, status, text in cases:
            assert response.status_code == status, (text, response.text)
            assert text in response.json()["detail"], (text, response.text)
        assert len(hub.calls) == n_calls and torch.equal(hub.runs[hub_id(mid)]["logits"].detach(), start)

        # through the SDK: the same errors, as the SDK's own exceptions with the server's words
        with pytest.raises(tinker.BadRequestError, match="out of the vocabulary"):
            tc.forward_backward([datum([1, 77], [2, 3])], "cross_entropy").result()
        tc = sc.create_lora_training_client(base_model=BASE, rank=2, seed=0).result()  # the last one is poisoned
        with pytest.raises(tinker.RequestFailedError, match="unknown loss 'dro'"):
            tc.forward_backward([datum([1], [2])], "dro").result()
        with pytest.raises(tinker.BadRequestError, match="serves one base model"):
            sc.create_lora_training_client(base_model="meta-llama/Llama-3.1-8B", rank=2).result()
        # the server is still up and answers the next good request
        tc = sc.create_lora_training_client(base_model=BASE, rank=2, seed=0).result()
        assert tc.forward_backward([datum([1], [2])], "cross_entropy").result().metrics["loss:sum"] > 0


def test_retry_with_same_seq_id_runs_once(tmp_path):
    hub, app = server(tmp_path)
    with serving(app) as url:
        tc = client(url).create_lora_training_client(base_model=BASE, rank=2).result()
        body = {"model_id": tc.model_id, "seq_id": 7, "adam_params": {"learning_rate": 0.1}}
        first, second = (post(url, "/api/v1/optim_step", json=body).json() for _ in range(2))
        assert first["request_id"] == second["request_id"]
        post(url, "/api/v1/retrieve_future", json={"request_id": first["request_id"]})
        assert [c for c in hub.calls if c[0] == "optim_step"] == [("optim_step", hub_id(tc.model_id), 0.1)]


def test_expired_session_frees_its_runs(tmp_path):
    hub, app = server(tmp_path, session_ttl_s=0.5)
    with serving(app) as url:
        session = post(url, "/api/v1/create_session", json={"tags": [], "sdk_version": "x"}).json()["session_id"]
        fut = post(url, "/api/v1/create_model", json={"session_id": session, "model_seq_id": 0, "base_model": BASE,
                                                      "lora_config": {"rank": 2, "seed": 1}}).json()
        assert post(url, "/api/v1/retrieve_future", json=fut).json()["model_id"] == f"{session}:train:0"
        assert hub_id(f"{session}:train:0") in hub.runs
        deadline = time.time() + 10
        while hub_id(f"{session}:train:0") in hub.runs and time.time() < deadline:
            time.sleep(0.1)
        assert ("drop", hub_id(f"{session}:train:0")) in hub.calls and not app.state.worker.loaded
        r = post(url, "/api/v1/session_heartbeat", json={"session_id": session})
        assert r.status_code == 410 and "expired" in r.json()["detail"]
        # a client that closes its session frees its runs at once
        other = post(url, "/api/v1/create_session", json={"tags": [], "sdk_version": "x"}).json()["session_id"]
        fut = post(url, "/api/v1/create_model", json={"session_id": other, "model_seq_id": 0, "base_model": BASE,
                                                      "lora_config": {"rank": 2, "seed": 1}}).json()
        post(url, "/api/v1/retrieve_future", json=fut)
        assert post(url, f"/api/v1/sessions/{other}/finish", json={"reason": {"type": "success"}}).status_code == 204
        deadline = time.time() + 10
        while hub_id(f"{other}:train:0") in hub.runs and time.time() < deadline:
            time.sleep(0.05)
        assert ("drop", hub_id(f"{other}:train:0")) in hub.calls
        # the records stay: the runs are listed
        runs = httpx.get(url + "/api/v1/training_runs", headers={"X-API-Key": "tml-alice-key"}).json()
        assert [r["training_run_id"] for r in runs["training_runs"]] == [f"{session}:train:0", f"{other}:train:0"]


def test_sparse_targets_decode_as_dense(tmp_path):
    from omnigym.serve.contract import RequestError
    from omnigym.serve.wire import decode_forward_backward

    targets = torch.zeros(3, 4, dtype=torch.long)
    targets[1, 2] = 5
    d = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]),
                    loss_fn_inputs={"target_tokens": targets, "weights": torch.ones(3)})
    assert d.loss_fn_inputs["target_tokens"].sparse_crow_indices is not None  # the SDK sent CSR
    _, _, _, _, data, _ = decode_forward_backward(proto_body("a:train:0", [d]), False, 10**6)
    assert torch.equal(data[0].inputs["target_tokens"], targets)
    assert np.allclose(data[0].inputs["weights"].numpy(), 1.0)
    # a sparse tensor whose dense shape is huge is refused before it is made dense
    huge = forward_backward_request_to_proto(types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[d], loss_fn="cross_entropy"), model_id="a:train:0"))
    huge.data[0].loss_fn_inputs["target_tokens"].shape[:] = [100_000, 100_000]
    with pytest.raises(RequestError, match="over 250000 elements") as info:
        decode_forward_backward(huge.SerializeToString(), False, 10**6)
    assert info.value.status == 413
    odd = forward_backward_request_to_proto(types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[d], loss_fn="cross_entropy"), model_id="a:train:0"))
    odd.data[0].model_input[0].encoded_text.tokens = b"\x01\x02\x03"
    with pytest.raises(RequestError, match="is not int32 tokens"):
        decode_forward_backward(odd.SerializeToString(), False, 10**6)


def test_real_hub_through_the_sdk(tmp_path):
    """The integration check: the SDK against this app and the real hub on a tiny model."""
    hub_module = pytest.importorskip("omnigym.serve.hub", reason="serve/hub.py is not on this branch yet (h-hub)")
    from omnigym.models.lm import build_tiny_model

    base = str(build_tiny_model(tmp_path / "tiny"))
    hub = hub_module.ModelHub(base, tmp_path / "store" / "hub")
    app = make_app(hub, Store(tmp_path / "serve.db"), limits=Limits(poll_s=2))
    with serving(app) as url:
        sc = client(url)
        tc = sc.create_lora_training_client(base_model=base, rank=4, seed=0).result()
        data = [datum([5, 6, 7, 8], [6, 7, 8, 9])]
        losses = []
        for _ in range(5):
            fb = tc.forward_backward(data, "cross_entropy")
            tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
            losses.append(fb.result().metrics["loss:sum"])
        assert losses[-1] < losses[0], losses
        sampler = tc.save_weights_and_get_sampling_client().result()
        res = sampler.sample(types.ModelInput.from_ints([5, 6]), 2, types.SamplingParams(max_tokens=4, seed=0)).result()
        assert len(res.sequences) == 2 and all(1 <= len(s.tokens) <= 4 for s in res.sequences)
        # the tokenizer the SDK loads is the server's folder, by an absolute path
        assert tc.get_info().model_data.tokenizer_id == str(Path(base).resolve())
        assert tc.get_tokenizer().encode("ab") == hub.tokenizer.encode("ab")


def test_zstd_body_and_a_zstd_bomb(tmp_path):
    import zstandard

    hub, app = server(tmp_path, max_request_bytes=100_000)
    with serving(app) as url:
        tc = client(url).create_lora_training_client(base_model=BASE, rank=2, seed=0).result()
        body = proto_body(tc.model_id, [datum([1, 2], [2, 3])], seq_id=5)
        headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "zstd"}
        fut = post(url, "/api/v1/forward_backward", content=zstandard.ZstdCompressor().compress(body),
                   headers=headers).json()
        out = post(url, "/api/v1/retrieve_future", json=fut, headers={"Accept": "application/x-protobuf"})
        assert out.headers["content-type"] == "application/x-protobuf" and len(out.content) > 0
        bomb = zstandard.ZstdCompressor().compress(b"\0" * 10_000_000)  # small on the wire, 10 MB inside
        assert len(bomb) < 100_000
        r = post(url, "/api/v1/forward_backward", content=bomb, headers=headers)
        assert r.status_code == 413 and "over 100000 bytes once decompressed" in r.json()["detail"]
        r = post(url, "/api/v1/forward_backward", content=b"not zstd at all", headers=headers)
        assert r.status_code == 400 and "bad zstd data" in r.json()["detail"]


def test_two_clients_at_once_each_as_if_alone(tmp_path):
    """Two callers training at the same time through one queue: each run ends exactly where
    it ends when trained alone (same seed, same data)."""
    import threading

    def train(url, key, seed, tokens, out):
        tc = client(url, key).create_lora_training_client(base_model=BASE, rank=2, seed=seed).result()
        for _ in range(4):
            fb = tc.forward_backward([datum(tokens, [t + 1 for t in tokens])], "cross_entropy")
            tc.optim_step(types.AdamParams(learning_rate=0.1)).result()
            fb.result()
        out[key] = tc.model_id

    alone = {}
    for key, seed, tokens in (("tml-alice-key", 1, [1, 2, 3]), ("tml-bob-key-123", 2, [4, 5])):
        hub, app = server(tmp_path / key)
        with serving(app) as url:
            ids: dict = {}
            train(url, key, seed, tokens, ids)
            alone[key] = hub.runs[hub_id(ids[key])]["logits"].detach().clone()
    hub, app = server(tmp_path / "together")
    with serving(app) as url:
        ids = {}
        threads = [threading.Thread(target=train, args=(url, "tml-alice-key", 1, [1, 2, 3], ids)),
                   threading.Thread(target=train, args=(url, "tml-bob-key-123", 2, [4, 5], ids))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        for key in alone:
            assert torch.equal(hub.runs[hub_id(ids[key])]["logits"].detach(), alone[key]), key
        assert not torch.equal(alone["tml-alice-key"], alone["tml-bob-key-123"])


def serving_process(proc, port: int, seconds: float):
    """``proc`` once its server answers /healthz on ``port``; fails if it exits or takes longer."""
    deadline = time.time() + seconds
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/v1/healthz").status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.time() < deadline, ("the server did not start", proc.args)
        time.sleep(0.1)


def test_server_killed_and_restarted_client_goes_on(tmp_path):
    """SIGKILL between requests: a new process on the same store serves the run again from its
    last saved state, and the same SDK client continues."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    import omnigym

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(omnigym.__file__).parents[1]),
                                                         str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    code = f"from serve_helpers import serve_fake_forever; serve_fake_forever({str(tmp_path)!r}, {port})"

    def start():
        return serving_process(subprocess.Popen([sys.executable, "-c", code], env=env), port, 60)

    proc = start()
    try:
        url = f"http://127.0.0.1:{port}"
        tc = client(url).create_lora_training_client(base_model=BASE, rank=2, seed=0).result()
        data = [datum([1, 2], [3, 4])]
        for _ in range(2):
            tc.forward_backward(data, "cross_entropy").result()
            tc.optim_step(types.AdamParams(learning_rate=0.5)).result()
        tc.save_state("kept").result()
        saved_loss = tc.forward(data, "cross_entropy").result().metrics["loss:sum"]
        tc.forward_backward(data, "cross_entropy").result()  # work after the save: lost with the process
        tc.optim_step(types.AdamParams(learning_rate=0.5)).result()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc = start()
        # the same client: its run is served again, at the saved state (not the later step)
        assert tc.forward(data, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(saved_loss, rel=1e-6)
        tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=0.5)).result()
        assert tc.forward(data, "cross_entropy").result().metrics["loss:sum"] < saved_loss
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_wrongly_typed_fields_are_4xx_never_5xx(tmp_path):
    """A 5xx makes the SDK retry for minutes: every wrong type must be the client's error."""
    hub, app = server(tmp_path)
    junk_values = [[1], {"a": 1}]  # unhashable, and a mapping where a scalar belongs
    with serving(app) as url:
        tc = client(url).create_lora_training_client(base_model=BASE, rank=2, seed=0).result()
        session = tc.model_id.split(":")[0]
        good = {"session_id": session, "model_seq_id": 5, "base_model": BASE, "model_id": tc.model_id,
                "lora_config": {"rank": 2}, "adam_params": {}, "path": "n1", "optimizer": False,
                "sampling_session_seq_id": 3, "prompt": {"chunks": [{"tokens": [1]}]}, "sampling_params": {},
                "request_id": "f-x", "num_samples": 1}
        for endpoint in ("create_model", "optim_step", "save_weights", "save_weights_for_sampler", "load_weights",
                         "create_sampling_session", "asample", "retrieve_future", "get_info", "session_heartbeat"):
            for field in good:
                for junk in junk_values:
                    r = post(url, f"/api/v1/{endpoint}", json={**good, field: junk})
                    assert r.status_code < 500, (endpoint, field, junk, r.text)
        assert tc.forward_backward([datum([1], [2])], "cross_entropy").result().metrics["loss:sum"] > 0


def test_sdk_numbers_equal_hand_and_in_process_and_custom_loss_matches(tmp_path):
    """Through the SDK against the real hub: each loss's per-token log-probs equal the hub's
    in-process values on the same batch, and ``loss:sum`` equals the hand formula on them; a
    custom loss (run by the SDK on the client) that is the cross entropy gives its gradient."""
    hub_module = pytest.importorskip("omnigym.serve.hub", reason="serve/hub.py is not on this branch yet (h-hub)")
    from omnigym.models.lm import build_tiny_model
    from omnigym.serve.contract import DatumIn

    base = str(build_tiny_model(tmp_path / "tiny"))
    hub = hub_module.ModelHub(base, tmp_path / "store" / "hub")
    app = make_app(hub, Store(tmp_path / "serve.db"), limits=Limits(poll_s=2))
    tokens, targets = [5, 6, 7, 8, 9], [6, 7, 8, 9, 10]
    weights = [1.0, 1.0, 0.0, 1.0, 1.0]
    sampled = [-4.0, -4.5, -3.9, -4.2, -5.0]
    advantages = [1.0, -0.5, 2.0, 0.0, 1.0]
    inputs = {"cross_entropy": {"target_tokens": targets, "weights": weights},
              "importance_sampling": {"target_tokens": targets, "logprobs": sampled, "advantages": advantages},
              "ppo": {"target_tokens": targets, "logprobs": sampled, "advantages": advantages}}
    with serving(app) as url:
        sc = client(url)
        tc = sc.create_lora_training_client(base_model=base, rank=4, seed=0).result()
        run = hub_id(tc.model_id)
        # one step first, so the adapter is not at its zero start and the numbers depend on it
        tc.forward_backward([datum(tokens, targets)], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        for loss, given in inputs.items():
            sent = types.Datum(model_input=types.ModelInput.from_ints(tokens),
                               loss_fn_inputs={k: np.asarray(v) for k, v in given.items()})
            out = tc.forward([sent], loss).result()
            logp = torch.tensor(out.loss_fn_outputs[0]["logprobs"].tolist())
            local = hub.forward_backward(run, [DatumIn(tokens, {k: torch.tensor(v) for k, v in given.items()})],
                                         loss, None, forward_only=True)
            torch.testing.assert_close(logp, local.outputs[0]["logprobs"], atol=1e-6, rtol=1e-6)
            ratio = (logp - torch.tensor(sampled)).exp()
            adv = torch.tensor(advantages)
            hand = {"cross_entropy": -(torch.tensor(weights) * logp).sum(),
                    "importance_sampling": -(ratio * adv).sum(),
                    "ppo": -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv).sum()}[loss]
            assert abs(out.metrics["loss:sum"] - float(hand)) < 1e-4, (loss, out.metrics, float(hand))
            assert abs(local.metrics["loss:sum"] - float(hand)) < 1e-4
        assert float(ratio.min()) < 0.8 or float(ratio.max()) > 1.2, ratio  # ppo's clip was reached

        def custom_cross_entropy(data, logprobs_list):
            loss = sum(-(torch.tensor(d.loss_fn_inputs["weights"].tolist()) * lp).sum()
                       for d, lp in zip(data, logprobs_list))
            return loss, {"custom": float(loss)}

        ce = types.Datum(model_input=types.ModelInput.from_ints(tokens),
                         loss_fn_inputs={"target_tokens": np.asarray(targets), "weights": np.asarray(weights)})
        custom = tc.forward_backward_custom([ce], custom_cross_entropy).result()
        custom_grads = [p.grad.clone() for p in hub._runs[run].params]
        tc.optim_step(types.AdamParams(learning_rate=0.0)).result()  # clears the gradients
        builtin = tc.forward_backward([ce], "cross_entropy").result()
        builtin_grads = [p.grad.clone() for p in hub._runs[run].params]
        assert abs(custom.metrics["custom"] - builtin.metrics["loss:sum"]) < 1e-4
        assert sum(float(g.abs().sum()) for g in builtin_grads) > 0
        for a, b in zip(custom_grads, builtin_grads):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_a_long_call_is_polled_quietly_until_done(tmp_path, caplog):
    """A hub call longer than the long poll: the SDK is told "ask again" (HTTP 408, its quiet
    retry) several times, then gets the result; no per-poll warning reaches the user's log."""
    hub = FakeHub(BASE, tmp_path / "hub")
    app = make_app(hub, Store(tmp_path / "serve.db"), limits=Limits(poll_s=0.2))
    slow_forward = hub.forward_backward

    def forward_backward(*args, **kwargs):
        time.sleep(1.0)
        return slow_forward(*args, **kwargs)

    hub.forward_backward = forward_backward
    with serving(app) as url, caplog.at_level("WARNING"):
        tc = client(url).create_lora_training_client(base_model=BASE, rank=4).result()
        polls = []
        real_wait = app.state.worker.wait

        async def counted(*args):
            polls.append(1)
            return await real_wait(*args)

        app.state.worker.wait = counted
        out = tc.forward_backward([datum([1, 2], [2, 3])], "cross_entropy").result()
    assert len(out.loss_fn_outputs) == 1
    assert len(polls) >= 3, polls  # 1 s of work, 0.2 s polls
    assert not [r for r in caplog.records if "try_again" in r.getMessage()]


def test_a_stopped_server_says_how_to_go_on_and_the_line_works(tmp_path):
    """SIGTERM (a scheduler, systemd) and Ctrl-C: uvicorn.run ended both in silence with exit 0;
    now the line says the store keeps the runs and gives the command that serves them again,
    which runs as printed, and the exit code is 128 + the signal."""
    import os
    import shlex
    import signal
    import subprocess
    import sys

    def start(argv):
        return serving_process(subprocess.Popen([sys.executable, "-m", "omnigym", *argv], stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE, text=True,
                                                env={**os.environ, "OMP_NUM_THREADS": "1"}), port, 120)

    port = free_port()
    store = tmp_path / "store"
    proc = start(["serve", "--base-model", "tiny", "--port", str(port), "--store", str(store)])
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"omnigym: stopped by SIGTERM; the store ({store}) keeps every run and checkpoint, each run "
                           "as its last save_state left it (its steps since are lost): go on with omnigym serve "), last
    command = shlex.split(last.split("go on with ", 1)[1].split(" (a request", 1)[0])
    assert command[:2] == ["omnigym", "serve"]
    proc = start(command[1:])  # the printed command serves the same store again
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1].startswith(f"omnigym: interrupted; the store ({store}) keeps every run")
