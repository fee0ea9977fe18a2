"""EngineService batches concurrent episodes' requests; stitch joins an episode's turns."""

import asyncio
import threading

import pytest

from omnigym.generators.turns import Turn, stitch
from omnigym.inference.engine import Sample, SamplingParams
from omnigym.inference.service import EngineService


class CountingEngine:
    """Answers each prompt with its length; records the batch sizes it was called with."""

    def __init__(self, fail_on=None):
        self.version, self.batches, self.fail_on = 0, [], fail_on
        self.thread_ids = set()

    def generate(self, prompts, n, params):
        self.thread_ids.add(threading.get_ident())
        self.batches.append(len(prompts))
        if self.fail_on is not None and any(self.fail_on in p for p in prompts):
            raise RuntimeError("engine failed")
        return [[Sample(p, [len(p)], [-0.5], True) for _ in range(n)] for p in prompts]

    def update_weights(self, named_tensors, version):
        self.version = version


def test_concurrent_requests_share_batches_and_come_back_to_their_caller():
    engine = CountingEngine()
    service = EngineService(engine, gather_seconds=0.05)

    async def main():
        return await asyncio.gather(*[service.sample(list(range(k)), SamplingParams()) for k in range(1, 21)])

    try:
        results = asyncio.run(main())
    finally:
        service.close()
    assert [samples[0].completion_ids for samples, _ in results] == [[k] for k in range(1, 21)]
    assert sum(engine.batches) == 20 and len(engine.batches) < 20  # batched, not one call each
    assert engine.thread_ids and threading.get_ident() not in engine.thread_ids


def test_an_engine_error_reaches_the_waiting_episodes_and_the_service_goes_on():
    engine = CountingEngine(fail_on=99)
    service = EngineService(engine, gather_seconds=0.0)

    async def main():
        with pytest.raises(RuntimeError, match="engine failed"):
            await service.sample([99], SamplingParams())
        service.update_weights([], 3)
        return await service.sample([1, 2], SamplingParams(), n=2)

    try:
        samples, version = asyncio.run(main())
    finally:
        service.close()
    assert [s.completion_ids for s in samples] == [[2], [2]] and version == 3


def test_stitch_masks_inserted_tokens_and_splits_where_history_was_rewritten():
    turns = [Turn([1, 2], [3, 4], [-0.1, -0.2], 0),
             Turn([1, 2, 3, 4, 9, 9], [5], [-0.3], 1),      # continues: 9 9 inserted by the env
             Turn([1, 7], [8], [-0.4], 1)]                  # rewrote the history: a new sequence
    first, second = stitch(turns)
    assert first.prompt_ids == [1, 2] and first.response_ids == [3, 4, 9, 9, 5]
    assert first.loss_mask == [1, 1, 0, 0, 1] and first.logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3]
    assert first.versions == [0, 0, -1, -1, 1] and first.oldest_version() == 0 and first.turns == 2
    assert second.prompt_ids == [1, 7] and second.response_ids == [8] and second.loss_mask == [1]
