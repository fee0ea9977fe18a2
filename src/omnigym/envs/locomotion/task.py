"""The velocity-tracking task as data: reward weights, commands, randomization, and the terms.

Everything a user (or another backend, e.g. mjlab's) needs to reproduce the task is in the three
dataclasses below, plain values with their sources:

- ``RewardWeights``: legged_gym's ``LeggedRobotCfg.rewards.scales`` (Rudin et al., 2021), with
  the Go2 values of unitree_rl_gym's ``go2_config.py`` and the flat-orientation term of Isaac
  Lab's ``velocity/config/*/flat_env_cfg.py``. As in both projects, each term is multiplied by the
  policy step (0.02 s), and (legged_gym's ``only_positive_rewards``) the sum is clipped at 0.
- ``Commands``: legged_gym's ``commands.ranges`` and ``resampling_time``, with its curriculum.
- ``Randomization``: the sim-to-real flags, with legged_gym's defaults where it has them.

The reward terms are plain functions of batched numpy arrays (N envs), tested on hand-set states.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import MappingProxyType

import numpy as np


@dataclass(frozen=True)
class RewardWeights:
    """Weight per term (per second: multiplied by the 0.02 s policy step)."""

    track_lin_vel_xy: float = 1.0      # legged_gym tracking_lin_vel 1.0; Isaac Lab track_lin_vel_xy_exp 1.0
    track_ang_vel_z: float = 0.5       # legged_gym tracking_ang_vel 0.5; Isaac Lab track_ang_vel_z_exp 0.5
    lin_vel_z: float = -2.0            # legged_gym / Isaac Lab lin_vel_z(_l2) -2.0
    ang_vel_xy: float = -0.05          # legged_gym / Isaac Lab ang_vel_xy(_l2) -0.05
    flat_orientation: float = -5.0     # Isaac Lab flat_env_cfg flat_orientation_l2 -5.0 (legged_gym orientation 0)
    torques: float = -2e-4             # unitree_rl_gym go2 torques -0.0002 (legged_gym -1e-5)
    joint_acc: float = -2.5e-7         # legged_gym dof_acc / Isaac Lab dof_acc_l2 -2.5e-7
    action_rate: float = -0.01         # legged_gym action_rate / Isaac Lab action_rate_l2 -0.01
    joint_pos_limits: float = -10.0    # unitree_rl_gym go2 dof_pos_limits -10.0 (soft limit 0.9)
    feet_air_time: float = 1.0         # legged_gym feet_air_time 1.0 (threshold 0.5 s)
    undesired_contacts: float = -1.0   # legged_gym collision / Isaac Lab undesired_contacts -1.0 (thighs, calves)
    termination: float = 0.0           # legged_gym termination -0.0 (the clip at 0 already makes falling costly)

    tracking_sigma: float = 0.25       # legged_gym tracking_sigma: exp(-error^2 / 0.25)
    air_time_threshold: float = 0.5    # legged_gym: reward steps longer than 0.5 s
    only_positive_rewards: bool = True  # legged_gym: clip the step's sum at 0, so early falls are not a way out


@dataclass(frozen=True)
class Commands:
    """Commanded base velocity (vx, vy in m/s, yaw rate in rad/s), sampled uniformly."""

    lin_vel_x: tuple[float, float] = (-1.0, 1.0)   # legged_gym commands.ranges
    lin_vel_y: tuple[float, float] = (-1.0, 1.0)
    ang_vel_yaw: tuple[float, float] = (-1.0, 1.0)
    resampling_time: float = 10.0                  # legged_gym: new command every 10 s (and at each reset)
    small_to_zero: float = 0.2                     # legged_gym: |v_xy| below 0.2 m/s is commanded as standing
    curriculum: bool = False                       # legged_gym commands.curriculum (off by default there)
    curriculum_start: float = 0.5                  # |vx| range the curriculum starts from (m/s)
    curriculum_step: float = 0.5                   # legged_gym: widen by 0.5 m/s ...
    curriculum_threshold: float = 0.8              # ... when tracking reward > 0.8 of its maximum


@dataclass(frozen=True)
class Randomization:
    """Sim-to-real: what the real robot differs in. Sampled per env when the envs are seeded
    (legged_gym and Isaac Lab sample friction and mass once, at startup), pushes during episodes."""

    friction: tuple[float, float] | None = (0.5, 1.25)    # legged_gym randomize_friction True, friction_range
    added_base_mass: tuple[float, float] | None = None    # legged_gym randomize_base_mass False, range [-1, 1] kg
    motor_strength: tuple[float, float] | None = None     # PD gains scaled per motor (walk-these-ways [0.9, 1.1])
    push_interval: float | None = 15.0                     # legged_gym push_robots True, push_interval_s 15
    push_velocity: float = 1.0                             # legged_gym max_push_vel_xy 1.0 m/s (base xy velocity set)
    obs_noise: float = 1.0                                 # legged_gym noise_level 1.0 x Isaac Lab's per-term noise
    action_latency: tuple[int, int] = (0, 0)               # physics substeps (5 ms) the new action waits, per episode

    def off(self) -> "Randomization":
        return Randomization(friction=None, push_interval=None, obs_noise=0.0)


# Isaac Lab's velocity task, observations.policy noise (uniform +-): base_lin_vel 0.1, base_ang_vel 0.2,
# projected_gravity 0.05, joint_pos 0.01, joint_vel 1.5, height_scan 0.1; commands and actions are exact.
OBS_NOISE = MappingProxyType({"lin_vel": 0.1, "ang_vel": 0.2, "gravity": 0.05, "commands": 0.0, "joint_pos": 0.01,
                              "joint_vel": 1.5, "last_action": 0.0, "height_scan": 0.1})


def as_dict(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


@dataclass
class StepState:
    """What the reward terms read, batched over N envs (body frame unless said)."""

    lin_vel: np.ndarray         # (N, 3) base linear velocity
    ang_vel: np.ndarray         # (N, 3) base angular velocity
    gravity: np.ndarray         # (N, 3) gravity direction in the base frame (0, 0, -1 upright)
    command: np.ndarray         # (N, 3) vx, vy, yaw rate
    joint_pos: np.ndarray       # (N, J)
    joint_vel: np.ndarray       # (N, J)
    joint_acc: np.ndarray       # (N, J)
    torques: np.ndarray         # (N, J)
    action: np.ndarray          # (N, J)
    last_action: np.ndarray     # (N, J)
    soft_limits: np.ndarray     # (J, 2)
    first_contact: np.ndarray   # (N, F) bool: the foot touched down this step
    air_time: np.ndarray        # (N, F) seconds the foot had been in the air when it touched down
    undesired_contacts: np.ndarray  # (N,) count of thigh/calf contacts with the floor
    terminated: np.ndarray      # (N,) bool
    extras: dict = field(default_factory=dict)


def reward_terms(s: StepState, w: RewardWeights) -> dict[str, np.ndarray]:
    """Each term's unweighted value, (N,)."""
    lin_error = np.sum((s.command[:, :2] - s.lin_vel[:, :2]) ** 2, 1)
    yaw_error = (s.command[:, 2] - s.ang_vel[:, 2]) ** 2
    below = np.clip(s.soft_limits[:, 0] - s.joint_pos, 0, None)
    above = np.clip(s.joint_pos - s.soft_limits[:, 1], 0, None)
    moving = np.linalg.norm(s.command[:, :2], axis=1) > 0.1  # legged_gym: no air-time reward for standing still
    return {
        "track_lin_vel_xy": np.exp(-lin_error / w.tracking_sigma),
        "track_ang_vel_z": np.exp(-yaw_error / w.tracking_sigma),
        "lin_vel_z": s.lin_vel[:, 2] ** 2,
        "ang_vel_xy": np.sum(s.ang_vel[:, :2] ** 2, 1),
        "flat_orientation": np.sum(s.gravity[:, :2] ** 2, 1),
        "torques": np.sum(s.torques ** 2, 1),
        "joint_acc": np.sum(s.joint_acc ** 2, 1),
        "action_rate": np.sum((s.action - s.last_action) ** 2, 1),
        "joint_pos_limits": np.sum(below + above, 1),
        "feet_air_time": np.sum((s.air_time - w.air_time_threshold) * s.first_contact, 1) * moving,
        "undesired_contacts": s.undesired_contacts.astype(float),
        "termination": s.terminated.astype(float),
    }


def total_reward(terms: dict[str, np.ndarray], w: RewardWeights, dt: float) -> np.ndarray:
    """Sum of weight x term x dt; clipped at 0 with ``only_positive_rewards``."""
    total = sum(getattr(w, name) * value * dt for name, value in terms.items() if name != "termination")
    if w.only_positive_rewards:
        total = np.clip(total, 0.0, None)
    return total + w.termination * terms["termination"]  # legged_gym adds termination after the clip


def quat_rotate_inverse(quat: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """World vectors (N, 3) in the frames of unit quaternions (N, 4), MuJoCo's (w, x, y, z) order."""
    w, xyz = quat[:, :1], quat[:, 1:]
    t = 2.0 * _cross(xyz, vec)
    return vec - w * t + _cross(xyz, t)


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.cross`` of (N, 3) rows, the same products and differences: np.cross moves axes and
    checks shapes on every call, which cost more than the arithmetic on a policy step's few rows
    (quat_rotate_inverse runs four times a step: 5% of a Go2 PPO run's CPU under cProfile, now a quarter of it)."""
    a0, a1, a2 = a[:, 0], a[:, 1], a[:, 2]
    b0, b1, b2 = b[:, 0], b[:, 1], b[:, 2]
    out = np.empty((len(a), 3))
    out[:, 0] = a1 * b2 - a2 * b1
    out[:, 1] = a2 * b0 - a0 * b2
    out[:, 2] = a0 * b1 - a1 * b0
    return out


def yaw_of(quat: np.ndarray) -> np.ndarray:
    w, x, y, z = quat.T
    return np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))
