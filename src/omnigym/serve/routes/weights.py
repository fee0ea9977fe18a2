"""Checkpoints of a training run: saved for training (``weights/NAME``: the adapter and its
Adam state) or for sampling (``sampler_weights/NAME``), and loaded into a run, or into a new
one shaped like the checkpoint's (create-via-load)."""

from __future__ import annotations

import secrets

from fastapi import APIRouter, Request

from omnigym.serve import bodies, wire
from omnigym.serve.contract import RequestError
from omnigym.serve.routes.context import json_job, served

router = APIRouter()


@router.post("/api/v1/save_weights")
async def save_weights(request: Request):
    serve = served(request)
    owner, body = request.state.owner, await serve.body_of(request)
    model_id = serve.owned_model(owner, body.get("model_id"))["id"]
    seq = body.get("seq_id")
    name = wire.check_name(bodies.get(body, "path", str, f"state-{seq if isinstance(seq, int) else secrets.token_hex(4)}"))
    serve.check_case(model_id, "state", name)
    if serve.store.checkpoint(model_id, "state", name) and not body.get("overwrite"):
        raise RequestError(f"checkpoint {name!r} exists; pick another name or pass overwrite=True")
    path = str(wire.TinkerPath(model_id, "state", name))

    def job():
        serve.cap.ensure(model_id)
        serve.hub.save(wire.hub_id(model_id), name, "state")
        serve.store.add_checkpoint(model_id, "state", name)
        return {"path": path, "type": "save_weights"}
    return serve.queue(owner, model_id, seq, json_job(job), request=body)


@router.post("/api/v1/save_weights_for_sampler")
async def save_for_sampler(request: Request):
    serve = served(request)
    owner, body = request.state.owner, await serve.body_of(request)
    rec = serve.owned_model(owner, body.get("model_id"))
    model_id, seq = rec["id"], body.get("seq_id")
    ephemeral = body.get("path") is None
    name = wire.check_name(bodies.get(body, "path", str, f"sampler-{secrets.token_hex(6)}"))
    serve.check_case(model_id, "sampler", name)
    path = str(wire.TinkerPath(model_id, "sampler", name))
    sampler_id = f"{rec['session']}:sample:{secrets.token_hex(6)}" if ephemeral else None

    def job():
        serve.cap.ensure(model_id)
        serve.hub.save(wire.hub_id(model_id), name, "sampler")
        serve.store.add_checkpoint(model_id, "sampler", name)
        if sampler_id is not None:
            serve.store.add_sampler(sampler_id, owner, model_id, name)
        return {"path": path, "sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}
    return serve.queue(owner, model_id, seq, json_job(job), request=body)


@router.post("/api/v1/load_weights")
async def load_weights(request: Request):
    serve = served(request)
    owner, body, store = request.state.owner, await serve.body_of(request), serve.store
    with_optimizer = bool(bodies.get(body, "optimizer", bool, False))
    source = serve.owned_checkpoint(owner, bodies.get(body, "path", str), "state")
    if body.get("weights_access_token"):
        raise RequestError("weights_access_token is not supported by omnigym serve")
    if body.get("model_id") is not None:
        model_id = serve.owned_model(owner, body["model_id"])["id"]
    else:  # create-via-load: a new run shaped like the checkpoint's, id derived as the SDK does
        session = serve.owned_session(owner, body.get("session_id"))
        seq = bodies.get(body, "model_seq_id", int, low=0, high=10**9)
        if body.get("base_model") is not None:
            serve.check_base(body["base_model"])
        src = store.model(source.model_id)
        model_id = f"{session['id']}:train:{seq}"
        if store.model(model_id) is None:
            serve.cap.check_room()
            store.add_model(model_id, session["id"], owner, serve.hub.base_model, src["rank"], src["seed"],
                            bool(src["train_mlp"]), bool(src["train_attn"]), bool(src["train_unembed"]))

    def job():
        serve.cap.ensure(model_id)
        serve.hub.load(wire.hub_id(model_id), wire.hub_id(source.model_id), source.name, with_optimizer)
        return {"path": str(source), "model_id": model_id, "type": "load_weights"}
    seq_id = body.get("seq_id") if body.get("model_id") is not None else -1
    return serve.queue(owner, model_id, seq_id, json_job(job), request=body,
                       alone=True)  # it may read another run's checkpoint: after every job before it
