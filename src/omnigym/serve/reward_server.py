"""``omnigym serve-rm RUN_DIR``: a reward model trained by ``omnigym train rm``, served over HTTP
so that the trainer and its generators share one copy (``--rewards rm:http://HOST:PORT:1.0``,
``rewards/remote.py``).

- ``POST /score`` ``{"completions": [text], "prompts": [text or [{"role", "content"}]]}`` ->
  ``{"scores": [float]}``: each (prompt, completion) rendered and scored as ``rm:RUN_DIR``
  scores it in the trainer (``RewardModelScorer``), so the scores are the same.
- ``GET /info``: the model's name (its run directory's), its reward info (how it renders
  inputs, its held-out accuracy), the batching settings and what was scored so far.

Requests go through a ``DynamicBatcher``: one thread scores, merging the requests that wait into
forward passes of up to ``--batch-size`` rows; with ``--max-queue`` requests waiting, another
is answered 503 (the client waits and tries again). A request names no file: prompts and
completions are text, and the only folder the server reads is the one it was started with.
It listens on loopback unless ``--host`` says otherwise, which needs ``--api-key-env``; clients then
send ``Authorization: Bearer KEY`` (``serve/http.py``'s check, one for the three servers).
"""

# No ``from __future__ import annotations`` here: FastAPI reads the handlers' annotations
# (``request: Request``), and those name classes imported inside ``make_reward_app``.
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Union

from omnigym.errors import OmnigymError, missing_extra, path_name
from omnigym.serve.http import serve_in_main_thread

log = logging.getLogger("omnigym.serve")

DESCRIPTION = ("Serve a reward model trained by `omnigym train rm` over HTTP, for --rewards rm:http://HOST:PORT:1.0 "
               "(docs/reward_service.md).")
MAX_ROWS = 65536
"""most rows in one /score request"""
MAX_REQUEST_BYTES = 64 * 1024 * 1024


@dataclass
class RewardServerArgs:
    folder: Path
    host: str
    port: int
    batch_size: int
    max_queue: int
    device: str
    api_keys: list


def parser():
    from omnigym.serve.command import _Parser

    p = _Parser(prog="omnigym serve-rm", description=DESCRIPTION)
    p.add_argument("run_dir", type=path_name, help="the run directory of `omnigym train rm` (or its model/ folder)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other "
                   "needs --api-key-env)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--batch-size", type=int, default=32,
                   help="most rows in one forward pass; waiting requests are merged up to it (default 32)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="most requests waiting to be scored; one more is answered 503 (default 64)")
    p.add_argument("--device", default="cpu", help="where the model runs: cpu (default), cuda, cuda:N")
    p.add_argument("--api-key-env", metavar="NAME", help="environment variable holding the key(s) clients must "
                   "send, comma-separated (clients set OMNIGYM_RM_API_KEY)")
    return p


def check(argv: list[str]) -> RewardServerArgs:
    """Every mistake in the flags as one line, before the model loads or the port is taken."""
    from omnigym.models.scalar_head import reward_model_folder
    from omnigym.serve.command import check_can_listen, is_loopback

    args = parser().parse_args(argv)
    for flag, value in (("--batch-size", args.batch_size), ("--max-queue", args.max_queue)):
        if value < 1:
            raise OmnigymError(f"{flag} {value}: must be at least 1")
    keys = []
    if args.api_key_env:
        keys = [k.strip() for k in os.environ.get(args.api_key_env, "").split(",") if k.strip()]
        if not keys:
            raise OmnigymError(f"--api-key-env {args.api_key_env}: that variable is not set or empty")
    if not is_loopback(args.host) and not keys:
        raise OmnigymError(f"--host {args.host} is reachable from other machines; set an API key with "
                           "--api-key-env NAME, or serve on 127.0.0.1")
    if args.device != "cpu":
        import torch

        if not args.device.startswith("cuda") or not torch.cuda.is_available():
            raise OmnigymError(f"--device {args.device}: choose cpu, or cuda where a GPU is visible")
    folder = reward_model_folder(args.run_dir)
    check_can_listen(args.host, args.port)
    return RewardServerArgs(folder, args.host, args.port, args.batch_size, args.max_queue, args.device, keys)


def model_name(folder: Path) -> str:
    """The reward model's name: its run directory's (the folder is RUN_DIR/model)."""
    return folder.parent.name if folder.name == "model" else folder.name


def make_reward_app(scorer, batch_size: int = 32, max_queue: int = 64, api_keys: list | None = None):
    """The FastAPI app over ``scorer`` (a ``RewardModelScorer``, loaded); ``app.state.worker`` is
    its batcher (stop it when the server stops)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, Field, ValidationError

    from omnigym.serve.batcher import DynamicBatcher, QueueFull
    from omnigym.serve.http import BodyTooLarge, declared_too_large, read_body, refused_key

    class Message(BaseModel):
        role: str
        content: str

    class ScoreRequest(BaseModel):
        completions: list[str] = Field(max_length=MAX_ROWS)
        # an empty conversation was transformers' ValueError, a 500
        prompts: list[Union[str, Annotated[list[Message], Field(min_length=1)]]] = Field(max_length=MAX_ROWS)

    def score_rows(completions: list, prompts: list) -> list:
        return scorer(completions, [{"prompt": prompt} for prompt in prompts]).tolist()

    scorer.batch_size = batch_size  # the scorer cuts what the batcher merged into passes of this size
    batcher = DynamicBatcher(score_rows, batch_size, max_queue)
    app = FastAPI(title="omnigym serve-rm", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.worker = batcher
    keys = list(api_keys or [])
    reward_info = {**scorer.info, **({"base_model": Path(str(scorer.info["base_model"])).name}
                                     if scorer.info.get("base_model") else {})}  # no server paths

    @app.middleware("http")
    async def key_and_size(request: Request, call_next):
        refusal = refused_key(request, keys, "Authorization")
        if refusal is not None:
            return JSONResponse({"detail": refusal}, status_code=401)
        if declared_too_large(request, MAX_REQUEST_BYTES):
            return JSONResponse({"detail": str(BodyTooLarge(MAX_REQUEST_BYTES))}, status_code=413)
        return await call_next(request)

    @app.get("/info")
    async def info():
        return {"model": model_name(scorer.folder), "reward": reward_info, "batch_size": batch_size,
                "max_queue": max_queue, "waiting": batcher.waiting(), "requests": batcher.requests,
                "rows": batcher.rows, "forward_passes": batcher.forward_passes, "batches": batcher.batches}

    @app.post("/score")
    async def score(request: Request):
        try:
            raw = await read_body(request, MAX_REQUEST_BYTES)
        except BodyTooLarge as exc:
            return JSONResponse({"detail": str(exc)}, status_code=413)
        try:
            body = ScoreRequest.model_validate_json(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            return JSONResponse({"detail": f"bad /score request: {where + ': ' if where else ''}{first['msg']} (send "
                                           '{"completions": [text], "prompts": [text or messages]})'}, status_code=400)
        if len(body.completions) != len(body.prompts):
            return JSONResponse({"detail": f"{len(body.completions)} completions but {len(body.prompts)} prompts"},
                                status_code=400)
        prompts = [p if isinstance(p, str) else [m.model_dump() for m in p] for p in body.prompts]
        try:
            scores = await batcher.score(body.completions, prompts)
        except QueueFull:
            return JSONResponse({"detail": f"the queue is full ({max_queue} requests wait); try again shortly"},
                                status_code=503)
        except OmnigymError as exc:
            return JSONResponse({"detail": str(exc)}, status_code=400)
        except Exception as exc:  # the server's fault: logged in full, one line to the client
            log.exception("scoring failed")
            return JSONResponse({"detail": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500)
        return {"scores": scores}

    return app


def serve_rm(argv: list[str]) -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise missing_extra(exc.name or "fastapi", "serve") from None
    args = check(argv)
    from omnigym.rewards.reward_model import RewardModelScorer

    # the weights now: a broken model is one line before the port opens, not at the first request
    scorer = RewardModelScorer(str(args.folder), device=args.device, batch_size=args.batch_size).load()
    app = make_reward_app(scorer, args.batch_size, args.max_queue, args.api_keys)
    address = f"[{args.host}]:{args.port}" if ":" in args.host else f"{args.host}:{args.port}"
    print(f"omnigym serve-rm: {model_name(args.folder)} on http://{address} (batch {args.batch_size}, "
          f"queue {args.max_queue}, {args.device}; {'API key required' if args.api_keys else 'loopback only'})\n"
          f"use it with: --rewards rm:http://{address}:1.0", flush=True)
    try:
        serve_in_main_thread(app, args.host, args.port)
    finally:
        app.state.worker.stop()
