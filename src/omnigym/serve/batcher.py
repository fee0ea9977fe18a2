"""A dynamic batcher: one scoring thread drains a bounded queue of requests, merging the
requests waiting at that moment into one call of up to ``batch_size`` rows.

Requests arrive from HTTP handlers on the event loop (``submit`` never blocks: a full queue is
``QueueFull`` at once, which the server answers with 503). While the thread scores one batch,
the requests that arrive wait in the queue, so the busier the server, the fuller its batches;
an idle server scores a lone request at once, without waiting for company. A request larger
than ``batch_size`` is scored alone (the score function cuts it into passes of ``batch_size``).
If a merged batch fails, its requests are scored again one by one, so a request that cannot be
scored fails alone and the others still get their scores.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger("omnigym.serve")

ScoreRows = Callable[[list, list], list]
"""(completions, prompts) -> one float per row, computed in passes of at most batch_size rows"""


class QueueFull(Exception):
    """The queue holds ``max_queue`` requests already."""


@dataclass
class _Request:
    completions: list
    prompts: list
    done: Future = field(default_factory=Future)


class DynamicBatcher:
    def __init__(self, score_rows: ScoreRows, batch_size: int, max_queue: int):
        self.score_rows, self.batch_size, self.max_queue = score_rows, batch_size, max_queue
        self.requests = self.rows = self.forward_passes = self.batches = 0
        """counted as scored: the requests, their rows, the passes of ``batch_size`` rows, the merged calls"""
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._carried: _Request | None = None  # taken from the queue but did not fit the last batch
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="omnigym-rm-batcher", daemon=True)
        self._thread.start()

    def submit(self, completions: list, prompts: list) -> Future:
        """The future of this request's scores; ``QueueFull`` when ``max_queue`` requests wait."""
        request = _Request(completions, prompts)
        try:
            self._queue.put_nowait(request)
        except queue.Full:
            raise QueueFull from None
        return request.done

    async def score(self, completions: list, prompts: list) -> list:
        """``submit``, awaited on the caller's event loop (the loop serves other requests meanwhile)."""
        return await asyncio.wrap_future(self.submit(completions, prompts))

    def waiting(self) -> int:
        return self._queue.qsize()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=60)

    # the scoring thread
    def _loop(self) -> None:
        while not self._stopping.is_set():
            batch = self._next_batch()
            if batch:
                self._score(batch)
        for request in self._leftovers():
            if request.done.running() or request.done.set_running_or_notify_cancel():
                request.done.set_exception(RuntimeError("the reward server is shutting down"))

    def _next_batch(self) -> list[_Request]:
        """The carried request or the next one (waiting briefly), then every waiting request
        that still fits in ``batch_size`` rows."""
        first, self._carried = self._carried, None
        if first is None:
            first = self._take(timeout=0.2)  # wakes now and then to see whether to stop
            if first is None:
                return []
        batch, rows = [first], len(first.completions)
        while rows < self.batch_size:
            request = self._take(timeout=None)
            if request is None:
                break
            if rows + len(request.completions) > self.batch_size:
                self._carried = request
                break
            batch.append(request)
            rows += len(request.completions)
        return batch

    def _score(self, batch: list[_Request]) -> None:
        completions = [c for request in batch for c in request.completions]
        prompts = [p for request in batch for p in request.prompts]
        try:
            scores = self.score_rows(completions, prompts)
            if len(scores) != len(completions):
                raise RuntimeError(f"the score function gave {len(scores)} scores for {len(completions)} rows")
        except Exception as exc:  # handed to the request's caller, who answers it
            if len(batch) == 1:
                batch[0].done.set_exception(exc)
            else:  # one request's rows may be the cause: each alone finds which
                for request in batch:
                    self._score([request])
            return
        self.requests += len(batch)
        self.rows += len(completions)
        self.forward_passes += math.ceil(len(completions) / self.batch_size)
        self.batches += 1
        start = 0
        for request in batch:
            request.done.set_result(list(scores[start:start + len(request.completions)]))
            start += len(request.completions)

    def _take(self, timeout: float | None) -> _Request | None:
        """The next waiting request whose caller is still there (None: none waits), marked
        running: from here on it cannot be cancelled, and its future takes the scores."""
        while True:
            try:
                request = self._queue.get(timeout=timeout) if timeout else self._queue.get_nowait()
            except queue.Empty:
                return None
            if request.done.set_running_or_notify_cancel():
                return request

    def _leftovers(self) -> list[_Request]:
        left = [self._carried] if self._carried else []
        while True:
            try:
                left.append(self._queue.get_nowait())
            except queue.Empty:
                return left
