"""The results of queued requests: ``retrieve_future`` answers with the result once the worker
has it, or after a long poll with the SDK's quiet "try again"."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from omnigym.serve.routes.context import served

router = APIRouter()


@router.post("/api/v1/retrieve_future")
async def retrieve_future(request: Request):
    serve = served(request)
    body = await serve.body_of(request)
    future_id = body.get("request_id")
    rec = serve.owned_future(request.state.owner, future_id)
    if rec["status"] == "pending":
        await serve.worker.wait(future_id, serve.limits.poll_s)
        rec = serve.store.future(future_id)
    if rec["status"] == "pending":
        # 408 is the SDK's quiet "still running, ask again" (queue state to its observer); a
        # 200 {"type": "try_again"} works too but logs a warning per poll on every client
        return JSONResponse({"type": "try_again", "request_id": future_id, "queue_state": "active"},
                            status_code=408)
    serve.worker.forget(future_id)
    if rec["status"] == "failed":
        return {"error": rec["error"], "category": rec["category"] or "unknown"}
    return Response(content=rec["result"], media_type=rec["content_type"])
