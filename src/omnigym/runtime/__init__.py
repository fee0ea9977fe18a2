"""Where rollouts are made: in the trainer's process (``sync``) or on Ray actors (``ray``).

The contract a language algorithm is written against (``Rollouts`` below)::

    rollouts.trajectories(step) -> Trajectories   # the rollouts step ``step`` trains on
    rollouts.update_weights(named_tensors, version)  # the trainer's new policy, version ``version``
    rollouts.metrics() -> dict                    # staleness, idle time, samples/s
    rollouts.state_dict() / load_state_dict()     # what an exact resume needs
    rollouts.close()

``update_weights`` takes the tensors that changed since the last call (every one the first
time; none when the trainer's step changed nothing: the version moves alone), as the
generator and inference-engine seams do.

``sync`` is the single-process loop every algorithm ran before the split, bit for bit; with
``--rollouts async`` (GRPO) its episodes run independently instead (``episodes.py``).
``ray`` puts ``--num-generators`` generator actors beside the trainer and lets them run up
to ``--max-staleness`` steps ahead of it (``ray_actors.py``; docs/scale_out.md). PPO's
control rollouts take the same flags and schedule (``control_workers.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

from omnigym.config import require_non_negative, require_positive
from omnigym.errors import require

RUNTIMES = ("sync", "ray")
ASYNC_BEHAVIOUR_CAP = 2.0
"""The cap on pi_old / pi_behaviour when rollouts may be stale (truncated importance sampling's
C = 2, as in Yao et al., 2025): --behaviour-cap's default with --runtime ray and K > 0."""


@dataclass
class RolloutRuntimeConfig:
    """The flags of the generator/trainer split, shared by the language algorithms that sample."""

    runtime: str = "sync"
    """sync (generate, then train, in this process) or ray (generator actors on Ray, asynchronous
    up to --max-staleness steps ahead of the trainer; needs the [ray] extra)"""
    max_staleness: int = 1
    """with --runtime ray: rollouts of step k+1..k+K are generated while step k trains; a sample
    older than K policy versions is never trained on (0: generate on Ray, but never ahead); with
    --rollouts async: a group with a token sampled more than K versions before its step is dropped"""
    num_generators: int = 1
    """generator actors with --runtime ray; each step's prompts (a control run's --num-envs) are
    split between them"""
    sync_timeout: float = 600.0
    """with --runtime ray: seconds a generator may take to answer (rollouts or a weight update) before
    the run stops with an error naming it"""
    behaviour_cap: float | None = None
    """truncated importance sampling against the sampler's log-probs, capped here: min(pi_old / mu, C)
    (default: off with --runtime sync, where the current policy samples; 2.0 with --runtime ray or
    --rollouts async, where a sample may come from a policy up to --max-staleness versions old)"""

    ray_address: str | None = None
    """with --runtime ray: the Ray cluster to join (host:port of its head, as `ray start --head` prints it,
    or auto); default: RAY_ADDRESS if set, else a local Ray started for the run"""
    generator_resources: str = ""
    """with --runtime ray: Ray resources each generator (rollout worker) asks for, as JSON, e.g.
    '{"omnigym_generator": 1}': they are placed on the nodes started with them (`ray start --resources`)"""

    ray_trainer: bool = False
    """with --runtime ray: the trainer runs as a Ray task too (placed by Ray: on a cluster,
    RAY_ADDRESS=..., on a node with --trainer-gpus GPUs free); this process waits for it"""
    trainer_gpus: float = 0.0
    """GPUs the --ray-trainer task asks Ray for (1 with --device cuda)"""

    def trains_on_ray(self) -> bool:
        return self.ray_trainer

    def behaviour_cap_in_effect(self) -> float | None:
        stale = self.runtime == "ray" or getattr(self, "rollouts", "sync") == "async"  # runtime/episodes.py
        if self.behaviour_cap is None and stale and self.max_staleness > 0:
            return ASYNC_BEHAVIOUR_CAP
        return self.behaviour_cap

    def check_runtime(self, units: int, what: str = "prompts a step splits between them",
                      training_backend: str = "local") -> None:
        """``units`` of ``what`` are split between the generators (prompts, or a control run's envs);
        ``training_backend``: a language trainer's --training-backend (Ray and data-parallel do not mix)."""
        require(self.runtime in RUNTIMES, f"unknown --runtime {self.runtime!r}; choose sync or ray")
        require_non_negative(self, "max_staleness")
        require_positive(self, "num_generators", "sync_timeout")
        require_non_negative(self, "trainer_gpus")
        require(self.behaviour_cap is None or self.behaviour_cap > 0,
                f"--behaviour-cap must be positive (a cap on pi_old / pi_behaviour), got {self.behaviour_cap}")
        if self.runtime == "sync":  # set away from their defaults, they would be silently ignored
            async_episodes = getattr(self, "rollouts", "sync") == "async"  # reads --max-staleness too
            given = [flag for flag, value, default in (("--max-staleness", self.max_staleness,
                                                        self.max_staleness if async_episodes else 1),
                                                       ("--num-generators", self.num_generators, 1),
                                                       ("--sync-timeout", self.sync_timeout, 600.0),
                                                       ("--ray-trainer", self.ray_trainer, False),
                                                       ("--ray-address", self.ray_address, None),
                                                       ("--generator-resources", self.generator_resources, ""),
                                                       ("--trainer-gpus", self.trainer_gpus, 0.0))
                     if value != default]
            require(not given, f"{', '.join(given)}: read by --runtime ray only (this run generates in its own "
                               "process); add --runtime ray or leave them out")
        require(self.num_generators <= units,
                f"--num-generators {self.num_generators} is more than the {units} {what}; use at most that many")
        require(self.trainer_gpus == 0 or self.ray_trainer,
                "--trainer-gpus is what the --ray-trainer task asks Ray for: add --ray-trainer")
        require(not (self.ray_trainer and str(self.device).startswith("cuda") and self.trainer_gpus == 0),
                f"--ray-trainer with --device {self.device}: give --trainer-gpus 1 (Ray hides the GPUs from a task "
                "that asks for none)")
        require(self.runtime == "sync" or training_backend == "local",
                "--runtime ray runs the trainer in one process; use --training-backend local with it, not "
                f"{training_backend}")
        if self.runtime == "ray":
            import importlib.util

            require(importlib.util.find_spec("ray") is not None,
                    "--runtime ray needs Ray; install it with: pip install 'omnigym[ray]'")
            from omnigym.runtime.cluster import check_cluster, generator_resources

            generator_resources(self.generator_resources)  # its JSON, checked before the run starts
            check_cluster(self.ray_address)  # a cluster that does not answer: one line, before any run dir

    def generator_placement(self) -> dict:
        """The Ray resources each generator actor asks for (``--generator-resources``)."""
        from omnigym.runtime.cluster import generator_resources

        return generator_resources(self.generator_resources)


class Rollouts(Protocol):
    def trajectories(self, step: int) -> "Trajectories": ...

    def update_weights(self, named_tensors: Iterable, version: int) -> None: ...

    def metrics(self) -> dict: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def close(self) -> None: ...


def make_rollouts(cfg: RolloutRuntimeConfig, local_generator, build_generator: Callable, examples_for: Callable,
                  group_size: int, steps: int, seed: int = 0):
    """``local_generator`` serves ``sync``; ``build_generator`` (picklable, no arguments) builds
    one in each Ray actor. ``examples_for(step)`` gives the prompts of a step; ``steps`` is the
    run's length (no rollouts are made past it); ``seed`` seeds each actor job's sampling."""
    if getattr(cfg, "rollouts", "sync") == "async":  # episodes that do not wait for each other
        from omnigym.runtime.episodes import async_rollouts

        return async_rollouts(cfg, local_generator, examples_for, group_size)
    if cfg.runtime == "sync":
        from omnigym.runtime.sync import SyncRollouts

        return SyncRollouts(local_generator, examples_for, group_size)
    from omnigym.runtime.ray_actors import RayRollouts

    return RayRollouts(build_generator, examples_for, group_size, steps, cfg.num_generators, cfg.max_staleness,
                       cfg.sync_timeout, seed, ray_address=cfg.ray_address, resources=cfg.generator_placement())
