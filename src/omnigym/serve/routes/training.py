"""Training runs: created (``SESSION:train:N``, the id the SDK derives), described, and trained
with forward_backward and optim_step. The checks run here, before anything is queued; the
hub's work runs on the worker, in arrival order, and answers through a future."""

from __future__ import annotations

import secrets

from fastapi import APIRouter, Request

from omnigym.serve import bodies, wire
from omnigym.serve.contract import RequestError
from omnigym.serve.routes.context import PROTO, json_job, served

router = APIRouter()


@router.post("/api/v1/create_model")
async def create_model(request: Request):
    serve = served(request)
    owner, body, limits = request.state.owner, await serve.body_of(request), serve.limits
    session = serve.owned_session(owner, body.get("session_id"))
    seq = bodies.get(body, "model_seq_id", int, low=0, high=10**9)
    serve.check_base(bodies.get(body, "base_model", str))
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
    if serve.store.model(model_id) is None:
        serve.cap.check_room()
        serve.store.add_model(model_id, session["id"], owner, serve.hub.base_model, rank, seed, *flags)

    def job():
        serve.cap.ensure(model_id)
        return {"model_id": model_id, "type": "create_model"}
    return serve.queue(owner, model_id, -1, json_job(job), request=body)


@router.post("/api/v1/get_info")
async def get_info(request: Request):
    serve = served(request)
    body, base = await serve.body_of(request), serve.hub.base_model
    rec = serve.owned_model(request.state.owner, body.get("model_id"))
    return {"type": "get_info", "model_id": rec["id"], "is_lora": True, "lora_rank": rec["rank"],
            "model_name": base,
            "model_data": {"arch": "omnigym", "model_name": base, "tokenizer_id": serve.tokenizer_id}}


@router.post("/api/v1/forward_backward")
async def forward_backward(request: Request):
    serve = served(request)
    owner, hub, limits = request.state.owner, serve.hub, serve.limits
    if PROTO not in request.headers.get("content-type", ""):
        raise RequestError(f"forward_backward takes a protobuf body ({PROTO})", status=415)
    raw = await serve.read(request)
    zstd = request.headers.get("content-encoding", "") == "zstd"
    model_id, seq_id, loss_fn, config, data, forward_only = wire.decode_forward_backward(
        raw, zstd, limits.max_request_bytes)
    serve.owned_model(owner, model_id)
    if not loss_fn or len(loss_fn) > 64:  # a long one came back whole in the error, stored with it
        raise RequestError(f"loss_fn {loss_fn[:40]!r}: give a loss name (at most 64 characters)")
    bodies.check_data(data, hub.vocab_size, hub.max_length, limits.max_data)

    def job():
        serve.cap.ensure(model_id)
        result = hub.forward_backward(wire.hub_id(model_id), data, loss_fn, config, forward_only)
        return PROTO, wire.encode_forward_result(result)
    return serve.queue(owner, model_id, seq_id, job, request=raw)


@router.post("/api/v1/optim_step")
async def optim_step(request: Request):
    serve = served(request)
    owner, body = request.state.owner, await serve.body_of(request)
    model_id = serve.owned_model(owner, body.get("model_id"))["id"]
    adam = bodies.adam_step(body)

    def job():
        serve.cap.ensure(model_id)
        return {"metrics": serve.hub.optim_step(wire.hub_id(model_id), adam)}
    return serve.queue(owner, model_id, body.get("seq_id"), json_job(job), request=body)
