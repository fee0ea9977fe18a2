"""The flags every algorithm shares, and reading a saved config back.

Each algorithm has one config dataclass that extends ``RunConfig`` (language) or
``ControlConfig`` (gymnasium envs); the CLI is generated from it by tyro.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from omnigym.errors import require


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
    """torch intra-op threads while the run trains (0 leaves torch's setting alone); 1 is fastest
    for small networks on a shared CPU"""
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
class ControlConfig(RunConfig):
    """Flags of the control algorithms: the env, its vectorization, the step budget."""

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


def config_from_dict(cls, values: dict):
    """A config of class ``cls`` from a saved ``config.json`` (unknown keys are ignored)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in values.items() if k in names})


def check_control(cfg: ControlConfig) -> None:
    """Range checks every control run makes before it touches the run directory."""
    require(cfg.total_timesteps > 0, f"total_timesteps must be positive, got {cfg.total_timesteps}")
