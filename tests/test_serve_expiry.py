"""Sessions that go silent on a server that is never idle: their runs leave the hub anyway.

Expiry used to run only when the worker had nothing queued or running for a moment. Two
clients whose requests overlap keep it busy for good, and a third client that vanished kept its
runs in memory, counted against ``--max-runs``, for as long as they trained."""

import asyncio
import time

import pytest

from omnigym.serve.contract import RequestError
from omnigym.serve.runcap import RunCap
from omnigym.serve.store import Store
from omnigym.serve.wire import hub_id
from omnigym.serve.worker import Worker


class Hub:
    def __init__(self):
        self.dropped = []

    def drop(self, run):
        self.dropped.append(run)


def test_a_silent_session_expires_while_other_runs_keep_the_worker_busy(tmp_path):
    store = Store(tmp_path / "serve.db")
    for session in ("busy", "gone"):
        store.add_session(session, "alice")
    store.add_model("gone:train:0", "gone", "alice", "base", 2, 0, True, True, False)
    hub, ran, jobs = Hub(), [], 150
    worker = Worker(hub, store, session_ttl_s=0.5, idle_s=0.2)
    worker.loaded |= {"busy:train:0", "busy:train:1", "gone:train:0"}

    def job():
        store.touch_session("busy")
        time.sleep(0.02)
        ran.append(bool(hub.dropped))
        return "x", b""

    async def scenario():  # futures wake waiters on the server's event loop
        # two clients with two requests in flight each, as an SDK loop pipelines them, for well
        # past the ttl: whenever a job ends, another of the same run is queued, so the worker is
        # never idle
        sent = 0
        while len(ran) < 2 * jobs:
            while sent < min(2 * jobs, len(ran) + 4):
                run = ("busy:train:0", "busy:train:1")[sent % 2]
                worker.submit(f"{run}-{sent}", job, model_id=run)
                sent += 1
            await asyncio.sleep(0.002)

    try:
        asyncio.run(scenario())
    finally:
        worker.stop()
    assert hub.dropped == [hub_id("gone:train:0")], "the silent session's run stayed in the hub while others trained"
    assert ran.index(True) < jobs, "expired only once the work ended"  # 2 x 150 jobs of 20 ms on 2 threads: 3 s
    assert "gone:train:0" not in worker.loaded and store.session("gone")["expired"]
    assert not store.session("busy")["expired"] and {"busy:train:0", "busy:train:1"} <= worker.loaded
    # every job has run: the per-run counts the sampling order needs are not kept for good
    assert not worker._submitted and not worker._ran


class CapWorker:
    """The part of the worker ``RunCap`` uses, over a real store."""

    def __init__(self, store, ttl):
        self.store, self.ttl, self.loaded = store, ttl, set()

    def expire_silent_sessions(self):
        for session in self.store.expire_sessions(time.time() - self.ttl):
            self.loaded -= set(self.store.session_models(session))

    def drop(self, model_id):
        self.loaded.discard(model_id)

    def ensure_loaded(self, model_id):
        self.loaded.add(model_id)


def test_a_run_of_a_session_silent_past_its_ttl_makes_room_before_expiry_ran(tmp_path):
    """``--max-runs`` full of a silent session's runs that the busy worker has not expired yet: a
    live client's new run is let in, not refused with "wait for a silent one to expire"."""
    store = Store(tmp_path / "serve.db")
    worker = CapWorker(store, ttl=0.3)
    cap = RunCap(store, worker, max_runs=1, session_ttl_s=0.3)
    for session in ("gone", "live"):
        store.add_session(session, "alice")
        store.add_model(f"{session}:train:0", session, "alice", "base", 2, 0, True, True, False)
    cap.ensure("gone:train:0")
    with pytest.raises(RequestError, match="--max-runs"):  # the cap is full of a live session's run
        cap.check_room()
    time.sleep(0.4)  # "gone" is silent past its ttl; nothing has expired it
    store.touch_session("live")
    assert not store.session("gone")["expired"]
    cap.check_room()  # at the door: room, since the silent session's run will go
    cap.ensure("live:train:0")
    assert worker.loaded == {"live:train:0"} and store.session("gone")["expired"]
