"""Rollouts that do not wait (``--rollouts async``): every episode runs on its own, and a step
trains on the first groups that are complete.

What crosses it: the ``Rollouts`` contract of ``runtime/__init__.py`` (``trajectories(step)``,
``update_weights``, ``metrics``, ``state_dict``, ``close``), over any episode source with
``async def play(example, group_id) -> list[Trajectory]`` and ``update_weights``.

How it runs. An asyncio loop in a thread of its own keeps up to ``concurrency`` episodes in
flight; when one ends, the next starts at once (the next episode of the group being filled,
else the first of the next prompt's group), so one slow episode (a long tool call, many
turns) holds up nobody but itself. The episodes' model calls meet in an ``EngineService``,
whose worker thread batches whatever is waiting into one engine call, on the sampler's own
copy of the policy: sampling goes on while the trainer trains. After each step the trainer's
weights are copied in (``update_weights``, between two engine batches), so episodes in
flight continue with the new policy: a partial rollout, whose tokens carry the version that
sampled each of them.

What a step trains on. ``trajectories(step)`` takes finished groups in the order they
finished and drops:
- a group with a token sampled more than ``max_staleness`` versions before ``step``
  (``step - version > K``): never trained on, whatever else happens;
- a group with an episode that failed (``info["error"]``);
- with ``dynamic_sampling`` (DAPO), a group whose rewards are all equal (no signal), taking
  the next finished group in its place, until the batch has ``prompts_per_step`` groups or
  ``max_refill_factor x prompts_per_step`` groups were drawn; then the batch is topped up with
  the zero-variance groups drawn (the trainer skips them), so a step always has a batch.
The correction for the tokens a stale policy sampled is the trainer's: the behaviour
log-probs travel with each trajectory (``behaviour_cap``, truncated importance sampling).

Admission: no new group starts while ``prompts_per_step x (max_staleness + 1)`` groups are
started and not yet taken by a step, so the sampler never runs further ahead of the trainer
than the staleness bound can use.

Resume: the checkpoint holds how many groups the steps have taken; a resumed run starts the
prompt stream there. Groups that were in flight or finished but not taken are dropped (their
prompts are not replayed), and the sampler's RNG is not restored: a resumed async run is
not bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import asyncio
import math
import queue
import threading
import time
from dataclasses import dataclass

from omnigym.config import require_non_negative, require_positive
from omnigym.errors import OmnigymError, require
from omnigym.generators.base import Trajectories

ROLLOUTS = ("sync", "async")


@dataclass
class EpisodeScheduleConfig:
    """How a language run's episodes are scheduled and budgeted (``--rollouts``)."""

    rollouts: str = "sync"
    """sync: a step's episodes advance turn by turn together and the step waits for the slowest; async:
    each episode runs on its own (a finished one makes room for the next prompt's), sampled by a copy of the
    policy in a thread while the trainer trains, trained on within --max-staleness versions (docs/agents.md)"""
    concurrency: int = 0
    """with --rollouts async: episodes in flight at once (0: --prompts-per-step x --group-size)"""
    dynamic_sampling: bool = False
    """with --rollouts async: DAPO's dynamic sampling, groups whose rewards are all equal are dropped and
    the batch is refilled with the next finished groups, up to --max-refill-factor"""
    max_refill_factor: float = 3.0
    """with --dynamic-sampling: a step draws at most this many times --prompts-per-step groups, then
    trains on what it has"""
    max_episode_tokens: int = 0
    """tokens the model may generate over a whole episode (its reply is cut there; an episode without a
    final reply by then is truncated, reward 0); 0: no limit beyond --max-new-tokens per turn"""
    overlong_buffer: int = 0
    """DAPO's soft overlong penalty: an episode that generates more than (limit - this) tokens loses up to
    1 reward, linearly (limit: --max-episode-tokens, else --max-new-tokens); 0: off"""
    overlap_scoring: int = 1
    """with --rollouts sync: each batch of rollouts (a Ray generator's job, or a step's) is played in this many
    parts, and a part's replies are scored in a thread while the next part generates: worth it when scoring is
    slow (a reward model, served or not; a sandbox); 1: score after generating. --rollouts async already
    scores each episode while others sample"""

    def check_episodes(self, batch_groups: int, multi_turn: bool) -> None:
        """``batch_groups``: the groups of a step (--prompts-per-step); ``multi_turn``: the env
        may take more than one reply (then an overlong penalty needs an episode limit)."""
        require(self.rollouts in ROLLOUTS, f"unknown --rollouts {self.rollouts!r}; choose sync or async")
        require_non_negative(self, "concurrency", "max_episode_tokens", "overlong_buffer")
        require_positive(self, "overlap_scoring")
        require(self.overlap_scoring <= batch_groups, f"--overlap-scoring {self.overlap_scoring} is more than the "
                                                      f"{batch_groups} prompts of a step; use at most that many parts")
        require_positive(self, "max_refill_factor")
        require(self.max_refill_factor >= 1, f"--max-refill-factor must be at least 1 (a step draws at least its "
                                             f"own groups), got {self.max_refill_factor}")
        if self.rollouts == "sync":
            given = [flag for flag, value, default in (("--concurrency", self.concurrency, 0),
                                                       ("--dynamic-sampling", self.dynamic_sampling, False),
                                                       ("--max-refill-factor", self.max_refill_factor, 3.0))
                     if value != default]
            require(not given, f"{', '.join(given)}: read by --rollouts async only; add --rollouts async or "
                               "leave them out")
        else:
            require(self.overlap_scoring == 1, "--overlap-scoring is for --rollouts sync: with --rollouts async each "
                                               "episode is already scored while the others sample; leave it out")
            require(self.runtime == "sync", f"--rollouts async runs episodes in this process; it does not combine "
                                            f"with --runtime {self.runtime}")
            require(self.max_staleness >= 1, "--rollouts async needs --max-staleness 1 or more (a step trains while "
                                             "the next episodes sample; 0 is --rollouts sync)")
            # vLLM's engine would be called from the sampler's thread and the trainer's (held-out
            # evaluation) at once; the in-process engines get a copy of the policy each
            require(getattr(self, "engine", "auto") != "vllm", "--rollouts async samples in a thread of this "
                                                             "process with its own copy of the policy; it does not "
                                                             "run --engine vllm yet (use --engine auto, kv or hf)")
        if self.overlong_buffer:
            limit = self.max_episode_tokens or self.max_new_tokens
            require(multi_turn is False or self.max_episode_tokens > 0,
                    "--overlong-buffer in a multi-turn env needs --max-episode-tokens (the limit it ramps "
                    "up to; --max-new-tokens bounds one reply only)")
            require(self.overlong_buffer < limit, f"--overlong-buffer {self.overlong_buffer} must be less than the "
                                                  f"limit it comes before ({limit} tokens)")


@dataclass
class _Group:
    index: int
    example: dict
    items: list
    pending: int


class AsyncRollouts:
    def __init__(self, source, examples_for, group_size: int, prompts_per_step: int, concurrency: int,
                 max_staleness: int, dynamic_sampling: bool = False, max_refill_factor: float = 3.0,
                 close_source=None):
        """``examples_for(k)`` gives the k-th ``prompts_per_step`` prompts of the stream;
        ``close_source`` is called at ``close`` (the source's service)."""
        self.source, self.examples_for, self.group_size = source, examples_for, group_size
        self.prompts_per_step, self.concurrency, self.max_staleness = prompts_per_step, concurrency, max_staleness
        self.dynamic_sampling, self.max_refill_factor = dynamic_sampling, max_refill_factor
        self.close_source = close_source
        self.taken = 0
        """groups the steps have taken (trained or dropped): where a resumed run's prompt stream starts"""
        self._done: queue.Queue = queue.Queue()
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._feeder = None
        self._credits: asyncio.Semaphore | None = None
        self._last: dict = {}
        self.samples, self.started = 0, None

    # the trainer's side ------------------------------------------------------------------

    def update_weights(self, named_tensors, version: int) -> None:
        self.source.update_weights(named_tensors, version)
        if self._thread is None:  # the first policy is in: episodes may start
            self.started = time.perf_counter()
            self._thread = threading.Thread(target=self._loop.run_forever, name="omnigym-episodes", daemon=True)
            self._thread.start()
            self._feeder = asyncio.run_coroutine_threadsafe(self._feed(self.taken), self._loop)

    def trajectories(self, step: int) -> Trajectories:
        need, cap = self.prompts_per_step, math.ceil(self.prompts_per_step * self.max_refill_factor)
        kept, flat, drawn = [], [], 0
        counts = {"stale": 0, "error": 0, "zero_variance": 0}
        while len(kept) < need:
            group = self._next_group()
            drawn += 1
            reason = self._drop_reason(group, step)
            if reason:
                counts[reason] += 1
                if reason == "zero_variance":
                    flat.append(group)
            else:
                kept.append(group)
            if drawn >= cap and (kept or flat) and self.dynamic_sampling:
                break
            if not self.dynamic_sampling and len(kept) + len(flat) >= need:
                break
        batch = (kept + flat)[:need]
        items = []
        for gid, group in enumerate(batch):
            for trajectory in group.items:
                trajectory.group_id = gid
                items.append(trajectory)
        self.samples += len(items)
        self._last = self._batch_metrics(items, step, drawn, counts)
        return Trajectories(items)

    def _next_group(self) -> _Group:
        while True:
            try:
                group = self._done.get(timeout=0.5)
                break
            except queue.Empty:
                if self._feeder is not None and self._feeder.done():
                    self._feeder.result()  # the feeder's own error (the prompt stream's), raised here
        self.taken += 1
        self._loop.call_soon_threadsafe(self._credits.release)
        return group

    def _drop_reason(self, group: _Group, step: int) -> str | None:
        versions = [v for t in group.items for v in t.info.get("versions", [t.policy_version]) if v >= 0]
        if versions and step - min(versions) > self.max_staleness:
            return "stale"
        if any(t.info.get("error") for t in group.items):
            return "error"
        if self.dynamic_sampling and len({t.reward for t in group.items}) == 1:
            return "zero_variance"
        return None

    def _batch_metrics(self, items: list, step: int, drawn: int, counts: dict) -> dict:
        ages = [step - v for t in items for v in t.info.get("versions", [t.policy_version]) if v >= 0]
        metrics = {"rollout/refill_rate": (drawn - self.prompts_per_step) / self.prompts_per_step,
                   "rollout/staleness_mean": sum(ages) / len(ages) if ages else 0.0,
                   "rollout/staleness_max": float(max(ages, default=0)),
                   **{f"rollout/dropped_{reason}": float(n) for reason, n in counts.items()}}
        return {**metrics, **episode_metrics(items)}

    def metrics(self) -> dict:
        elapsed = max(time.perf_counter() - (self.started or time.perf_counter()), 1e-9)
        return {**self._last, "perf/samples_per_second": self.samples / elapsed}

    def state_dict(self) -> dict:
        return {"groups_taken": self.taken}

    def load_state_dict(self, state: dict) -> None:
        require(self._thread is None, "async rollouts are restored before the first weights are given")
        self.taken = int(state.get("groups_taken", 0))

    def close(self) -> None:
        """Cancels the episodes in flight (a tool call already running in its thread finishes
        on its own; its result is dropped), then stops the source and the loop, in that order:
        the service's last batch still hands its samples to the (stopped, still open) loop."""
        if self._thread is not None:
            asyncio.run_coroutine_threadsafe(self._cancel_all(), self._loop).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._thread = None
        if self.close_source is not None:
            self.close_source()
            self.close_source = None
        if not self._loop.is_closed():
            self._loop.close()

    # the episodes' side (the loop's thread) ----------------------------------------------

    async def _feed(self, first: int) -> None:
        """Starts episodes, the stream's groups in order from group ``first``, keeping
        ``concurrency`` in flight and no more groups ahead of the steps than they can use."""
        slots = asyncio.Semaphore(self.concurrency)
        self._credits = asyncio.Semaphore(self.prompts_per_step * (self.max_staleness + 1))
        index = first
        while True:
            await self._credits.acquire()
            examples = self.examples_for(index // self.prompts_per_step)
            group = _Group(index, examples[index % self.prompts_per_step], [], self.group_size)
            for _ in range(self.group_size):
                await slots.acquire()
                asyncio.get_running_loop().create_task(self._play(group, slots))
            index += 1

    async def _play(self, group: _Group, slots: asyncio.Semaphore) -> None:
        try:
            group.items += await self.source.play(group.example, group.index)
        except Exception as exc:  # the episode is lost, not the run: its group is dropped
            group.items.append(_failed(group, exc))
        finally:
            slots.release()
        group.pending -= 1
        if group.pending == 0:
            self._done.put(group)

    async def _cancel_all(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _failed(group: _Group, exc: Exception):
    from omnigym.generators.base import Trajectory

    return Trajectory([], [], [], [], 0.0, group.index, -1, group.example,
                      {"error": f"{type(exc).__name__}: {exc}", "turns": 0})


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..100) of ``values``."""
    ordered = sorted(values)
    return float(ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)])


def episode_metrics(items: list) -> dict:
    """Per-episode means of turns, tool calls and tool errors, and the distribution of episode
    lengths (tokens after the first prompt: generated and inserted), for either schedule."""
    if not items:
        return {}
    lengths = [len(t.response_ids) for t in items]
    return {"episode/turns": sum(t.info.get("turns", 1) for t in items) / len(items),
            "episode/tool_calls": sum(t.info.get("tool_calls", 0) for t in items) / len(items),
            "episode/tool_errors": sum(t.info.get("tool_errors", 0) for t in items) / len(items),
            "episode/length_p50": percentile(lengths, 50), "episode/length_p90": percentile(lengths, 90),
            "episode/length_max": float(max(lengths)),
            "episode/budget_cut_fraction": sum(bool(t.info.get("budget_cut")) for t in items) / len(items)}


def async_rollouts(cfg, generator, examples_for, group_size: int) -> AsyncRollouts:
    """``--rollouts async`` over ``generator``: an episode source as it is (it has ``play``), or
    the source a generator makes of its own episodes (``TextEnvGenerator.episode_source``)."""
    if hasattr(generator, "play"):
        source = generator
    elif hasattr(generator, "episode_source"):
        source = generator.episode_source()
    else:
        raise OmnigymError(f"--rollouts async cannot play the episodes of a {type(generator).__name__}; use "
                           "--rollouts sync")
    per_step = len(examples_for(0))
    return AsyncRollouts(source, examples_for, group_size, per_step, cfg.concurrency or per_step * group_size,
                         cfg.max_staleness, cfg.dynamic_sampling, cfg.max_refill_factor, getattr(source, "close", None))
