"""The velocity task on N worlds at once: reset, step, observe, reward, end episodes.

``LocomotionBatch`` has no autoreset (the gymnasium classes in env.py add it) and no Python loop
over envs on the step path: one stepper call for all physics, numpy for everything else.
Per policy step (legged_gym's ``post_physics_step`` order): physics (``decimation`` substeps of
the PD inside MuJoCo), contacts and feet air time, terminations, rewards, command resampling,
pushes, then the observation (with noise):

    base lin vel (3), base ang vel (3), projected gravity (3), command (3),
    joint pos - default (12), joint vel (12), last action (12), [height scan (187), rough only]
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from omnigym.envs.locomotion.robots import build_model
from omnigym.envs.locomotion.sim import STEPPERS
from omnigym.envs.locomotion.task import (OBS_NOISE, Commands, Randomization, RewardWeights, StepState,
                                          quat_rotate_inverse, reward_terms, total_reward, yaw_of)
from omnigym.envs.locomotion.terrain import Heightfield

ACTION_LIMIT = 5.0
"""actions are clipped to +-5 (x 0.25 = 1.25 rad around the default pose; legged_gym clips at 100)"""
TILT_LIMIT = 1.0
"""radians from upright past which the robot counts as fallen (besides its base touching the floor)"""


@dataclass(frozen=True)
class TaskConfig:
    robot: str = "go2"
    terrain: str = "flat"
    """flat (a plane) or rough (terrain.py's heightfield, with the height scan observed)"""
    episode_length_s: float = 20.0      # legged_gym / Isaac Lab episode_length_s 20
    sim_dt: float = 0.005               # legged_gym / Isaac Lab sim dt
    decimation: int = 4                 # -> 50 Hz policy
    stepper: str = "rollout"
    threads: int = 2
    """mujoco.rollout's thread pool size"""
    rewards: RewardWeights = field(default_factory=RewardWeights)
    commands: Commands = field(default_factory=Commands)
    randomization: Randomization = field(default_factory=Randomization)

    @property
    def dt(self) -> float:
        return self.sim_dt * self.decimation


class LocomotionBatch:
    def __init__(self, num_envs: int, cfg: TaskConfig):
        self.n, self.cfg = num_envs, cfg
        self.terrain = Heightfield() if cfg.terrain == "rough" else None
        self.robot = build_model(cfg.robot, self.terrain, cfg.sim_dt)
        base = self.robot.model
        self.models = [copy.copy(base) for _ in range(num_envs)]
        self.stepper = STEPPERS[cfg.stepper](self.models, cfg.threads)
        self.nj = len(self.robot.joint_names)
        self.nfeet = self.robot.sensors["feet"].stop
        self.max_steps = int(round(cfg.episode_length_s / cfg.dt))
        self.obs_dim = 12 + 3 * self.nj + (187 if self.terrain is not None else 0)
        self.rng = np.random.default_rng()
        self._base_params = (base.geom_friction.copy(), base.body_mass.copy(), base.actuator_gainprm.copy(),
                             base.actuator_biasprm.copy())
        z = np.zeros
        self.command, self.action, self.last_action = z((num_envs, 3)), z((num_envs, self.nj)), z((num_envs, self.nj))
        self.joint_vel, self.air_time = z((num_envs, self.nj)), z((num_envs, self.nfeet))
        self.last_contact = z((num_envs, self.nfeet), bool)
        self.steps, self.latency = z(num_envs, int), z(num_envs, int)
        self.lin_vel_x_range = (cfg.commands.lin_vel_x if not cfg.commands.curriculum else
                                (-cfg.commands.curriculum_start, cfg.commands.curriculum_start))
        self._tracking_sum = z(num_envs)
        self.noise_scale = self._noise_scale()

    # --- seeding, randomization, resets -------------------------------------------------------
    def seed(self, seed: int | None) -> None:
        """A new generator, and the per-env physical parameters drawn from it (startup randomization)."""
        self.rng = np.random.default_rng(seed)
        self.randomize_models()

    def randomize_models(self, env_ids=None) -> None:
        r, (friction, mass, gain, bias) = self.cfg.randomization, self._base_params
        base_body = self.robot.base_body
        for i in range(self.n) if env_ids is None else env_ids:
            model = self.models[i]
            model.geom_friction[:] = friction
            if r.friction is not None:  # every geom's sliding friction, floor included: the contact's is their max
                model.geom_friction[:, 0] = self.rng.uniform(*r.friction)
            model.body_mass[:] = mass
            if r.added_base_mass is not None:
                model.body_mass[base_body] += self.rng.uniform(*r.added_base_mass)
            model.actuator_gainprm[:] = gain
            model.actuator_biasprm[:] = bias
            if r.motor_strength is not None:  # kp and kv scaled together: the PD torque scales, limits stay
                strength = self.rng.uniform(*r.motor_strength, size=self.nj)
                model.actuator_gainprm[:, 0] *= strength
                model.actuator_biasprm[:, 1:3] *= strength[:, None]

    def reset(self, ids: np.ndarray) -> np.ndarray:
        """Puts envs ``ids`` (a bool mask or indices) back at the standing pose; their observations."""
        ids = np.flatnonzero(ids) if np.asarray(ids).dtype == bool else np.asarray(ids)
        if len(ids) == 0:
            return self.observe()
        qpos = np.repeat(self.robot.default_qpos[None], len(ids), 0)
        self.stepper.set_state(ids, qpos, np.zeros((len(ids), self.models[0].nv)))
        for name in ("action", "last_action", "joint_vel", "air_time"):
            getattr(self, name)[ids] = 0.0
        self.last_contact[ids] = False
        self.steps[ids] = 0
        self._tracking_sum[ids] = 0.0
        low, high = self.cfg.randomization.action_latency
        self.latency[ids] = self.rng.integers(low, high + 1, size=len(ids))
        self.resample_commands(ids)
        return self.observe()

    def resample_commands(self, ids: np.ndarray) -> None:
        c = self.cfg.commands
        k = len(ids)
        command = np.stack([self.rng.uniform(*self.lin_vel_x_range, size=k), self.rng.uniform(*c.lin_vel_y, size=k),
                            self.rng.uniform(*c.ang_vel_yaw, size=k)], 1)
        small = np.linalg.norm(command[:, :2], axis=1) < c.small_to_zero
        command[small, :2] = 0.0
        self.command[ids] = command

    # --- stepping -----------------------------------------------------------------------------
    def step(self, actions: np.ndarray):
        """(obs, reward, terminated, truncated, info); ended envs are not reset here."""
        cfg, robot = self.cfg, self.robot
        self.last_action[:] = self.action
        self.action[:] = np.clip(actions, -ACTION_LIMIT, ACTION_LIMIT)
        target = robot.default_joint_pos + robot.robot.action_scale * self.action
        previous = robot.default_joint_pos + robot.robot.action_scale * self.last_action
        substep = np.arange(cfg.decimation)[None, :, None]
        controls = np.where(substep < self.latency[:, None, None], previous[:, None], target[:, None])
        sensors = self.stepper.step(controls)
        self.steps += 1

        s = robot.sensors
        contact = sensors[:, :, s["feet"]].max(1) > 0
        first_contact = (self.air_time > 0) & (contact | self.last_contact)  # legged_gym's filtered contact
        self.air_time += cfg.dt
        air_time = self.air_time.copy()
        self.air_time[contact | self.last_contact] = 0.0
        self.last_contact = contact
        undesired = (sensors[:, :, s["undesired"]].max(1) > 0).sum(1)
        base_contact = sensors[:, :, s["base"]].max(1)[:, 0] > 0

        qpos, qvel = self.stepper.qpos, self.stepper.qvel
        quat = qpos[:, 3:7]
        gravity = quat_rotate_inverse(quat, np.broadcast_to([0.0, 0.0, -1.0], (self.n, 3)))
        joint_vel = qvel[:, 6:]
        tilted = gravity[:, 2] > -np.cos(TILT_LIMIT)
        terminated = base_contact | tilted
        truncated = self.steps >= self.max_steps
        if self.terrain is not None:
            truncated |= ~self.terrain.inside(qpos[:, :2])
        state = StepState(
            lin_vel=quat_rotate_inverse(quat, qvel[:, :3]), ang_vel=qvel[:, 3:6], gravity=gravity,
            command=self.command.copy(), joint_pos=qpos[:, 7:], joint_vel=joint_vel,
            joint_acc=(joint_vel - self.joint_vel) / cfg.dt, torques=sensors[:, -1, s["torque"]],
            action=self.action, last_action=self.last_action, soft_limits=robot.soft_limits,
            first_contact=first_contact, air_time=air_time, undesired_contacts=undesired, terminated=terminated)
        self.joint_vel[:] = joint_vel
        terms = reward_terms(state, cfg.rewards)
        reward = total_reward(terms, cfg.rewards, cfg.dt)
        self._tracking_sum += terms["track_lin_vel_xy"]
        if cfg.commands.curriculum:
            self._update_curriculum(terminated | truncated)

        every = int(round(cfg.commands.resampling_time / cfg.dt))
        self.resample_commands(np.flatnonzero(self.steps % every == 0))
        self._push()
        info = {"command": state.command, "base_lin_vel": state.lin_vel, "base_ang_vel": state.ang_vel,
                "fell": terminated.copy()}
        return self.observe(), reward, terminated, truncated, info

    def _push(self) -> None:
        r = self.cfg.randomization
        if r.push_interval is None:
            return
        pushed = np.flatnonzero(self.steps % max(int(round(r.push_interval / self.cfg.dt)), 1) == 0)
        if len(pushed):
            qvel = self.stepper.qvel[pushed].copy()
            qvel[:, :2] = self.rng.uniform(-r.push_velocity, r.push_velocity, size=(len(pushed), 2))
            self.stepper.set_state(pushed, self.stepper.qpos[pushed].copy(), qvel)

    def _update_curriculum(self, ended: np.ndarray) -> None:
        """legged_gym's ``update_command_curriculum``: widen vx's range by 0.5 m/s (up to the
        configured range) once the finished episodes tracked it at > 80% of the maximum."""
        c = self.cfg.commands
        if not ended.any():
            return
        tracking = np.mean(self._tracking_sum[ended] / np.maximum(self.steps[ended], 1))
        if tracking > c.curriculum_threshold:
            low, high = self.lin_vel_x_range
            self.lin_vel_x_range = (max(low - c.curriculum_step, c.lin_vel_x[0]),
                                    min(high + c.curriculum_step, c.lin_vel_x[1]))

    # --- observations -------------------------------------------------------------------------
    def _noise_scale(self) -> np.ndarray:
        parts = [("lin_vel", 3), ("ang_vel", 3), ("gravity", 3), ("commands", 3), ("joint_pos", self.nj),
                 ("joint_vel", self.nj), ("last_action", self.nj)]
        if self.terrain is not None:
            parts.append(("height_scan", 187))
        return self.cfg.randomization.obs_noise * np.concatenate([np.full(k, OBS_NOISE[name]) for name, k in parts])

    def observe(self) -> np.ndarray:
        qpos, qvel = self.stepper.qpos, self.stepper.qvel
        quat = qpos[:, 3:7]
        gravity = quat_rotate_inverse(quat, np.broadcast_to([0.0, 0.0, -1.0], (self.n, 3)))
        parts = [quat_rotate_inverse(quat, qvel[:, :3]), qvel[:, 3:6], gravity, self.command,
                 qpos[:, 7:] - self.robot.default_joint_pos, qvel[:, 6:], self.action]
        if self.terrain is not None:
            parts.append(self.terrain.scan(qpos[:, :3], yaw_of(quat)))
        obs = np.concatenate(parts, 1)
        if self.noise_scale.any():
            obs = obs + self.rng.uniform(-1.0, 1.0, size=obs.shape) * self.noise_scale
        return obs.astype(np.float32)

    # --- checkpoints: the numbers, not 64 MjModels (a resumed run rebuilds those) -------------
    RANDOMIZED = ("geom_friction", "body_mass", "actuator_gainprm", "actuator_biasprm")

    def __getstate__(self) -> dict:
        keep = {k: v for k, v in self.__dict__.items() if k not in ("models", "stepper", "robot", "terrain")}
        keep["_physics"] = (self.stepper.qpos.copy(), self.stepper.qvel.copy())
        keep["_params"] = {name: np.stack([getattr(m, name) for m in self.models]) for name in self.RANDOMIZED}
        return keep

    def __setstate__(self, state: dict) -> None:
        physics, params = state.pop("_physics"), state.pop("_params")
        self.__init__(state["n"], state["cfg"])
        self.__dict__.update(state)
        for i, model in enumerate(self.models):
            for name, values in params.items():
                getattr(model, name)[:] = values[i]
        self.stepper.set_state(np.arange(self.n), *physics)

    def close(self) -> None:
        self.stepper.close()
