"""One engine, many episodes: coroutines ask for samples one prompt at a time; a worker
thread gathers what is waiting and makes one batched ``engine.generate`` call of it.

What crosses it::

    service = EngineService(engine)           # starts the worker thread
    samples, version = await service.sample(prompt_ids, params, n=1)
    service.update_weights(named_tensors, version)   # between two batches, never inside one
    service.close()

Episodes that run independently (an agent's requests through the OpenAI-compatible
endpoint, a multi-turn env whose tool replies take their own time) still share the
engine's batches: a request waits at most ``gather_seconds`` for others to join it. The
engine is only ever called from the worker thread, so an engine that is not thread-safe
(every in-process one) needs nothing more. ``version`` is the policy version that sampled
the batch (``engine.version`` at that moment): an episode whose turns straddle a weight
update knows which tokens came from which policy.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass
from typing import Iterable

from omnigym.inference.engine import Sample, SamplingParams


@dataclass
class _Request:
    prompt_ids: list[int]
    n: int
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


_STOP = object()


class EngineService:
    def __init__(self, engine, max_batch: int = 256, gather_seconds: float = 0.002):
        """``max_batch``: prompts (times their ``n``) in one engine call at most;
        ``gather_seconds``: how long the first waiting request waits for others to join."""
        self.engine, self.max_batch, self.gather_seconds = engine, max_batch, gather_seconds
        self._queue: queue.Queue = queue.Queue()
        self._engine_lock = threading.Lock()  # a weight update waits for the batch in flight
        self.calls = self.prompts = 0
        """engine calls made and prompts sampled (metrics: prompts per call is the batching achieved)"""
        self._thread = threading.Thread(target=self._work, name="omnigym-engine", daemon=True)
        self._thread.start()

    @property
    def version(self) -> int:
        return self.engine.version

    async def sample(self, prompt_ids: list[int], params: SamplingParams, n: int = 1) -> tuple[list[Sample], int]:
        """``n`` samples of ``prompt_ids`` and the policy version that made them."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put(_Request(list(prompt_ids), n, params, loop, future))
        return await future

    def update_weights(self, named_tensors: Iterable, version: int) -> None:
        with self._engine_lock:
            self.engine.update_weights(named_tensors, version)

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    def _work(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            for batch in self._batches(self._gather(first)):
                self._run(batch)

    def _gather(self, first: _Request) -> list[_Request]:
        """``first`` and whatever arrives within ``gather_seconds`` (up to ``max_batch`` rows)."""
        waiting, rows = [first], first.n
        deadline = time.monotonic() + self.gather_seconds
        while rows < self.max_batch:
            try:
                request = self._queue.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                break
            if request is _STOP:  # finish what was asked, then stop
                self._queue.put(_STOP)
                break
            waiting.append(request)
            rows += request.n
        return waiting

    @staticmethod
    def _batches(requests: list[_Request]) -> list[list[_Request]]:
        """One engine call takes one ``n`` and one ``params``: requests are grouped by them."""
        groups: dict = {}
        for request in requests:
            groups.setdefault((request.n, repr(request.params)), []).append(request)
        return list(groups.values())

    def _run(self, batch: list[_Request]) -> None:
        live = [r for r in batch if not r.future.cancelled()]  # an episode that timed out stopped waiting
        if not live:
            return
        try:
            with self._engine_lock:
                samples = self.engine.generate([r.prompt_ids for r in live], live[0].n, live[0].params)
                version = self.engine.version
        except BaseException as exc:  # every waiting episode hears of it; the worker goes on
            for request in live:
                request.loop.call_soon_threadsafe(_settle, request.future, None, exc)
            return
        self.calls += 1
        self.prompts += len(live)
        for request, group in zip(live, samples):
            request.loop.call_soon_threadsafe(_settle, request.future, (group, version), None)


def _settle(future: asyncio.Future, result, exc) -> None:
    if future.done():  # cancelled meanwhile
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)
