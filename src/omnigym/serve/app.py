"""``omnigym serve``'s HTTP layer: the REST API the ``tinker`` SDK calls, on FastAPI.

It owns identities and paths (``serve/contract.py`` says what crosses to the hub). The caller
is its API key: with keys configured, one of them (compared in constant time); without, the
server listens on loopback only and the key the SDK sends anyway names the caller. A training
run (``SESSION:train:N``, the id the SDK itself derives), its checkpoints and its sampling
sessions belong to the key that created them; a request naming someone else's gets the same
404 as one naming nothing, so it learns nothing. ``tinker://`` paths are parsed into (run,
kind, name) and only those reach the hub.

Training and sampling requests are checked here, queued to the ``Worker`` (each run's
training requests in its order, different runs' side by side: ``serve/worker.py``) and answered
with a future id at once; ``retrieve_future`` returns the result, or the SDK's "try again" after
a long poll.

``make_app`` builds the app: the state every route shares (``routes/context.py``), the size and
API-key checks every request passes first, and the routes, one module per resource under
``routes/``. FastAPI is the framework of all three of omnigym's servers (``serve/http.py`` says
why).
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from omnigym.serve.contract import RequestError
from omnigym.serve.http import BodyTooLarge, declared_too_large
from omnigym.serve.routes import futures, runs, sampling, service, sessions, training, weights
from omnigym.serve.routes.context import ServeContext
from omnigym.serve.store import Store


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
    """The app over ``hub`` and ``store``; ``app.state.worker`` is its worker (stop it when the
    server stops)."""
    limits = limits or Limits()
    keys = [api_key] if isinstance(api_key, str) else list(api_key or [])
    serve = ServeContext(hub, store, keys, limits)
    app = FastAPI(title="omnigym serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve, app.state.worker = serve, serve.worker

    @app.middleware("http")
    async def errors_and_limits(request: Request, call_next):
        # A body that says it is too big is refused before it is read.
        if declared_too_large(request, limits.max_request_bytes):
            return JSONResponse({"detail": str(BodyTooLarge(limits.max_request_bytes))}, status_code=413)
        try:
            request.state.owner = serve.caller(request) if request.url.path != "/api/v1/healthz" else ""
        except RequestError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=exc.status)
        return await call_next(request)

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError):
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    for routes in (service, sessions, training, weights, sampling, futures, runs):
        app.include_router(routes.router)
    app.include_router(service.fallback)  # last: every other /api/v1/ path is a 404 that says why
    return app
