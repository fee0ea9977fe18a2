"""How many training runs ``omnigym serve`` holds in its hub at once (``--max-runs``). Each is
a LoRA adapter with its Adam state; without a cap, sessions that create runs, or that touch the
runs of ended sessions (loaded again on use, and never expired again), fill memory."""

from __future__ import annotations

import time

from omnigym.serve.contract import RequestError


class RunCap:
    def __init__(self, store, worker, max_runs: int, session_ttl_s: float):
        self.store, self.worker, self.max_runs, self.session_ttl_s = store, worker, max_runs, session_ttl_s

    def ended(self, model_ids) -> list[str]:
        """The runs among ``model_ids`` whose session has ended (finished, expired, or silent past
        the ttl: expiry, due, frees it before a new run is refused)."""
        silent_since = time.time() - self.session_ttl_s if self.session_ttl_s > 0 else float("-inf")
        out = []
        for model_id in model_ids:
            session = self.store.session(self.store.model(model_id)["session"])
            if session is None or session["expired"] or session["last_seen"] < silent_since:
                out.append(model_id)
        return out

    def full(self) -> RequestError:
        return RequestError(f"the server holds {self.max_runs} training runs already (its --max-runs); "
                            "close a ServiceClient (its session ends) or wait for a silent one to expire "
                            f"({self.session_ttl_s:.0f} s without a heartbeat)")

    def ensure(self, model_id: str) -> None:
        """On the worker thread: the run in the hub, within the cap. Runs of ended sessions are
        what expiry frees anyway, so they make room first (one used again after its session
        ended is loaded again, and is the first to go)."""
        loaded = self.worker.loaded
        if model_id not in loaded and len(loaded) >= self.max_runs:
            # sessions silent past the ttl that a busy worker has not expired yet
            self.worker.expire_silent_sessions()
            for other in self.ended(list(loaded)):
                self.worker.drop(other)
            if len(loaded) >= self.max_runs:
                raise self.full()
        self.worker.ensure_loaded(model_id)

    def check_room(self) -> None:
        """At the door, before a new run is recorded: refused now rather than listed as a run
        whose creation then failed (``ensure`` stays the rule; this only reads)."""
        loaded = self.worker.loaded.copy()  # one C call: the worker thread may change the set
        if len(loaded) >= self.max_runs and not self.ended(loaded):
            raise self.full()
