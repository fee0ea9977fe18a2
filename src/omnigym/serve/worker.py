"""The one thread that calls the hub. Every training and sampling request becomes a job on its
queue, run in the order the requests arrived (for one training client, the order of its
``seq_id``s: the SDK sends each request only after the previous one was accepted); the HTTP
handler has already answered with the job's future id. The job's outcome goes into the store,
and an ``asyncio.Event`` per future wakes a ``retrieve_future`` that is waiting for it.

The worker also owns which training runs are in the hub right now (``loaded``): a run that the
store knows but the hub does not (after a restart, or after its session expired) is created
again on first use, from its rank and seed, and given its last saved state when it has one.
When idle it expires sessions without a heartbeat and frees their runs from the hub.

Sampling jobs do not wait in that queue: each runs on a thread of its own (at most
``sampling_threads``) and blocks there while the hub's sampler batches it with the other
sampling requests in flight, so a long ``forward_backward`` of one run does not hold up any
client's sampling. A sampling job over a run's saved weights first waits for the training jobs
of that run submitted before it (a ``save_weights_for_sampler`` the client did not wait for
still comes first), parked off the threads meanwhile, so that one client's waiting requests
never take the threads other clients' sampling needs; sampling reads only saved adapters and
the frozen base, never a run's live weights, so it cannot change or see any run's training.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from omnigym.serve.contract import RequestError
from omnigym.serve.store import Store
from omnigym.serve.wire import hub_id

log = logging.getLogger("omnigym.serve")

Job = Callable[[], tuple[str, bytes]]
"""runs on the worker thread; returns (content type, body) for the future's result"""


class Worker:
    def __init__(self, hub, store: Store, session_ttl_s: float = 300.0, idle_s: float = 1.0,
                 sampling_threads: int = 64):
        self.hub = hub
        self.store = store
        self.session_ttl_s = session_ttl_s
        self.idle_s = idle_s
        self.loaded: set[str] = set()
        self._jobs: queue.Queue = queue.Queue()
        self._events: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}
        self._events_lock = threading.Lock()
        # per training run: jobs submitted and jobs run (a run's jobs run in order), for the
        # sampling jobs that must come after them
        self._submitted: Counter = Counter()
        self._ran: Counter = Counter()
        self._ran_changed = threading.Lock()
        self._parked: list[tuple[str, Job, str, int]] = []
        """sampling jobs (future id, job, run, mark) waiting until that run has run ``mark`` jobs"""
        self._sampling = ThreadPoolExecutor(sampling_threads, thread_name_prefix="omnigym-serve-sample")
        self._thread = threading.Thread(target=self._loop, name="omnigym-serve-worker", daemon=True)
        self._thread.start()

    # called from the event loop
    def _listen(self, future_id: str) -> None:
        """The event that ``wait`` on this event loop waits on until the future finishes."""
        with self._events_lock:
            self._events[future_id] = (asyncio.get_running_loop(), asyncio.Event())

    def submit(self, future_id: str, job: Job, model_id: str | None = None) -> None:
        """Queue a training job (of run ``model_id`` when given)."""
        self._listen(future_id)
        with self._ran_changed:
            if model_id is not None:
                self._submitted[model_id] += 1
        self._jobs.put((future_id, job, model_id))

    def submit_sampling(self, future_id: str, job: Job, after: str | None = None) -> None:
        """Run a sampling job beside the queue, once run ``after``'s jobs submitted so far have run."""
        self._listen(future_id)
        with self._ran_changed:
            if after is not None and self._ran[after] < self._submitted[after]:
                self._parked.append((future_id, job, after, self._submitted[after]))
                return
        self._sampling.submit(self._run, future_id, job)

    async def wait(self, future_id: str, timeout: float) -> None:
        """Returns when the future finished or ``timeout`` passed (a long poll: the SDK asks
        again at once after a "try again" reply)."""
        with self._events_lock:
            entry = self._events.get(future_id)
        if entry is None:
            return
        try:
            await asyncio.wait_for(entry[1].wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def forget(self, future_id: str) -> None:
        with self._events_lock:
            self._events.pop(future_id, None)

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=60)
        self._sampling.shutdown(wait=False, cancel_futures=True)

    # the worker thread
    def _loop(self) -> None:
        while True:
            try:
                item = self._jobs.get(timeout=self.idle_s)
            except queue.Empty:
                self._expire()
                continue
            if item is None:
                return
            future_id, job, model_id = item
            try:
                self._run(future_id, job)
            finally:
                if model_id is not None:
                    self._ran_one(model_id)
            if self._jobs.empty():
                self._expire()

    def _ran_one(self, model_id: str) -> None:
        """One more of ``model_id``'s jobs has run: start the sampling jobs that waited for it."""
        with self._ran_changed:
            self._ran[model_id] += 1
            ready = [p for p in self._parked if self._ran[p[2]] >= p[3]]
            self._parked = [p for p in self._parked if self._ran[p[2]] < p[3]]
        for future_id, job, _, _ in ready:
            self._sampling.submit(self._run, future_id, job)

    def _run(self, future_id: str | None, job: Job) -> None:
        """Run one job and put its outcome in the store (on the worker or a sampling thread)."""
        try:
            content_type, body = job()
            if future_id is not None:
                self.store.finish_future(future_id, content_type, body)
        except RequestError as exc:
            if future_id is not None:
                self.store.fail_future(future_id, str(exc), "user")
        except Exception as exc:  # the server's fault: logged in full, one line to the client
            log.exception("request %s failed", future_id)
            if future_id is not None:
                self.store.fail_future(future_id, f"internal error: {type(exc).__name__}: {exc}", "server")
        self._wake(future_id)

    def _wake(self, future_id: str) -> None:
        # popped, not kept until a retrieve: a client that never retrieves would grow the dict
        # for good (a waiter holds its event already; a later one finds the result in the store)
        with self._events_lock:
            entry = self._events.pop(future_id, None)
        if entry is not None:
            loop, event = entry
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop has closed: nobody is waiting
                pass

    def ensure_loaded(self, model_id: str) -> None:
        """On the worker thread: the run is in the hub, with its last saved state if it was
        created again."""
        if model_id in self.loaded:
            return
        rec = self.store.model(model_id)
        if rec is None:
            raise RequestError(f"unknown model id {model_id!r}", status=404)
        self.hub.create_model(hub_id(model_id), rec["rank"], rec["seed"], bool(rec["train_mlp"]),
                              bool(rec["train_attn"]), bool(rec["train_unembed"]))
        self.loaded.add(model_id)
        latest = self.store.latest_state(model_id)
        if latest is not None:
            self.hub.load(hub_id(model_id), hub_id(model_id), latest, True)

    def drop(self, model_id: str) -> None:
        if model_id in self.loaded:
            self.hub.drop(hub_id(model_id))
            self.loaded.discard(model_id)

    def free_session(self, session_id: str) -> None:
        """Queued like any job, so it runs after the session's earlier requests."""
        self._jobs.put((None, lambda: self._free(session_id), None))

    def _free(self, session_id: str):
        for model_id in self.store.session_models(session_id):
            self.drop(model_id)
        return "application/json", b"{}"

    def _expire(self) -> None:
        if self.session_ttl_s <= 0:
            return
        for session_id in self.store.expire_sessions(time.time() - self.session_ttl_s):
            log.info("session %s expired: its runs leave the hub (their records stay)", session_id)
            self._free(session_id)
