"""Rollouts in the trainer's process: generate step k with the current policy, then train it."""

from __future__ import annotations

import time

from omnigym.runtime.episodes import episode_metrics


class SyncRollouts:
    def __init__(self, generator, examples_for, group_size: int):
        self.generator, self.examples_for, self.group_size = generator, examples_for, group_size
        self.samples, self.started = 0, None
        self._last: dict = {}

    def trajectories(self, step: int):
        out = self.generator.generate(self.examples_for(step), self.group_size)
        self.samples += len(out)
        # env episodes (they count turns) get the episode metrics; RLHF's plain replies do not
        self._last = episode_metrics(out.items) if out.items and "turns" in out.items[0].info else {}
        return out

    def update_weights(self, named_tensors, version: int) -> None:
        """In-process engines share the trainer's tensors: this copies nothing that is shared."""
        self.started = self.started or time.perf_counter()  # throughput counts from the first policy on
        self.generator.update_weights(named_tensors, version)

    def metrics(self) -> dict:
        return {**self._last, "perf/samples_per_second": self.samples / max(time.perf_counter() - self.started, 1e-9)}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def close(self) -> None:
        pass
