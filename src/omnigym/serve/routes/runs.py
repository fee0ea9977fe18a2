"""The listings of the SDK's RestClient: the caller's training runs, one run, and its checkpoints."""

from __future__ import annotations

import datetime

from fastapi import APIRouter, Request

from omnigym.serve import wire
from omnigym.serve.contract import RequestError
from omnigym.serve.routes.context import served

router = APIRouter()


@router.get("/api/v1/training_runs")
async def training_runs(request: Request, limit: int = 20, offset: int = 0):
    if not (1 <= limit <= 1000 and offset >= 0):  # a negative cursor was echoed back as if it were one
        raise RequestError(f"limit must be 1 to 1000 and offset 0 or more, got limit {limit} and offset {offset}")
    serve = served(request)
    runs = serve.store.models(request.state.owner)
    page = runs[offset:offset + limit]
    return {"training_runs": [run_json(serve.store, r) for r in page],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(runs)}}


@router.get("/api/v1/training_runs/{model_id}")
async def training_run(model_id: str, request: Request):
    serve = served(request)
    return run_json(serve.store, serve.owned_model(request.state.owner, model_id))


@router.get("/api/v1/training_runs/{model_id}/checkpoints")
async def checkpoints(model_id: str, request: Request):
    serve = served(request)
    serve.owned_model(request.state.owner, model_id)
    marks = [checkpoint_json(c) for c in serve.store.checkpoints(model_id)]
    return {"checkpoints": marks, "cursor": {"offset": 0, "limit": len(marks), "total_count": len(marks)}}


def run_json(store, rec: dict) -> dict:
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


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat()
