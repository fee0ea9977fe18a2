"""PPO's rollouts, stepped in this process (``sync``) or by rollout workers on Ray (``ray``).

The control half of the generator/trainer split, as IMPALA (Espeholt et al., 2018) and
Cleanba (Huang et al., 2023) do it: each of ``--num-generators`` Ray actors owns
``--num-envs / --num-generators`` of the envs and a copy of the policy, and steps them for
``--num-steps`` at a time; the learner (this process) trains on their rollouts. The
schedule is the language runtime's (``ray_actors.RaySchedule``): the rollouts of update
k+1..k+K are stepped while update k trains, a rollout older than ``--max-staleness`` K
policy versions is never trained on, and every wait is bounded by ``--sync-timeout``.

The learner does not trust the actors' values or log-probs to be current: it recomputes
V(s_t) and log pi_old(a_t|s_t) with its own policy before estimating advantages (as
IMPALA's learner does), and keeps the actor's log-prob as the behaviour policy mu's, for
the ``--behaviour-cap`` correction min(pi_old / mu, C) in the clipped loss
(``rl/losses.py``; docs/scale_out.md). Each worker normalizes observations with its own
running statistics (the policy was trained on what the worker fed it); the checkpoint
holds their merged statistics for ``omnigym eval``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import time
from typing import Iterable, Protocol

import numpy as np
import torch

from omnigym.optim import flush_denormals
from omnigym.rl.rollout import Rollout, RolloutCollector
from omnigym.runtime.ray_actors import RaySchedule

RELABEL_CHUNK = 4096
"""rows per forward pass when the learner recomputes values and log-probs (bounds the memory
of a pixel batch)"""


class ControlRollouts(Protocol):
    """What PPO is written against, in both modes."""

    def collect(self, agent, update: int, global_step: int) -> tuple[Rollout, int]: ...

    def update_weights(self, named_tensors: Iterable, version: int) -> None: ...

    def metrics(self) -> dict: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def close(self) -> None: ...


class SyncControlRollouts:
    """``--runtime sync``: the collector steps the envs in this process with the trainer's own
    agent, between updates (PPO's loop as it always was)."""

    def __init__(self, collector: RolloutCollector):
        self.collector = collector

    def collect(self, agent, update: int, global_step: int) -> tuple[Rollout, int]:
        return self.collector.collect(agent, global_step)

    def update_weights(self, named_tensors, version: int) -> None:
        pass  # the collector acts with the trainer's agent itself

    def metrics(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return self.collector.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.collector.load_state_dict(state)

    def close(self) -> None:
        self.collector.envs.close()


class RolloutWorker:
    """A Ray actor: its share of the envs, its copy of the policy, one rollout per call."""

    def __init__(self, cfg, algo: str, index: int, num_envs: int, cwd: str):
        from omnigym.envs.games.symmetry import symmetries_of
        from omnigym.envs.vector import make_run_envs
        from omnigym.models.control import ActorCritic
        from omnigym.track.episodes import EpisodeStats

        torch.set_num_threads(1)
        flush_denormals()  # as the trainer's process does (process.py): the same numbers
        os.chdir(cwd)  # a user's env module and the run dir are found from the trainer's folder
        # Worker i's envs are envs i*n .. i*n+n-1 of a one-process run, with the same seeds.
        cfg = dataclasses.replace(cfg, num_envs=num_envs, seed=cfg.seed + index * num_envs, device="cpu",
                                  capture_video=cfg.capture_video and index == 0)
        with contextlib.redirect_stdout(io.StringIO()):  # the learner has said which backend the envs run on
            envs, signal = make_run_envs(cfg, algo)
        self.agent = ActorCritic(envs.single_observation_space, envs.single_action_space, cfg.hidden,
                                 symmetries_of(cfg))
        self.stats = EpisodeStats()
        self.collector = build_collector(cfg, envs, signal, self.stats)
        self.version = 0

    def load_weights(self, tensors: dict | None, version: int) -> int:
        if tensors:
            with torch.no_grad():
                for name, parameter in self.agent.named_parameters():
                    parameter.copy_(tensors[name])
        self.version = version
        return version

    def generate(self, seed: int):
        """One rollout of ``--num-steps`` with the weights last loaded: the numpy buffers (the
        observations with the one after the last step) and the episodes that ended."""
        torch.manual_seed(seed)  # pixel policies sample in torch
        start = time.perf_counter()
        _, steps = self.collector.collect(self.agent, 0, values=False)
        c = self.collector
        out = {"obs": c.obs_buf.copy(), "actions": c.actions_buf.copy(), "logprobs": c.logprobs_buf.copy(),
               "rewards": c.rewards_buf.copy(), "terminated": c.terminated_buf.copy(),
               "truncated": c.truncated_buf.copy(), "valid": c.valid_buf.copy(),
               "masks": None if c.masks_buf is None else c.masks_buf.copy(),
               "steps": steps, "version": self.version, "episodes": self.stats.take()}
        return out, time.perf_counter() - start

    def state_dict(self) -> dict:
        return {"collector": self.collector.state_dict(), "torch_rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict) -> None:
        self.collector.load_state_dict(state["collector"])
        torch.set_rng_state(state["torch_rng"])

    def pid(self) -> int:
        return os.getpid()


class RayControlRollouts(RaySchedule):
    """``--runtime ray``: each update's batch is the workers' rollouts side by side (env axis)."""

    def __init__(self, cfg, algo: str, updates: int, stats, device):
        n = cfg.num_generators
        super().__init__(RolloutWorker, [(cfg, algo, i, cfg.num_envs // n, os.getcwd()) for i in range(n)], updates,
                         cfg.max_staleness, cfg.sync_timeout, cfg.seed, kind="rollout worker",
                         ray_address=cfg.ray_address, resources=cfg.generator_placement())
        self.stats, self.device = stats, device

    def collect(self, agent, update: int, global_step: int) -> tuple[Rollout, int]:
        """The rollouts update ``update`` trains on, relabelled by ``agent`` (the learner's policy)."""
        batch = self.trajectories(update)
        global_step += batch["steps"]
        self.stats.add_episodes(batch["episodes"], global_step)
        return relabel(agent, batch, self.device), global_step

    def _split(self, step: int) -> list[dict]:
        return [{"worker": i, "args": ((self.seed * 1_000_003 + step * 1_009 + i) % 2**63,)}
                for i in range(len(self.workers))]

    def _merge(self, step: int, chunks: list[dict], outputs: list[dict]) -> dict:
        batch = {key: None if outputs[0][key] is None else np.concatenate([out[key] for out in outputs], axis=1)
                 for key in ("obs", "actions", "logprobs", "rewards", "terminated", "truncated", "valid", "masks")}
        batch["steps"] = sum(out["steps"] for out in outputs)
        batch["versions"] = [out["version"] for out in outputs for _ in range(out["steps"])]
        batch["episodes"] = [episode for out in outputs for episode in out["episodes"]]
        return batch

    def _versions(self, batch: dict) -> list[int]:
        return batch["versions"]

    def state_dict(self) -> dict:
        """The schedule's state (finished rollouts in flight included), each worker's envs and
        random state after them, and the workers' merged observation statistics (for eval)."""
        state = super().state_dict()
        state["workers"] = [self._wait(w.state_dict.remote(), f"rollout worker {i} did not send its state")
                            for i, w in enumerate(self.workers)]
        state["obs_rms"] = merged_obs_rms([s["collector"]["obs_rms"] for s in state["workers"]])
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        for i, (worker, saved) in enumerate(zip(self.workers, state["workers"])):
            self._wait(worker.load_state_dict.remote(saved), f"rollout worker {i} did not take its saved state")


def merged_obs_rms(states: list[dict | None]) -> dict | None:
    """The running statistics of all workers' observations, as one (Chan et al.'s combination)."""
    if not states or states[0] is None:
        return None
    from omnigym.rl.running_stats import RunningMeanStd

    merged = RunningMeanStd(np.shape(states[0]["mean"]))
    merged.load_state_dict(states[0])
    for state in states[1:]:
        merged.combine(state["mean"], state["var"], state["count"])
    return merged.state_dict()


def relabel(agent, batch: dict, device) -> Rollout:
    """A worker batch as the learner trains on it: V(s_0..s_T) and log pi_old from ``agent``
    (its current policy), the workers' log-probs kept as ``behaviour_logprobs``."""
    obs = torch.from_numpy(batch["obs"])  # [T+1, N, ...]
    actions, masks = torch.from_numpy(batch["actions"]), batch["masks"]
    masks = None if masks is None else torch.from_numpy(masks)
    steps, envs = actions.shape[:2]
    flat_obs, flat_actions = obs[:-1].flatten(0, 1), actions.flatten(0, 1)
    flat_masks = None if masks is None else masks.flatten(0, 1)
    logprobs, values = [], []
    with torch.inference_mode():
        for begin in range(0, len(flat_obs), RELABEL_CHUNK):
            rows = slice(begin, begin + RELABEL_CHUNK)
            _, logprob, _, value = agent.act(flat_obs[rows].to(device), flat_actions[rows].to(device),
                                             None if flat_masks is None else flat_masks[rows].to(device))
            logprobs.append(logprob.float().cpu())
            values.append(value.float().cpu())
        values.append(agent.value(obs[-1].to(device)).float().reshape(-1).cpu())
    values = torch.cat(values).reshape(steps + 1, envs)
    tensors = {key: torch.from_numpy(batch[key]) for key in ("rewards", "terminated", "truncated", "valid")}
    return Rollout(obs[:-1], actions, torch.cat(logprobs).reshape(steps, envs), values[:-1], values[1:],
                   tensors["rewards"], tensors["terminated"], tensors["truncated"], tensors["valid"], masks,
                   behaviour_logprobs=torch.from_numpy(batch["logprobs"]))


def build_collector(cfg, envs, signal, stats) -> RolloutCollector:
    """The collector of a PPO config's envs (in this process, or in a rollout worker)."""
    from omnigym.rl.running_stats import RewardScaler

    scaler = RewardScaler(envs.num_envs, cfg.gamma) if cfg.normalize_reward else None
    return RolloutCollector(envs, cfg.num_steps, stats, cfg.device, cfg.seed, cfg.normalize_obs, scaler, signal)


def make_control_rollouts(cfg, algo: str, envs, signal, stats, updates: int):
    """``sync``: a collector on ``envs``; ``ray``: rollout workers with envs of their own (``envs``,
    built to check the flags and shape the policy, are closed)."""
    if cfg.runtime == "sync":
        return SyncControlRollouts(build_collector(cfg, envs, signal, stats))
    envs.close()
    return RayControlRollouts(cfg, algo, updates, stats, cfg.device)
