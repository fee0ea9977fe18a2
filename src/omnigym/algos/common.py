"""What every control algorithm shares: common flags, seeding, the run, episode statistics."""

from __future__ import annotations

import dataclasses
import random
import sys
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from omnigym.errors import OmnigymError
from omnigym.track.checkpoint import rng_state, set_rng_state, snapshot_env
from omnigym.track.run import Run, default_run_dir


@dataclass
class RunConfig:
    """Flags every algorithm has: seed, run directory, resume, threads, device, tracking."""

    seed: int = 1
    """seed for torch, numpy, python and the envs: same seed, same metrics on CPU"""
    run_dir: str | None = None
    """where the run writes (default runs/<algo>__<env or model>__<seed>__<time>)"""
    resume: str | None = None
    """continue the run in this directory from its last checkpoint"""
    torch_threads: int = 1
    """torch intra-op threads; 1 is fastest for small networks on a shared CPU"""
    device: str = "cpu"
    """torch device (cpu, cuda, cuda:1, mps)"""
    tensorboard: bool = True
    """write TensorBoard events to the run directory"""
    wandb: bool = False
    """log to Weights & Biases as well"""
    progress: bool = True
    """show a progress bar on a terminal"""
    plot: bool = True
    """write the learning curve PNG at the end"""


@dataclass
class CommonConfig(RunConfig):
    env_id: str = "CartPole-v1"
    """gymnasium env id (``omnigym list`` shows what is installed)"""
    total_timesteps: int = 100_000
    """env steps to train for, summed over the vector envs"""
    num_envs: int = 8
    """parallel envs in the vector env"""
    backend: str = "auto"
    """vector env backend: auto, sync, async, native, envpool"""
    checkpoint_every: int = 25_000
    """env steps between checkpoints (one is always written at the end); 0 writes only the last"""
    print_episodes: bool = False
    """print one line per finished episode (global_step=..., episodic_return=...)"""


def start(cfg: RunConfig, algo: str, label: str | None = None) -> Run:
    """Threads, seeds and the run directory (named after ``label``, default the env id)."""
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    if getattr(cfg, "total_timesteps", 1) <= 0:
        raise OmnigymError(f"total_timesteps must be positive, got {cfg.total_timesteps}")
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    if cfg.resume and cfg.run_dir and cfg.run_dir != cfg.resume:
        raise OmnigymError("give either --resume RUN_DIR or --run-dir, not two different directories")
    cfg.run_dir = cfg.resume or cfg.run_dir or default_run_dir(algo, label or cfg.env_id, cfg.seed)
    return Run(cfg.run_dir, algo, cfg, resume=bool(cfg.resume), tensorboard=cfg.tensorboard, wandb=cfg.wandb)


def restore_rng(run: Run) -> None:
    """Call last when resuming: building networks draws from the RNGs the checkpoint restores."""
    set_rng_state(run.checkpoint["rng"])


def restore_envs(run: Run, envs):
    """The pickled env from the checkpoint (exact continuation) or ``envs`` if there is none."""
    if run.checkpoint is None or run.checkpoint.get("envs") is None:
        return envs, False
    import pickle

    envs.close()
    return pickle.loads(run.checkpoint["envs"]), True


def start_on_policy(run: Run, cfg, envs, agent, optimizer, stats: EpisodeStats, normalize_obs: bool = False):
    """The rollout collector of PPO and REINFORCE, and on resume every piece of their state.

    Returns ``(envs, collector, global_step, first_update)``.
    """
    from omnigym.rl.rollout import RolloutCollector

    if run.checkpoint is None:
        return envs, RolloutCollector(envs, cfg.num_steps, stats, cfg.device, cfg.seed, normalize_obs), 0, 0
    ckpt = run.checkpoint
    envs, exact = restore_envs(run, envs)
    collector = RolloutCollector(envs, cfg.num_steps, stats, cfg.device, None, normalize_obs)
    agent.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    stats.load_state_dict(ckpt["episodes"])
    collector.load_state_dict(ckpt["collector"], exact, seed=cfg.seed + ckpt["update"])
    restore_rng(run)
    return envs, collector, ckpt["global_step"], ckpt["update"]


def save_on_policy(run: Run, envs, agent, optimizer, stats: EpisodeStats, collector, global_step: int,
                   update: int) -> None:
    run.save(checkpoint_state(envs, model=agent.state_dict(), optimizer=optimizer.state_dict(),
                              episodes=stats.state_dict(), collector=collector.state_dict(),
                              global_step=global_step, update=update))


def checkpoint_state(envs, **state) -> dict:
    return {"rng": rng_state(), "envs": snapshot_env(envs), **state}


def due(step: int, previous_step: int, every: int) -> bool:
    return every > 0 and step // every > previous_step // every


class EpisodeStats:
    """Finished episodes as gymnasium's RecordEpisodeStatistics reports them."""

    def __init__(self, print_episodes: bool = False, window: int = 20):
        self.recent = deque(maxlen=window)
        self.print_episodes = print_episodes
        self._returns: list[float] = []
        self._lengths: list[int] = []

    def add(self, info: dict, global_step: int) -> None:
        if "episode" not in info:
            return
        for i in np.flatnonzero(info["_episode"]):
            r, length = float(info["episode"]["r"][i]), int(info["episode"]["l"][i])
            self.recent.append(r)
            self._returns.append(r)
            self._lengths.append(length)
            if self.print_episodes:
                print(f"global_step={global_step}, episodic_return={r}", flush=True)

    def drain(self) -> dict:
        """Metrics of the episodes finished since the last drain."""
        if not self._returns:
            return {}
        out = {"charts/episodic_return": float(np.mean(self._returns)),
               "charts/episodic_length": float(np.mean(self._lengths)),
               "charts/episodes": len(self._returns),
               "charts/return_last_20": self.mean_recent}
        self._returns, self._lengths = [], []
        return out

    @property
    def mean_recent(self) -> float:
        return float(np.mean(self.recent)) if self.recent else float("nan")

    def state_dict(self) -> dict:
        return {"recent": list(self.recent), "maxlen": self.recent.maxlen}

    def load_state_dict(self, state: dict) -> None:
        self.recent = deque(state["recent"], maxlen=state["maxlen"])


class Clock:
    """Steps per second since the (re)start of this process."""

    def __init__(self, start_step: int):
        self.start_step, self.start_time = start_step, time.perf_counter()

    def sps(self, step: int) -> float:
        return (step - self.start_step) / max(time.perf_counter() - self.start_time, 1e-9)


def finish(run: Run, stats: EpisodeStats, cfg: CommonConfig, global_step: int) -> dict:
    plot_path = run.close(plot=cfg.plot)
    summary = {"run_dir": str(run.dir), "global_step": global_step, "mean_return_last_20": stats.mean_recent,
               "plot": str(plot_path) if plot_path else None}
    print(f"run: {run.dir}", file=sys.stderr)
    if plot_path:
        print(f"learning curve: {plot_path}", file=sys.stderr)
    print(f"final mean return (last {len(stats.recent)} episodes): {stats.mean_recent:.1f}", file=sys.stderr)
    return summary


def config_from_dict(cls, values: dict):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in values.items() if k in names})
