"""Asynchronous rollouts on Ray: generator actors run up to K policy versions ahead of the trainer.

``RaySchedule`` is the part every split shares, language or control; ``RayRollouts`` (below)
serves the language algorithms, ``control_workers.RayControlRollouts`` PPO's rollout workers.

The trainer (this process) asks for the rollouts of step k. Before it waits for them it
hands out the jobs of steps k+1..k+K, so the actors generate them while step k trains.
Each job is split between the ``--num-generators`` actors (contiguous groups of prompts,
or each worker's own envs).
An actor runs its calls in the order they were sent, and every weight update is sent
before the jobs that follow it, so a job sent while the trainer holds version v samples
from version v: staleness = k - v <= K by construction, and is checked again on arrival
(a sample older than K is never trained on). The trainer corrects for the lag with the
engine's log-probs (decoupled PPO / truncated importance sampling, ``--behaviour-cap``).

Each job's sampling is seeded by (seed, step, chunk), and the order of calls on each actor
is fixed by the schedule above, so an async run is as repeatable as a sync one: a run
killed and resumed from its checkpoint (which keeps the finished jobs that were in flight)
gives the same parameters as one that was not. A generator that dies is restarted by Ray
(``max_restarts``); its lost jobs are sent again, after the current weights, so no step is
lost or trained twice. Every wait is bounded by ``--sync-timeout``: a hung actor becomes
one error that names it.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter

from omnigym.errors import OmnigymError, missing_extra
from omnigym.generators.base import Trajectories

THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
              "TRANSFORMERS_VERBOSITY": "error", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
"""Every actor gets one intra-op thread: a generator shares the machine with the trainer and
other generators, and oversubscribed torch threads made small models 20-100x slower here."""


def _ray():
    try:
        import ray
    except ImportError:
        raise missing_extra("ray", "ray") from None
    return ray


def remote_error(error, failure: str) -> OmnigymError:
    """What an actor or task raised, as this process would say it: an ``OmnigymError`` (a
    user's mistake: a broken env, a bad reward) as it was; anything else named, in one line."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, OmnigymError):
        return OmnigymError(str(cause))
    what = f"{type(cause).__name__}: {cause}" if cause is not None else str(error).strip().splitlines()[-1]
    return OmnigymError(f"{failure}: it raised {what}")


class GeneratorWorker:
    """A Ray actor: its own copy of the policy, inference engine and env (``build_generator()``)."""

    def __init__(self, build_generator, index: int):
        import torch

        torch.set_num_threads(1)
        try:  # model loading's progress bars would interleave with the trainer's output
            from transformers.utils import logging as transformers_logging

            transformers_logging.disable_progress_bar()
        except ImportError:
            pass
        self.index = index
        self.generator = build_generator()

    def load_weights(self, tensors: dict | None, version: int) -> int:
        """``tensors`` None: the trainer skipped its update, the same weights under the next version."""
        self.generator.update_weights(tensors.items() if tensors else (), version)
        return version

    def generate(self, examples: list[dict], group_size: int, seed: int):
        import torch

        torch.manual_seed(seed)
        random.seed(seed)
        start = time.perf_counter()
        out = self.generator.generate(examples, group_size)
        return out, time.perf_counter() - start

    def pid(self) -> int:
        return os.getpid()


class RaySchedule:
    """The bounded-staleness schedule over Ray actors of class ``worker_class`` (each with
    ``load_weights(tensors, version)``, ``generate(*args) -> (output, busy seconds)`` and
    ``pid()``). A subclass says what a step's jobs are (``_split``), how their outputs make
    one batch (``_merge``) and which policy version made each sample (``_versions``)."""

    def __init__(self, worker_class, worker_args: list[tuple], steps: int, max_staleness: int = 1,
                 timeout: float = 600.0, seed: int = 0, kind: str = "generator"):
        ray = self.ray = _ray()
        self.steps, self.max_staleness, self.timeout, self.seed, self.kind = steps, max_staleness, timeout, seed, kind
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:  # a local cluster for this run; RAY_ADDRESS=... joins an existing one instead
            ray.init(num_cpus=max(len(worker_args) + 1, os.cpu_count() or 1), include_dashboard=False,
                     logging_level="ERROR", log_to_driver=True, runtime_env={"env_vars": THREAD_ENV})
        actor = ray.remote(worker_class).options(num_cpus=1, max_restarts=-1, max_task_retries=0,
                                                 runtime_env={"env_vars": THREAD_ENV})
        self.workers = [actor.remote(*args) for args in worker_args]
        self._wait_started()
        self.live: dict | None = None  # the trainer's named tensors (its own, not copies)
        self.version: int | None = None
        self.weight_loads: list = []  # (worker, ref) of updates not yet confirmed
        self.jobs: dict[int, list[dict]] = {}  # step -> its chunks in flight
        self.ready: dict = {}
        self.next_job = 0
        self.staleness = Counter()
        self.last_staleness: list[int] = []
        self.samples, self.generator_busy, self.trainer_waiting = 0, 0.0, 0.0
        self.started = time.perf_counter()

    # -- what a subclass says --------------------------------------------------------------

    def _split(self, step: int) -> list[dict]:
        """The chunks of step ``step``'s job: ``{"worker": i, "args": (...)}`` and whatever ``_merge`` reads."""
        raise NotImplementedError

    def _merge(self, step: int, chunks: list[dict], outputs: list):
        raise NotImplementedError

    def _versions(self, batch) -> list[int]:
        """The policy version of each sample in ``batch``."""
        raise NotImplementedError

    # -- the contract --------------------------------------------------------------------

    def update_weights(self, named_tensors, version: int) -> None:
        """Send the trainer's weights as ``version``: all of them the first time, then the
        trainable ones among ``named_tensors``; none given (the step changed nothing): only the
        version moves."""
        tensors = dict(named_tensors)
        first = self.live is None
        if first:  # idle and throughput count from the first policy on
            if not tensors:
                raise OmnigymError("internal: the first update_weights must send the policy's tensors")
            self.started = time.perf_counter()
        if tensors:
            self.live = tensors
        ref = self.ray.put(self._weights(trainable_only=not first) if tensors else None)
        self.weight_loads += [(i, w.load_weights.remote(ref, version)) for i, w in enumerate(self.workers)]
        self.version = version

    def trajectories(self, step: int):
        if self.version is None:
            raise OmnigymError("internal: update_weights must send the first policy before rollouts are asked for")
        waited = time.perf_counter()  # an actor confirms a weight update after the job before it: waiting too
        self._confirm_weight_loads()
        last = min(step + self.max_staleness, self.steps - 1)
        self.next_job = max(self.next_job, step)
        while self.next_job <= last:  # k+1..k+K go out now and are generated while step k trains
            if self.next_job not in self.ready:
                self._submit(self.next_job)
            self.next_job += 1
        out = self.ready.pop(step) if step in self.ready else self._collect(step)
        self.trainer_waiting += time.perf_counter() - waited
        ages = [step - version for version in self._versions(out)]
        if max(ages) > self.max_staleness:  # the schedule rules it out; never train on it
            raise OmnigymError(f"internal: rollouts of step {step} came from policy version "
                               f"{step - max(ages)}, older than --max-staleness {self.max_staleness}")
        self.last_staleness = ages
        self.staleness.update(ages)
        self.samples += len(ages)
        return out

    def metrics(self) -> dict:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        total = sum(self.staleness.values()) or 1
        out = {"perf/samples_per_second": self.samples / elapsed,
               "async/staleness_mean": sum(self.last_staleness) / max(len(self.last_staleness), 1),
               "async/staleness_max": max(self.last_staleness, default=0),
               "async/generator_idle_percent": 100 * max(0.0, 1 - self.generator_busy / (len(self.workers) * elapsed)),
               "async/trainer_idle_percent": 100 * self.trainer_waiting / elapsed}
        out.update({f"async/staleness_{age}_fraction": count / total for age, count in sorted(self.staleness.items())})
        return out

    def state_dict(self) -> dict:
        """Waits for the jobs in flight and keeps their rollouts: a resumed run trains on the
        same samples as one that was never stopped."""
        for step in sorted(self.jobs):
            self.ready[step] = self._collect(step)
        return {"ready": dict(self.ready), "next_job": self.next_job, "staleness": dict(self.staleness)}

    def load_state_dict(self, state: dict) -> None:
        self.ready = dict(state["ready"])
        self.next_job = state["next_job"]
        self.staleness = Counter(state["staleness"])

    def close(self) -> None:
        for worker in self.workers:
            self.ray.kill(worker)
        self.workers = []
        if self.owns_ray and self.ray.is_initialized():
            self.ray.shutdown()

    # -- jobs ----------------------------------------------------------------------------

    def _weights(self, trainable_only: bool = False) -> dict:
        """The trainer's weights on the CPU, copied (the trainer goes on changing its own)."""
        return {name: p.detach().to("cpu", copy=True) for name, p in self.live.items()
                if p.requires_grad or not trainable_only}

    def _wait(self, ref, failure: str):
        """``ray.get`` bounded by --sync-timeout; ``failure`` says what did not happen in time.
        An error raised in the actor is one line here, as it would be in this process."""
        try:
            return self.ray.get(ref, timeout=self.timeout)
        except self.ray.exceptions.GetTimeoutError:
            raise OmnigymError(f"{failure} within --sync-timeout {self.timeout:g} s: it is hung, busy or short of CPUs "
                               "or memory; check `ray status` and its log (/tmp/ray/session_latest/logs/worker-*.err), "
                               "or raise --sync-timeout") from None
        except self.ray.exceptions.RayTaskError as error:
            raise remote_error(error, failure) from None

    def _wait_started(self) -> None:
        """Each actor has built its policy (one that cannot is one error, not a hang)."""
        for index, worker in enumerate(self.workers):
            try:
                self._wait(worker.pid.remote(), f"{self.kind} {index} did not start")
            except self.ray.exceptions.RayActorError as e:
                self.close()
                why = str(e.__cause__ or e).strip().splitlines()[-1]
                raise OmnigymError(f"{self.kind} {index} failed to start: {why}") from None
            except OmnigymError:
                self.close()
                raise

    def _submit(self, step: int) -> None:
        chunks = self._split(step)
        for chunk in chunks:
            chunk["ref"] = self.workers[chunk["worker"]].generate.remote(*chunk["args"])
        self.jobs[step] = chunks

    def _collect(self, step: int):
        chunks, outputs = self.jobs.pop(step), []
        for chunk in chunks:
            out, busy = self._get(chunk, step)
            self.generator_busy += busy
            outputs.append(out)
        return self._merge(step, chunks, outputs)

    def _get(self, chunk: dict, step: int):
        try:
            return self._wait(chunk["ref"], f"{self.kind} {chunk['worker']} gave no rollouts for step {step}")
        except self.ray.exceptions.RayActorError:
            self._restarted(chunk["worker"])  # Ray has restarted it; its queue was lost with it
            return self._get(chunk, step)

    def _restarted(self, index: int) -> None:
        """Send a restarted actor the current weights, then every job of its that was lost."""
        load = self.workers[index].load_weights.remote(self.ray.put(self._weights()), self.version)
        self.weight_loads = [(i, ref) for i, ref in self.weight_loads if i != index] + [(index, load)]
        for step in sorted(self.jobs):
            for chunk in self.jobs[step]:
                if chunk["worker"] == index:
                    chunk["ref"] = self.workers[index].generate.remote(*chunk["args"])
        self._confirm_weight_loads()

    def _confirm_weight_loads(self) -> None:
        pending, self.weight_loads = self.weight_loads, []
        for index, ref in pending:
            try:
                self._wait(ref, f"weight update to version {self.version} did not reach {self.kind} {index}")
            except self.ray.exceptions.RayActorError:
                self._restarted(index)


class RayRollouts(RaySchedule):
    """The language algorithms' generator actors: each step's prompts split into contiguous groups."""

    def __init__(self, build_generator, examples_for, group_size: int, steps: int, num_generators: int = 1,
                 max_staleness: int = 1, timeout: float = 600.0, seed: int = 0):
        self.examples_for, self.group_size = examples_for, group_size
        super().__init__(GeneratorWorker, [(build_generator, i) for i in range(num_generators)], steps,
                         max_staleness, timeout, seed)

    def _split(self, step: int) -> list[dict]:
        examples = self.examples_for(step)
        n = len(self.workers)
        bounds = [len(examples) * i // n for i in range(n + 1)]
        chunks = []
        for i in range(n):
            part = examples[bounds[i]:bounds[i + 1]]
            if part:
                seed = (self.seed * 1_000_003 + step * 1_009 + i) % 2**63
                chunks.append({"worker": i, "offset": bounds[i], "args": (part, self.group_size, seed)})
        return chunks

    def _merge(self, step: int, chunks: list[dict], outputs: list) -> Trajectories:
        items = []
        for chunk, out in zip(chunks, outputs):
            for t in out.items:
                t.group_id += chunk["offset"]
            items += out.items
        return Trajectories(items)

    def _versions(self, batch: Trajectories) -> list[int]:
        return [t.policy_version for t in batch.items]
