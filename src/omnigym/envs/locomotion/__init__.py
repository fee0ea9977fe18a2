"""Legged locomotion the Isaac Lab way, on plain MuJoCo: velocity tracking for MuJoCo Menagerie's
quadrupeds (docs/robots.md).

    robots.py   Menagerie model -> scene with PD position actuators and contact sensors
    task.py     reward weights, commands, randomization (plain dataclasses) and the reward terms
    terrain.py  the rough heightfield and the height scan
    sim.py      the batched steppers (mujoco.rollout, or a loop of mj_step)
    core.py     the task on N worlds: reset, step, observe
    env.py      gymnasium's single env and the batched VectorEnv

Importing this package registers the task ids and imports nothing heavy (mujoco loads when an env
is made).
"""

from __future__ import annotations

from types import MappingProxyType

import gymnasium as gym

TASK_IDS = MappingProxyType({
    "omnigym/Go2-Velocity-Flat-v0": {"robot": "go2", "terrain": "flat"},
    "omnigym/Go2-Velocity-Rough-v0": {"robot": "go2", "terrain": "rough"},
})
FAMILY = "locomotion"


def register() -> None:
    for env_id, kwargs in TASK_IDS.items():
        if env_id not in gym.registry:
            gym.register(env_id, entry_point="omnigym.envs.locomotion.env:LocomotionEnv",
                         vector_entry_point="omnigym.envs.locomotion.env:LocomotionVectorEnv", kwargs=kwargs)


def is_locomotion(env_id) -> bool:
    return isinstance(env_id, str) and env_id in TASK_IDS
