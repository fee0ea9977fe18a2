"""Sampling: sampling sessions (over the base model or a run's ``sampler_weights`` checkpoint)
and ``asample``, checked here and queued like training, its result the SDK's protobuf."""

from __future__ import annotations

from fastapi import APIRouter, Request

from omnigym.serve import bodies, wire
from omnigym.serve.contract import RequestError, SamplerSource
from omnigym.serve.routes.context import PROTO, served

router = APIRouter()


@router.post("/api/v1/create_sampling_session")
async def create_sampling_session(request: Request):
    serve = served(request)
    owner, body = request.state.owner, await serve.body_of(request)
    session = serve.owned_session(owner, body.get("session_id"))
    seq = bodies.get(body, "sampling_session_seq_id", int, low=0, high=10**9)
    model_id = name = None
    if body.get("model_path") is not None:
        parsed = serve.owned_checkpoint(owner, body["model_path"], "sampler")
        model_id, name = parsed.model_id, parsed.name
    else:
        serve.check_base(body.get("base_model"))
    sampler_id = f"{session['id']}:sample:{seq}"
    if serve.store.sampler(sampler_id) is None:
        serve.store.add_sampler(sampler_id, owner, model_id, name)
    return {"type": "create_sampling_session", "sampling_session_id": sampler_id}


@router.get("/api/v1/samplers/{sampler_id}")
async def get_sampler(sampler_id: str, request: Request):
    serve = served(request)
    rec = serve.owned_sampler(request.state.owner, sampler_id)
    path = str(wire.TinkerPath(rec["model"], "sampler", rec["name"])) if rec["model"] else None
    return {"sampler_id": rec["id"], "base_model": serve.hub.base_model, "model_path": path}


def _source(serve, owner: str, body: dict) -> tuple[SamplerSource, str | None]:
    """The weights a sample request names (a sampling session's, a checkpoint's, or the base
    model's) and the training run whose queued jobs come first (None: none). The prefix cache
    is kept per sampling session, else per caller."""
    if body.get("sampling_session_id") is not None:
        rec = serve.owned_sampler(owner, body["sampling_session_id"])
        return SamplerSource(rec["model"] and wire.hub_id(rec["model"]), rec["name"], rec["id"]), rec["model"]
    if body.get("model_path") is not None:
        parsed = serve.owned_checkpoint(owner, body["model_path"], "sampler")
        return SamplerSource(wire.hub_id(parsed.model_id), parsed.name, owner), parsed.model_id
    serve.check_base(body.get("base_model"))
    return SamplerSource(session=owner), None


@router.post("/api/v1/asample")
async def asample(request: Request):
    serve = served(request)
    owner, body, hub = request.state.owner, await serve.body_of(request), serve.hub
    source, after = _source(serve, owner, body)
    n = bodies.get(body, "num_samples", int, 1, low=1, high=serve.limits.max_samples)
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
    future = serve.queue(owner, None, None, job, sampling=True, after=after)
    future["sample_sequence_ids"] = [f"{future['request_id']}:{i}" for i in range(n)]
    return future
