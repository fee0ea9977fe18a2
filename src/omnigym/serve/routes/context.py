"""What every route of ``omnigym serve`` shares: the hub, the store, the worker and the limits,
who the caller is, and the checks that a run, session, sampler or checkpoint is the caller's.

A request naming someone else's thing gets the same 404 as one naming nothing, so it learns
nothing; owners are compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from omnigym.serve import bodies, wire
from omnigym.serve.contract import RequestError
from omnigym.serve.http import BodyTooLarge, presented_key, read_body, refused_key
from omnigym.serve.runcap import RunCap
from omnigym.serve.store import Store, as_json
from omnigym.serve.worker import Worker

PROTO = "application/x-protobuf"
"""forward_backward's body and the binary results (forward_backward's, asample's)"""
KEY_HEADER = "X-API-Key"
"""where the tinker SDK sends its API key"""


def served(request) -> "ServeContext":
    """The server a request came to (``make_app`` puts it on the app's state)."""
    return request.app.state.serve


class ServeContext:
    def __init__(self, hub, store: Store, keys: list[str], limits):
        self.hub, self.store, self.keys, self.limits = hub, store, keys, limits
        self.worker = Worker(hub, store, session_ttl_s=limits.session_ttl_s)
        self.cap = RunCap(store, self.worker, limits.max_runs, limits.session_ttl_s)
        base = Path(hub.base_model)
        self.base_names = {os.path.normpath(n) for n in (hub.base_model, base.name, str(base.resolve()))}
        # the folder by its absolute path: a client started in another directory loads the same tokenizer
        self.tokenizer_id = str(base.resolve()) if base.is_dir() else hub.base_model

    # -- who asks ------------------------------------------------------------------------------
    def caller(self, request) -> str:
        """The API key's digest: who this request acts for. Without keys configured, the key
        the SDK sends anyway names the caller."""
        refusal = refused_key(request, self.keys, KEY_HEADER)
        if refusal is not None:
            raise RequestError(refusal, status=401)
        return hashlib.sha256(presented_key(request, KEY_HEADER).encode()).hexdigest()[:32]

    async def read(self, request) -> bytes:
        """The body, refused once it passes the limit (a chunked body has no length to check)."""
        try:
            return await read_body(request, self.limits.max_request_bytes)
        except BodyTooLarge as exc:
            raise RequestError(str(exc), status=413) from None

    async def body_of(self, request) -> dict:
        return bodies.parse_json(await self.read(request))

    # -- what is theirs ------------------------------------------------------------------------
    @staticmethod
    def _theirs(rec: dict | None, owner: str, unknown: str) -> dict:
        """``rec`` when ``owner`` owns it; otherwise a 404 that says no more than ``unknown``
        (another caller's record and no record read the same)."""
        if rec is None or not hmac.compare_digest(rec["owner"], owner):
            raise RequestError(unknown, status=404)
        return rec

    def owned_model(self, owner: str, model_id) -> dict:
        return self._theirs(self.store.model(wire.check_model_id(model_id)), owner, f"unknown model id {model_id!r}")

    def owned_session(self, owner: str, session_id, live: bool = True) -> dict:
        rec = self._theirs(self.store.session(session_id) if isinstance(session_id, str) and len(session_id) <= 64
                           else None, owner, f"unknown session {str(session_id)[:80]!r}")
        if live and rec["expired"]:
            raise RequestError(f"session {session_id} has expired (no heartbeat for "
                               f"{self.limits.session_ttl_s:.0f} s); start a new ServiceClient", status=410)
        return rec

    def owned_sampler(self, owner: str, sampler_id) -> dict:
        return self._theirs(self.store.sampler(sampler_id) if isinstance(sampler_id, str) and len(sampler_id) <= 100
                            else None, owner, f"unknown sampling session {str(sampler_id)[:80]!r}")

    def owned_checkpoint(self, owner: str, path, kind: str | None = None) -> wire.TinkerPath:
        parsed = wire.parse_path(path)
        if kind is not None and parsed.kind != kind:
            want = "sampler_weights" if kind == "sampler" else "weights"
            raise RequestError(f"{path} is not a {want} path (tinker://MODEL_ID/{want}/NAME)")
        self.owned_model(owner, parsed.model_id)
        if self.store.checkpoint(parsed.model_id, parsed.kind, parsed.name) is None:
            raise RequestError(f"no checkpoint {path}", status=404)
        return parsed

    def owned_future(self, owner: str, future_id) -> dict:
        return self._theirs(self.store.future(future_id) if isinstance(future_id, str) and len(future_id) <= 64
                            else None, owner, f"unknown future {str(future_id)[:80]!r}")

    # -- checks --------------------------------------------------------------------------------
    def check_base(self, name) -> None:
        # compared as written, up to normpath ("dir/", "a//b", "a/../b"): the name is never
        # looked up on the server's disk
        if not isinstance(name, str) or "\x00" in name or os.path.normpath(name) not in self.base_names:
            raise RequestError(f"this server serves one base model, {self.hub.base_model!r}; got {str(name)[:120]!r}")

    def check_case(self, model_id: str, kind: str, name: str) -> None:
        """A name that differs from a saved one only in case would be the same folder on a
        case-insensitive disk (macOS, Windows): saving it would overwrite the other in silence."""
        for c in self.store.checkpoints(model_id):
            if c["kind"] == kind and c["name"] != name and c["name"].lower() == name.lower():
                raise RequestError(f"checkpoint name {name!r} differs from the saved {c['name']!r} only in case; "
                                   "pick another name")

    # -- the queue -----------------------------------------------------------------------------
    def queue(self, owner: str, model_id: str | None, seq_id, job, request: bytes | dict = b"",
              sampling: bool = False, after: str | None = None, alone: bool = False) -> dict:
        """Records a future, queues its job, and returns the SDK's untyped future; a training
        request sent again with the same seq_id (a retry) gets the first one's future. The
        request's own bytes are part of that key: another request that reuses a seq_id (a
        client's mistake, a raw call beside the SDK's) runs as itself, and does not get the
        first one's result in silence. A ``sampling`` job runs beside the training queue, after
        run ``after``'s jobs queued so far; an ``alone`` job runs with no other training job beside it
        (worker.py)."""
        if seq_id is not None and (isinstance(seq_id, bool) or not isinstance(seq_id, int)
                                   or not -1 <= seq_id < bodies.INT64):  # "abc" or 2**70 went unchecked
            raise RequestError(f"seq_id must be a whole number from -1 to 2**63 - 1, got {str(seq_id)[:40]!r}")
        seq_key = None
        if model_id is not None and isinstance(seq_id, int):
            digest = hashlib.sha256(request if isinstance(request, bytes) else as_json(request)).hexdigest()[:32]
            seq_key = f"{model_id}#{seq_id}#{digest}"
        fresh = "f-" + secrets.token_urlsafe(12)
        future_id = self.store.add_future(fresh, owner, model_id, seq_key)
        if future_id == fresh:
            if sampling:
                self.worker.submit_sampling(future_id, job, after)
            else:
                self.worker.submit(future_id, job, model_id, alone)
        return {"request_id": future_id, "model_id": model_id}


def json_job(fn):
    """A worker job whose result goes back as JSON."""
    return lambda: ("application/json", as_json(fn()))
