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
(``max_restarts``); its lost jobs are sent again, each after the weights it was first sent
with, so no step is lost or trained twice and the run's samples are those of a run that lost
nothing. One whose node left the cluster, when no node left has its ``--generator-resources``,
starts again on the nodes left (``cluster.py`` joins a cluster). Every wait is bounded by
``--sync-timeout``: a hung actor becomes one error that names it.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections import Counter

from omnigym.errors import OmnigymError, missing_extra
from omnigym.generators.base import Trajectories
from omnigym.runtime.cluster import has_node_with, init_ray

PLACEMENT_POLL = 1.0
"""seconds between looks at a restarted actor that has not started yet, and at the cluster's nodes
(each look is one call to the head; at 5 s, a run whose generators' node left waited up to that
much more per generator before starting it again elsewhere)"""

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

        from omnigym.optim import flush_denormals

        torch.set_num_threads(1)
        flush_denormals()  # as the trainer's process does (process.py): the same numbers
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
                 timeout: float = 600.0, seed: int = 0, kind: str = "generator", ray_address: str | None = None,
                 resources: dict | None = None):
        ray = self.ray = _ray()
        self.steps, self.max_staleness, self.timeout, self.seed, self.kind = steps, max_staleness, timeout, seed, kind
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:  # --ray-address / RAY_ADDRESS: join that cluster; else a local Ray for this run
            init_ray(ray_address, max(len(worker_args) + 1, os.cpu_count() or 1), THREAD_ENV)
        self.worker_class, self.worker_args, self.resources = ray.remote(worker_class), worker_args, resources or {}
        if self.resources and not has_node_with(self.resources):  # they would wait for a node for ever
            if self.owns_ray:
                ray.shutdown()
            raise OmnigymError(f"no node of the Ray cluster has --generator-resources {json.dumps(self.resources)}; "
                               "start one with them: ray start --address HEAD_HOST:PORT --resources "
                               f"'{json.dumps(self.resources)}'")
        self.placed = [self.resources] * len(worker_args)  # what each actor asked for: {} once it lost its node
        self.workers = [self._start(i, self.resources) for i in range(len(worker_args))]
        self._wait_started()
        self.live: dict | None = None  # the trainer's named tensors (its own, not copies)
        self.version: int | None = None
        self.weight_loads: list = []  # (worker, ref) of updates not yet confirmed
        self.trainable_at: dict[int, object] = {}  # version -> the ref of its trainable weights, while a job needs it
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
        # What a restarted actor needs to sample a lost job exactly as it was sent: the trainable
        # weights of the job's version (the frozen ones never change), kept while a job has it.
        # K + 1 versions at most: a full fine-tune's object store holds that many copies.
        latest = ref if tensors else self.trainable_at.get(self.version)
        oldest = min((chunk["version"] for chunks in self.jobs.values() for chunk in chunks), default=version)
        self.trainable_at = {v: r for v, r in self.trainable_at.items() if v >= oldest} | {version: latest}
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

    def _start(self, index: int, resources: dict):
        """Actor ``index``, asking Ray for one CPU and ``resources`` (``--generator-resources``)."""
        return self.worker_class.options(num_cpus=1, resources=resources, max_restarts=-1, max_task_retries=0,
                                         runtime_env={"env_vars": THREAD_ENV}).remote(*self.worker_args[index])

    def _submit(self, step: int) -> None:
        chunks = self._split(step)
        for chunk in chunks:
            chunk["version"] = self.version  # the weights it samples from (sent before it)
            chunk["ref"] = self.workers[chunk["worker"]].generate.remote(*chunk["args"])
        self.jobs[step] = chunks

    def _collect(self, step: int):
        chunks, outputs = self.jobs[step], []  # listed while collected: an actor restarted meanwhile gets them again
        for chunk in chunks:
            out, busy = self._get(chunk, step)
            chunk["done"] = True
            self.generator_busy += busy
            outputs.append(out)
        del self.jobs[step]
        return self._merge(step, chunks, outputs)

    def _get(self, chunk: dict, step: int):
        while True:
            try:
                return self._wait(chunk["ref"], f"{self.kind} {chunk['worker']} gave no rollouts for step {step}")
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.ObjectLostError):
                # the actor died (Ray restarts it; its queue was lost with it), or its node did with the result
                self._restarted(chunk["worker"])

    def _restarted(self, index: int) -> list[int]:
        """Give a restarted actor every job of its that was lost, each after the weights it was
        sent with (so it samples what it would have), then the current weights; so too every
        other actor started again elsewhere with it. Returns the actors given their jobs again."""
        again = self._wait_placed(index)
        frozen = {name: p.detach().to("cpu", copy=True) for name, p in self.live.items() if not p.requires_grad}
        frozen_ref = self.ray.put(frozen) if frozen else None  # the same for every actor started again
        for i in again:
            worker = self.workers[i]
            loads = [worker.load_weights.remote(frozen_ref, self.version)] if frozen else []
            for step in sorted(self.jobs):
                for chunk in self.jobs[step]:
                    if chunk["worker"] == i and not chunk.get("done"):
                        loads.append(worker.load_weights.remote(self.trainable_at[chunk["version"]], chunk["version"]))
                        chunk["ref"] = worker.generate.remote(*chunk["args"])
            loads.append(worker.load_weights.remote(self.trainable_at[self.version], self.version))
            self.weight_loads = [(j, ref) for j, ref in self.weight_loads if j != i] + [(i, r) for r in loads]
        self._confirm_weight_loads()
        return again

    def _wait_placed(self, index: int) -> list[int]:
        """Wait for a restarted actor to run again. One that asked for ``--generator-resources``
        that no live node holds any more (its node left the cluster) starts again on the nodes
        left, with one line saying so, and with it every other actor that asked for them (their
        node is gone too: they start side by side, not one after another as each is found dead);
        bounded by --sync-timeout. Returns the actors started again: ``index`` and those others."""
        deadline, again = time.monotonic() + self.timeout, [index]
        while True:
            try:
                self.ray.get(self.workers[index].pid.remote(), timeout=PLACEMENT_POLL)
                return again
            except (self.ray.exceptions.GetTimeoutError, self.ray.exceptions.RayActorError):
                pass  # starting, waiting for a node, or not yet known to be gone
            if self.placed[index] and not has_node_with(self.placed[index]):
                again = [i for i, placed in enumerate(self.placed) if placed == self.placed[index]]
                for i in again:
                    self._start_on_the_nodes_left(i)
            if time.monotonic() > deadline:
                raise OmnigymError(f"{self.kind} {index} died and did not start again within --sync-timeout "
                                   f"{self.timeout:g} s: the cluster may be short of CPUs (each {self.kind} takes one); "
                                   "check `ray status`")
            time.sleep(PLACEMENT_POLL / 5)

    def _start_on_the_nodes_left(self, index: int) -> None:
        self.ray.kill(self.workers[index], no_restart=True)
        self.placed[index] = {}
        self.workers[index] = self._start(index, {})
        print(f"omnigym: {self.kind} {index}'s node left the Ray cluster and no node left has "
              f"--generator-resources {json.dumps(self.resources)}; it goes on on the nodes left",
              file=sys.stderr, flush=True)

    def _confirm_weight_loads(self) -> None:
        pending, self.weight_loads, restarted = self.weight_loads, [], set()
        for index, ref in pending:
            if index in restarted:  # its other updates went with the actor; _restarted sent them again
                continue
            try:
                self._wait(ref, f"weight update to version {self.version} did not reach {self.kind} {index}")
            except self.ray.exceptions.RayActorError:
                restarted.update(self._restarted(index))


class RayRollouts(RaySchedule):
    """The language algorithms' generator actors: each step's prompts split into contiguous groups."""

    def __init__(self, build_generator, examples_for, group_size: int, steps: int, num_generators: int = 1,
                 max_staleness: int = 1, timeout: float = 600.0, seed: int = 0, ray_address: str | None = None,
                 resources: dict | None = None):
        self.examples_for, self.group_size = examples_for, group_size
        super().__init__(GeneratorWorker, [(build_generator, i) for i in range(num_generators)], steps,
                         max_staleness, timeout, seed, ray_address=ray_address, resources=resources)

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
