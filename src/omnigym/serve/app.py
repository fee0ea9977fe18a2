"""``omnigym serve``'s HTTP layer: the REST API the ``tinker`` SDK calls, on FastAPI.

It owns identities and paths (``serve/contract.py`` says what crosses to the hub). The caller
is its API key: with keys configured, one of them (compared in constant time); without, the
server listens on loopback only and the key the SDK sends anyway names the caller. A training
run (``SESSION:train:N``, the id the SDK itself derives), its checkpoints and its sampling
sessions belong to the key that created them; a request naming someone else's gets the same
404 as one naming nothing, so it learns nothing. ``tinker://`` paths are parsed into (run,
kind, name) and only those reach the hub.

Training and sampling requests are checked here, queued to the ``Worker`` (one thread calls
the hub, in arrival order) and answered with a future id at once; ``retrieve_future`` returns
the result, or the SDK's "try again" after a long poll.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from omnigym.serve import bodies, wire
from omnigym.serve.contract import RequestError, SamplerSource
from omnigym.serve.runcap import RunCap
from omnigym.serve.store import Store, as_json
from omnigym.serve.worker import Worker

PROTO = "application/x-protobuf"
NOT_SUPPORTED = ("/api/v1/create_custom_loss", "/api/v1/save_weights_external", "/api/v1/copy_weights",
                 "/api/v1/join_sampling_session", "/api/v1/forward", "/api/v1/weights_info",
                 "/api/v1/retrieve_futures", "/api/v1/cancel_future", "/api/v1/auth/token")
"""paths the SDK can call that this server answers with a 404 "not supported" (docs/serve.md)"""


@dataclass
class Limits:
    max_request_bytes: int = 64 * 1024 * 1024
    max_data: int = 1024
    """data in one forward_backward request"""
    max_samples: int = 64
    """samples for one prompt"""
    max_rank: int = 256
    max_runs: int = 64
    """training runs held in the hub at once (each an adapter plus its Adam state: without a
    cap, sessions that create runs, or touch the runs of expired sessions, fill memory)"""
    poll_s: float = 10.0
    """how long retrieve_future waits for a pending future before "try again\""""
    session_ttl_s: float = 300.0
    """a session without a heartbeat this long is expired and its runs leave the hub (0: never)"""


def make_app(hub, store: Store, api_key: str | list[str] | None = None, limits: Limits | None = None):
    limits = limits or Limits()
    keys = [api_key] if isinstance(api_key, str) else list(api_key or [])
    worker = Worker(hub, store, session_ttl_s=limits.session_ttl_s)
    cap = RunCap(store, worker, limits.max_runs, limits.session_ttl_s)
    app = FastAPI(title="omnigym serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.worker = worker
    base_names = {os.path.normpath(n) for n in (hub.base_model, Path(hub.base_model).name,
                                                str(Path(hub.base_model).resolve()))}
    # the folder by its absolute path: a client started in another directory loads the same tokenizer
    tokenizer_id = str(Path(hub.base_model).resolve()) if Path(hub.base_model).is_dir() else hub.base_model

    def caller(request) -> str:
        """The API key's digest: who this request acts for."""
        key = request.headers.get("x-api-key") or ""
        if keys:
            # every key compared in full, so the time taken says nothing about which matched
            ok = False
            for candidate in keys:
                ok |= hmac.compare_digest(key.encode(), candidate.encode())
            if not ok:
                raise RequestError("missing or wrong API key (X-API-Key)", status=401)
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    def owned_model(owner: str, model_id) -> dict:
        rec = store.model(wire.check_model_id(model_id))
        if rec is None or not hmac.compare_digest(rec["owner"], owner):
            raise RequestError(f"unknown model id {model_id!r}", status=404)
        return rec

    def owned_session(owner: str, session_id, live: bool = True) -> dict:
        rec = store.session(session_id) if isinstance(session_id, str) and len(session_id) <= 64 else None
        if rec is None or not hmac.compare_digest(rec["owner"], owner):
            raise RequestError(f"unknown session {str(session_id)[:80]!r}", status=404)
        if live and rec["expired"]:
            raise RequestError(f"session {session_id} has expired (no heartbeat for "
                               f"{limits.session_ttl_s:.0f} s); start a new ServiceClient", status=410)
        return rec

    def owned_checkpoint(owner: str, path, kind: str | None = None) -> wire.TinkerPath:
        parsed = wire.parse_path(path)
        if kind is not None and parsed.kind != kind:
            want = "sampler_weights" if kind == "sampler" else "weights"
            raise RequestError(f"{path} is not a {want} path (tinker://MODEL_ID/{want}/NAME)")
        owned_model(owner, parsed.model_id)
        if store.checkpoint(parsed.model_id, parsed.kind, parsed.name) is None:
            raise RequestError(f"no checkpoint {path}", status=404)
        return parsed

    def check_base(name) -> None:
        # compared as written, up to normpath ("dir/", "a//b", "a/../b"): the name is never
        # looked up on the server's disk
        if not isinstance(name, str) or "\x00" in name or os.path.normpath(name) not in base_names:
            raise RequestError(f"this server serves one base model, {hub.base_model!r}; got {str(name)[:120]!r}")

    def queue(owner: str, model_id: str | None, seq_id, job, extra: dict | None = None,
              request: bytes | dict = b"") -> dict:
        """Records a future, queues its job, and returns the SDK's untyped future; a training
        request sent again with the same seq_id (a retry) gets the first one's future. The
        request's own bytes are part of that key: another request that reuses a seq_id (a
        client's mistake, a raw call beside the SDK's) runs as itself, and does not get the
        first one's result in silence."""
        seq_key = None
        if model_id is not None and isinstance(seq_id, int):
            digest = hashlib.sha256(request if isinstance(request, bytes) else as_json(request)).hexdigest()[:32]
            seq_key = f"{model_id}#{seq_id}#{digest}"
        fresh = "f-" + secrets.token_urlsafe(12)
        future_id = store.add_future(fresh, owner, model_id, seq_key)
        if future_id == fresh:
            worker.submit(future_id, job)
        return {"request_id": future_id, "model_id": model_id, **(extra or {})}

    def check_case(model_id: str, kind: str, name: str) -> None:
        """A name that differs from a saved one only in case would be the same folder on a
        case-insensitive disk (macOS, Windows): saving it would overwrite the other in silence."""
        for c in store.checkpoints(model_id):
            if c["kind"] == kind and c["name"] != name and c["name"].lower() == name.lower():
                raise RequestError(f"checkpoint name {name!r} differs from the saved {c['name']!r} only in case; "
                                   "pick another name")

    def json_job(fn):
        return lambda: ("application/json", as_json(fn()))

    @app.middleware("http")
    async def errors_and_limits(request: Request, call_next):
        # A body that says it is too big is refused before it is read.
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > limits.max_request_bytes):
            return JSONResponse({"detail": f"request body over {limits.max_request_bytes} bytes"}, status_code=413)
        try:
            request.state.owner = caller(request) if request.url.path != "/api/v1/healthz" else ""
        except RequestError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=exc.status)
        return await call_next(request)

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError):
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    async def read(request: Request) -> bytes:
        """The body, refused once it passes the limit (a chunked body has no length to check)."""
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > limits.max_request_bytes:
                raise RequestError(f"request body over {limits.max_request_bytes} bytes", status=413)
            chunks.append(chunk)
        return b"".join(chunks)

    async def body_of(request: Request) -> dict:
        return bodies.parse_json(await read(request))

    # service
    @app.get("/api/v1/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def client_config(request: Request):
        # Flags that keep the protocol to what this server speaks: API-key auth, uncompressed
        # protobuf forward_backward chunks sent one after another, per-request future polling,
        # custom losses computed by the client.
        return {"pjwt_auth_enabled": False, "proto_compress_fwdbwd": False, "parallel_fwdbwd_chunks": False,
                "sample_use_retrieve_futures": False, "custom_loss_server_side": False,
                "sample_join_sampling_session": False, "use_pyqwest_transport": False,
                "fwdbwd_max_chunk_len": limits.max_data,
                "fwdbwd_max_chunk_bytes_count": max(1, limits.max_request_bytes // 2)}

    @app.post("/api/v1/telemetry")
    async def telemetry(request: Request):
        await read(request)  # the SDK's usage events: not kept
        return {"status": "accepted"}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities():
        return {"supported_models": [{"model_name": hub.base_model, "max_context_length": hub.max_length,
                                      "trainable": True, "sampleable": True}]}

    @app.post("/api/v1/create_session")
    async def create_session(request: Request):
        await body_of(request)
        session_id = secrets.token_urlsafe(16)  # unguessable: run ids are built from it
        store.add_session(session_id, request.state.owner)
        return {"type": "create_session", "session_id": session_id}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request):
        body = await body_of(request)
        owned_session(request.state.owner, body.get("session_id"))
        store.touch_session(body["session_id"])
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str, request: Request):
        owned_session(request.state.owner, session_id, live=False)  # finishing twice is fine
        store.expire_sessions_named([session_id])
        worker.free_session(session_id)
        return Response(status_code=204)

    # training runs
    @app.post("/api/v1/create_model")
    async def create_model(request: Request):
        owner, body = request.state.owner, await body_of(request)
        session = owned_session(owner, body.get("session_id"))
        seq = bodies.get(body, "model_seq_id", int, low=0, high=10**9)
        check_base(bodies.get(body, "base_model", str))
        optimizer = body.get("optimizer_config") or {"type": "adamw"}
        if not isinstance(optimizer, dict) or optimizer.get("type") != "adamw":
            raise RequestError(f"only the adamw optimizer is supported, got {str(optimizer)[:80]}")
        lora = bodies.get(body, "lora_config", dict, {"rank": 32})
        rank = bodies.get(lora, "rank", int, low=1, high=limits.max_rank)
        seed = bodies.get(lora, "seed", int, None, low=-bodies.INT64, high=bodies.INT64 - 1)
        seed = secrets.randbelow(2**31) if seed is None else seed  # kept, so a restart rebuilds the same run
        flags = [bool(bodies.get(lora, k, bool, True)) for k in ("train_mlp", "train_attn", "train_unembed")]
        if not any(flags):
            raise RequestError("LoRA needs at least one of train_mlp, train_attn, train_unembed")
        model_id = f"{session['id']}:train:{seq}"
        if store.model(model_id) is None:
            cap.check_room()
            store.add_model(model_id, session["id"], owner, hub.base_model, rank, seed, *flags)

        def job():
            cap.ensure(model_id)
            return {"model_id": model_id, "type": "create_model"}
        return queue(owner, model_id, -1, json_job(job), request=body)

    @app.post("/api/v1/get_info")
    async def get_info(request: Request):
        owner, body = request.state.owner, await body_of(request)
        rec = owned_model(owner, body.get("model_id"))
        return {"type": "get_info", "model_id": rec["id"], "is_lora": True, "lora_rank": rec["rank"],
                "model_name": hub.base_model,
                "model_data": {"arch": "omnigym", "model_name": hub.base_model, "tokenizer_id": tokenizer_id}}

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request):
        owner = request.state.owner
        if PROTO not in request.headers.get("content-type", ""):
            raise RequestError(f"forward_backward takes a protobuf body ({PROTO})", status=415)
        raw = await read(request)
        zstd = request.headers.get("content-encoding", "") == "zstd"
        model_id, seq_id, loss_fn, config, data, forward_only = wire.decode_forward_backward(
            raw, zstd, limits.max_request_bytes)
        owned_model(owner, model_id)
        if not loss_fn or len(loss_fn) > 64:  # a long one came back whole in the error, stored with it
            raise RequestError(f"loss_fn {loss_fn[:40]!r}: give a loss name (at most 64 characters)")
        bodies.check_data(data, hub.vocab_size, hub.max_length, limits.max_data)

        def job():
            cap.ensure(model_id)
            result = hub.forward_backward(wire.hub_id(model_id), data, loss_fn, config, forward_only)
            return PROTO, wire.encode_forward_result(result)
        return queue(owner, model_id, seq_id, job, request=raw)

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request):
        owner, body = request.state.owner, await body_of(request)
        model_id = owned_model(owner, body.get("model_id"))["id"]
        adam = bodies.adam_step(body)

        def job():
            cap.ensure(model_id)
            return {"metrics": hub.optim_step(wire.hub_id(model_id), adam)}
        return queue(owner, model_id, body.get("seq_id"), json_job(job), request=body)

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request):
        owner, body = request.state.owner, await body_of(request)
        model_id = owned_model(owner, body.get("model_id"))["id"]
        seq = body.get("seq_id")
        name = wire.check_name(bodies.get(body, "path", str, f"state-{seq if isinstance(seq, int) else secrets.token_hex(4)}"))
        check_case(model_id, "state", name)
        if store.checkpoint(model_id, "state", name) and not body.get("overwrite"):
            raise RequestError(f"checkpoint {name!r} exists; pick another name or pass overwrite=True")
        path = str(wire.TinkerPath(model_id, "state", name))

        def job():
            cap.ensure(model_id)
            hub.save(wire.hub_id(model_id), name, "state")
            store.add_checkpoint(model_id, "state", name)
            return {"path": path, "type": "save_weights"}
        return queue(owner, model_id, seq, json_job(job), request=body)

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request):
        owner, body = request.state.owner, await body_of(request)
        rec = owned_model(owner, body.get("model_id"))
        model_id, seq = rec["id"], body.get("seq_id")
        ephemeral = body.get("path") is None
        name = wire.check_name(bodies.get(body, "path", str, f"sampler-{secrets.token_hex(6)}"))
        check_case(model_id, "sampler", name)
        path = str(wire.TinkerPath(model_id, "sampler", name))
        sampler_id = f"{rec['session']}:sample:{secrets.token_hex(6)}" if ephemeral else None

        def job():
            cap.ensure(model_id)
            hub.save(wire.hub_id(model_id), name, "sampler")
            store.add_checkpoint(model_id, "sampler", name)
            if sampler_id is not None:
                store.add_sampler(sampler_id, owner, model_id, name)
            return {"path": path, "sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}
        return queue(owner, model_id, seq, json_job(job), request=body)

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request):
        owner, body = request.state.owner, await body_of(request)
        with_optimizer = bool(bodies.get(body, "optimizer", bool, False))
        source = owned_checkpoint(owner, bodies.get(body, "path", str), "state")
        if body.get("weights_access_token"):
            raise RequestError("weights_access_token is not supported by omnigym serve")
        if body.get("model_id") is not None:
            model_id = owned_model(owner, body["model_id"])["id"]
        else:  # create-via-load: a new run shaped like the checkpoint's, id derived as the SDK does
            session = owned_session(owner, body.get("session_id"))
            seq = bodies.get(body, "model_seq_id", int, low=0, high=10**9)
            if body.get("base_model") is not None:
                check_base(body["base_model"])
            src = store.model(source.model_id)
            model_id = f"{session['id']}:train:{seq}"
            if store.model(model_id) is None:
                cap.check_room()
                store.add_model(model_id, session["id"], owner, hub.base_model, src["rank"], src["seed"],
                                bool(src["train_mlp"]), bool(src["train_attn"]), bool(src["train_unembed"]))

        def job():
            cap.ensure(model_id)
            hub.load(wire.hub_id(model_id), wire.hub_id(source.model_id), source.name, with_optimizer)
            return {"path": str(source), "model_id": model_id, "type": "load_weights"}
        seq_id = body.get("seq_id") if body.get("model_id") is not None else -1
        return queue(owner, model_id, seq_id, json_job(job), request=body)

    # sampling
    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request):
        owner, body = request.state.owner, await body_of(request)
        session = owned_session(owner, body.get("session_id"))
        seq = bodies.get(body, "sampling_session_seq_id", int, low=0, high=10**9)
        model_id = name = None
        if body.get("model_path") is not None:
            parsed = owned_checkpoint(owner, body["model_path"], "sampler")
            model_id, name = parsed.model_id, parsed.name
        else:
            check_base(body.get("base_model"))
        sampler_id = f"{session['id']}:sample:{seq}"
        if store.sampler(sampler_id) is None:
            store.add_sampler(sampler_id, owner, model_id, name)
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    def owned_sampler(owner: str, sampler_id) -> dict:
        rec = store.sampler(sampler_id) if isinstance(sampler_id, str) and len(sampler_id) <= 100 else None
        if rec is None or not hmac.compare_digest(rec["owner"], owner):
            raise RequestError(f"unknown sampling session {str(sampler_id)[:80]!r}", status=404)
        return rec

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str, request: Request):
        rec = owned_sampler(request.state.owner, sampler_id)
        path = str(wire.TinkerPath(rec["model"], "sampler", rec["name"])) if rec["model"] else None
        return {"sampler_id": rec["id"], "base_model": hub.base_model, "model_path": path}

    @app.post("/api/v1/asample")
    async def asample(request: Request):
        owner, body = request.state.owner, await body_of(request)
        if body.get("sampling_session_id") is not None:
            rec = owned_sampler(owner, body["sampling_session_id"])
            source = SamplerSource(rec["model"] and wire.hub_id(rec["model"]), rec["name"])
        elif body.get("model_path") is not None:
            parsed = owned_checkpoint(owner, body["model_path"], "sampler")
            source = SamplerSource(wire.hub_id(parsed.model_id), parsed.name)
        else:
            check_base(body.get("base_model"))
            source = SamplerSource()
        n = bodies.get(body, "num_samples", int, 1, low=1, high=limits.max_samples)
        prompt = bodies.prompt_tokens(body)
        params = bodies.sample_params(body)
        if not prompt:
            raise RequestError("the prompt is empty")
        bodies.check_tokens(prompt, hub.vocab_size, "prompt")
        bodies.check_tokens(params.stop_tokens, hub.vocab_size, "sampling_params.stop")
        if len(prompt) + params.max_tokens > hub.max_length:
            raise RequestError(f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) is over "
                               f"the longest sequence, {hub.max_length}", status=413)

        keep = bodies.last_n(body, len(prompt))

        def job():
            result = hub.sample(source, prompt, n, params)
            if keep is not None and result.prompt_logprobs is not None:
                cut = len(result.prompt_logprobs) - keep
                result.prompt_logprobs = [None] * cut + list(result.prompt_logprobs[cut:])
            return PROTO, wire.encode_sample_result(result)
        future = queue(owner, None, None, job)
        future["sample_sequence_ids"] = [f"{future['request_id']}:{i}" for i in range(n)]
        return future

    # futures
    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request):
        owner, body = request.state.owner, await body_of(request)
        future_id = body.get("request_id")
        rec = store.future(future_id) if isinstance(future_id, str) and len(future_id) <= 64 else None
        if rec is None or not hmac.compare_digest(rec["owner"], owner):
            raise RequestError(f"unknown future {str(future_id)[:80]!r}", status=404)
        if rec["status"] == "pending":
            await worker.wait(future_id, limits.poll_s)
            rec = store.future(future_id)
        if rec["status"] == "pending":
            # 408 is the SDK's quiet "still running, ask again" (queue state to its observer); a
            # 200 {"type": "try_again"} works too but logs a warning per poll on every client
            return JSONResponse({"type": "try_again", "request_id": future_id, "queue_state": "active"},
                                status_code=408)
        worker.forget(future_id)
        if rec["status"] == "failed":
            return {"error": rec["error"], "category": rec["category"] or "unknown"}
        return Response(content=rec["result"], media_type=rec["content_type"])

    # listings (the SDK's RestClient)
    def run_json(rec: dict) -> dict:
        marks = [checkpoint_json(c) for c in store.checkpoints(rec["id"])]
        last = [m for m in marks if m["checkpoint_type"] == "training"]
        last_s = [m for m in marks if m["checkpoint_type"] == "sampler"]
        return {"training_run_id": rec["id"], "base_model": rec["base"], "model_owner": rec["owner"][:8],
                "is_lora": True, "lora_rank": rec["rank"], "last_request_time": _iso(rec["created"]),
                "last_checkpoint": last[-1] if last else None,
                "last_sampler_checkpoint": last_s[-1] if last_s else None}

    def checkpoint_json(c: dict) -> dict:
        path = wire.TinkerPath(c["model"], c["kind"], c["name"])
        return {"checkpoint_id": str(path).split("/", 3)[3], "tinker_path": str(path), "time": _iso(c["created"]),
                "checkpoint_type": "training" if c["kind"] == "state" else "sampler"}

    @app.get("/api/v1/training_runs")
    async def training_runs(request: Request, limit: int = 20, offset: int = 0):
        runs = store.models(request.state.owner)
        page = runs[max(offset, 0):max(offset, 0) + max(min(limit, 1000), 0)]
        return {"training_runs": [run_json(r) for r in page],
                "cursor": {"offset": offset, "limit": limit, "total_count": len(runs)}}

    @app.get("/api/v1/training_runs/{model_id}")
    async def training_run(model_id: str, request: Request):
        return run_json(owned_model(request.state.owner, model_id))

    @app.get("/api/v1/training_runs/{model_id}/checkpoints")
    async def checkpoints(model_id: str, request: Request):
        owned_model(request.state.owner, model_id)
        marks = [checkpoint_json(c) for c in store.checkpoints(model_id)]
        return {"checkpoints": marks, "cursor": {"offset": 0, "limit": len(marks), "total_count": len(marks)}}

    @app.api_route("/api/v1/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def not_supported(rest: str, request: Request):
        # 404, not 501: the SDK retries 5xx for minutes, a 404 it raises at once with this text
        known = f"/api/v1/{rest}" in NOT_SUPPORTED
        what = "is not supported by omnigym serve" if known else "is not an endpoint of omnigym serve"
        return JSONResponse({"detail": f"/api/v1/{rest[:80]} {what} (docs/serve.md lists what is)"},
                            status_code=404)

    return app


def _iso(t: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat()


