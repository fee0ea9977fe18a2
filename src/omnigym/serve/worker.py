"""The threads that call the hub for training. Every training and sampling request becomes a
job; the HTTP handler has already answered with the job's future id. The job's outcome goes into
the store, and an ``asyncio.Event`` per future wakes a ``retrieve_future`` that is waiting for it.

Training jobs run in the order they arrived for each run (for one training client, the order of
its ``seq_id``s: the SDK sends each request only after the previous one was accepted), on
``training_threads`` threads. A run's jobs (forward_backward, forward, optim_step, the saves)
touch its own adapter and its own model over the shared frozen weights (``backends/lora.py``),
so jobs of different runs run side by side: two runs' forward_backward on two cores, and a
client whose step just ended saves and samples while other runs train. Before, one thread ran
every job in arrival order: each client's save waited behind every forward_backward queued
before it, so the clients' loops moved in step and sampling and training took turns instead of
overlapping. Jobs that add or remove runs (create_model, load_state, a session's end, expiry,
and any job of a run the hub does not hold yet) run alone: nothing else runs beside them, and
no job that arrived after one starts before it.

A run's numbers do not depend on this: its jobs run in its order on its own tensors, whatever
runs beside them.

The worker also owns which training runs are in the hub right now (``loaded``): a run that the
store knows but the hub does not (after a restart, or after its session expired) is created
again on first use, from its rank and seed, and given its last saved state when it has one.
It expires sessions without a heartbeat and frees their runs from the hub: when idle, and on
a server that is never idle (other clients training), through a job queued to run alone once
such a session is found (checked at most every ``expiry_check_s``). Before, a silent session
expired only on an idle worker, so on a busy one its runs stayed in memory and counted against
``--max-runs`` for as long as the others kept training.

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
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from omnigym.serve.contract import RequestError
from omnigym.serve.store import Store
from omnigym.serve.wire import hub_id

log = logging.getLogger("omnigym.serve")

Job = Callable[[], tuple[str, bytes]]
"""runs on a worker thread; returns (content type, body) for the future's result"""


@dataclass
class _Queued:
    future_id: str | None
    job: Job | None  # None: the worker stops
    model_id: str | None
    alone: bool  # adds or removes runs: runs with nothing beside it


class Worker:
    def __init__(self, hub, store: Store, session_ttl_s: float = 300.0, idle_s: float = 1.0,
                 sampling_threads: int = 64, training_threads: int = 3):
        self.hub = hub
        self.store = store
        self.session_ttl_s = session_ttl_s
        self.idle_s = idle_s
        self.loaded: set[str] = set()
        self._events: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}
        self._events_lock = threading.Lock()
        # the training queue, in arrival order, and what runs now (all under _turn)
        self._turn = threading.Condition()
        self._queued: list[_Queued] = []
        self._running_runs: Counter = Counter()
        self._running = 0
        self._alone = False
        self._home: dict[str, int] = {}
        """the thread that last ran each run's job: the run's next job waits for it while it is idle"""
        self._idle_threads: set[int] = set()
        self._stopping = False
        # per training run: jobs submitted and jobs run (a run's jobs run in order), for the
        # sampling jobs that must come after them
        self._submitted: Counter = Counter()
        self._ran: Counter = Counter()
        self._ran_changed = threading.Lock()
        self._parked: list[tuple[str, Job, str, int]] = []
        """sampling jobs (future id, job, run, mark) waiting until that run has run ``mark`` jobs"""
        # expiry on a worker that is never idle (``_queue_expiry_if_due``)
        self.expiry_check_s = min(max(session_ttl_s / 10, idle_s), 30.0)
        self._expiry_due = time.monotonic() + self.expiry_check_s
        self._expiry_queued = False
        self._sampling = ThreadPoolExecutor(sampling_threads, thread_name_prefix="omnigym-serve-sample")
        self._threads = [threading.Thread(target=self._loop, args=(i,), name=f"omnigym-serve-train-{i}", daemon=True)
                         for i in range(max(1, training_threads))]
        for thread in self._threads:
            thread.start()

    # called from the event loop
    def _listen(self, future_id: str) -> None:
        """The event that ``wait`` on this event loop waits on until the future finishes."""
        with self._events_lock:
            self._events[future_id] = (asyncio.get_running_loop(), asyncio.Event())

    def submit(self, future_id: str, job: Job, model_id: str | None = None, alone: bool = False) -> None:
        """Queue a training job (of run ``model_id`` when given; ``alone``: it adds or removes runs)."""
        self._listen(future_id)
        with self._ran_changed:
            if model_id is not None:
                self._submitted[model_id] += 1
        self._put(_Queued(future_id, job, model_id, alone))

    def _put(self, item: _Queued) -> None:
        with self._turn:
            self._queued.append(item)
            self._turn.notify_all()

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
        """Runs the jobs queued so far, then ends the threads."""
        self._put(_Queued(None, None, None, True))
        deadline = time.monotonic() + 60
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._sampling.shutdown(wait=False, cancel_futures=True)

    # the training threads
    def _next(self, thread: int) -> _Queued | None:
        """Under ``_turn``: the oldest queued job that may start now on ``thread``, taken off the
        queue. A run's job is left to the thread that ran the run's last job while that thread is
        idle: a forward_backward on a thread other than the last one's took about 15% longer
        (SmolLM2-135M, one client, the same work), as each thread's memory is its own."""
        if self._alone:
            return None
        waiting: set[str | None] = set()  # runs with an older job still queued
        for index, item in enumerate(self._queued):
            # creating a run the hub does not hold (or a job of no run) changes the hub
            item.alone = item.alone or item.model_id not in self.loaded
            if item.alone:
                if index > 0 or self._running:
                    return None  # nothing that came after it starts before it
                self._alone = True
            elif item.model_id in waiting or self._running_runs[item.model_id] or \
                    self._home.get(item.model_id, thread) != thread and self._home[item.model_id] in self._idle_threads:
                waiting.add(item.model_id)
                continue
            else:
                self._home[item.model_id] = thread
            del self._queued[index]
            self._running += 1
            self._running_runs[item.model_id] += 1
            return item
        return None

    def _loop(self, thread: int) -> None:
        while True:
            with self._turn:
                item = None
                self._idle_threads.add(thread)
                while item is None and not self._stopping:
                    item = self._next(thread)
                    if item is None and not self._turn.wait(self.idle_s) and self._idle():
                        self._alone = True
                        break
                self._idle_threads.discard(thread)
                # a job another idle thread left for this one (its run's last thread) may be theirs now
                self._turn.notify_all()
            if self._stopping:
                return
            if item is None:  # idle for idle_s: nothing queued or running
                self._expire_alone()
                continue
            if item.job is None:  # stop(): every job queued before it has run
                with self._turn:
                    self._stopping = True
                    self._turn.notify_all()
                return
            try:
                self._run(item.future_id, item.job)
            finally:
                if item.model_id is not None:
                    self._ran_one(item.model_id)
                with self._turn:
                    self._running -= 1
                    self._running_runs[item.model_id] -= 1
                    if not self._running_runs[item.model_id]:
                        del self._running_runs[item.model_id]
                    if item.alone:
                        self._alone = False
                    now_idle = self._idle()
                    if now_idle:
                        self._alone = True  # the expiry below runs alone
                    self._turn.notify_all()
                if now_idle:
                    self._expire_alone()
                else:
                    self._queue_expiry_if_due()

    def _idle(self) -> bool:
        return not self._queued and not self._running and not self._alone

    def _expire_alone(self) -> None:
        """Expiry frees runs from the hub: it runs alone (``_alone`` set by the caller)."""
        try:
            self.expire_silent_sessions()
        finally:
            with self._turn:
                self._alone = False
                self._turn.notify_all()

    def _queue_expiry_if_due(self) -> None:
        """On a worker busy for ``expiry_check_s`` or more: a session silent past its ttl has its
        expiry queued as a job that runs alone (it frees runs from the hub), behind the jobs
        queued now. The store is read at most every ``expiry_check_s``, and the job is queued
        only when there is something to expire: a busy server does not stop for nothing."""
        with self._turn:
            now = time.monotonic()
            if self.session_ttl_s <= 0 or self._expiry_queued or now < self._expiry_due:
                return
            self._expiry_due = now + self.expiry_check_s
        if not self.store.silent_sessions(time.time() - self.session_ttl_s):
            return
        with self._turn:
            self._expiry_queued = True
            self._queued.append(_Queued(None, self._expire_job, None, True))
            self._turn.notify_all()

    def _expire_job(self) -> tuple[str, bytes]:
        try:
            self.expire_silent_sessions()
        finally:
            with self._turn:
                self._expiry_queued = False
        return "application/json", b"{}"

    def _ran_one(self, model_id: str) -> None:
        """One more of ``model_id``'s jobs has run: start the sampling jobs that waited for it."""
        with self._ran_changed:
            self._ran[model_id] += 1
            ready = [p for p in self._parked if self._ran[p[2]] >= p[3]]
            self._parked = [p for p in self._parked if self._ran[p[2]] < p[3]]
            if self._ran[model_id] == self._submitted[model_id] and all(p[2] != model_id for p in self._parked):
                # all caught up: both counts start again from 0 (kept, they grew by a run ever made)
                del self._ran[model_id], self._submitted[model_id]
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
        """In a job that runs alone (a run not loaded makes its job one): the run is in the hub,
        with its last saved state if it was created again."""
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
            with self._turn:
                self._home.pop(model_id, None)

    def free_session(self, session_id: str) -> None:
        """Queued to run alone, so it runs after the session's earlier requests."""
        self._put(_Queued(None, lambda: self._free(session_id), None, True))

    def _free(self, session_id: str):
        for model_id in self.store.session_models(session_id):
            self.drop(model_id)
        return "application/json", b"{}"

    def expire_silent_sessions(self) -> None:
        """Where nothing else runs: sessions silent past the ttl expire and their runs leave the hub."""
        if self.session_ttl_s <= 0:
            return
        for session_id in self.store.expire_sessions(time.time() - self.session_ttl_s):
            log.info("session %s expired: its runs leave the hub (their records stay)", session_id)
            self._free(session_id)
