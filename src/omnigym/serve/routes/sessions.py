"""A client's session: created by each ``ServiceClient``, kept alive by its heartbeats, finished
when it closes. Runs and sampling sessions are named after it; an expired one's runs leave the
hub (the worker frees them)."""

from __future__ import annotations

import secrets

from fastapi import APIRouter, Request
from fastapi.responses import Response

from omnigym.serve.routes.context import served

router = APIRouter()


@router.post("/api/v1/create_session")
async def create_session(request: Request):
    serve = served(request)
    await serve.body_of(request)
    session_id = secrets.token_urlsafe(16)  # unguessable: run ids are built from it
    serve.store.add_session(session_id, request.state.owner)
    return {"type": "create_session", "session_id": session_id}


@router.post("/api/v1/session_heartbeat")
async def heartbeat(request: Request):
    serve = served(request)
    body = await serve.body_of(request)
    serve.owned_session(request.state.owner, body.get("session_id"))
    serve.store.touch_session(body["session_id"])
    return {"type": "session_heartbeat"}


@router.post("/api/v1/sessions/{session_id}/finish")
async def finish(session_id: str, request: Request):
    serve = served(request)
    serve.owned_session(request.state.owner, session_id, live=False)  # finishing twice is fine
    serve.store.expire_sessions_named([session_id])
    serve.worker.free_session(session_id)
    return Response(status_code=204)
