"""The gymnasium faces of the task: one env (``gym.make``) and a batched ``VectorEnv``
(``gym.make_vec(..., vectorization_mode="vector_entry_point")``, what ``--backend auto`` picks).

Both take the same keyword settings, flat: any field of ``TaskConfig`` (robot, terrain,
episode_length_s, stepper, threads, ...), of ``RewardWeights`` (track_lin_vel_xy=1.5, ...), of
``Commands`` (lin_vel_x=0,1, curriculum=true, ...) or of ``Randomization`` (friction=0.4,1.0,
added_base_mass=-1,3, motor_strength=0.9,1.1, push_interval=none, obs_noise=0, action_latency=0,2).
From the command line they are ``--env-kwargs KEY=VALUE ...``; values may be strings, checked and
converted here, so a bad one is one line.

The vector env autoresets in gymnasium's NEXT_STEP mode, as every omnigym backend does: the step
that ends an episode returns its final observation; the next step ignores that env's action,
resets it and returns the reset observation with reward 0.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from omnigym.envs.locomotion.core import ACTION_LIMIT, LocomotionBatch, TaskConfig
from omnigym.envs.locomotion.robots import ROBOTS
from omnigym.envs.locomotion.sim import STEPPERS
from omnigym.envs.locomotion.task import Commands, Randomization, RewardWeights
from omnigym.errors import OmnigymError

GROUPS = MappingProxyType({"rewards": RewardWeights, "commands": Commands, "randomization": Randomization})


def task_config(**settings) -> TaskConfig:
    """A ``TaskConfig`` from flat settings (strings from the command line, or values)."""
    top = {f.name: f for f in dataclasses.fields(TaskConfig) if f.name not in GROUPS}
    owner = {f.name: group for group, cls in GROUPS.items() for f in dataclasses.fields(cls)}
    chosen: dict[str, dict] = {group: {} for group in GROUPS}
    values = {}
    for name, value in settings.items():
        if name in top:
            values[name] = _convert(name, value, top[name].type, getattr(TaskConfig, name, None))
        elif name in owner:
            cls = GROUPS[owner[name]]
            f = next(f for f in dataclasses.fields(cls) if f.name == name)
            chosen[owner[name]][name] = _convert(name, value, f.type, f.default)
        else:
            known = sorted([*top, *owner])
            raise OmnigymError(f"--env-kwargs {name}: not a setting of the locomotion task; choose from "
                               + ", ".join(known))
    cfg = TaskConfig(**values, **{group: GROUPS[group](**chosen[group]) for group in GROUPS})
    _check(cfg)
    return cfg


def _convert(name: str, value, annotation: str, default):
    text = value.strip() if isinstance(value, str) else None
    where = f"--env-kwargs {name}={value}"
    if "None" in annotation and (value is None or text in ("none", "None", "off")):
        return None
    try:
        if "tuple" in annotation:
            parts = text.split(",") if text is not None else list(value)
            kind = int if "tuple[int" in annotation else float
            result = tuple(kind(p) for p in parts)
            if len(result) != 2 or result[0] > result[1]:
                raise ValueError
            return result
        if "bool" in annotation:
            if isinstance(value, bool):
                return value
            if text.lower() in ("true", "1", "yes", "on"):
                return True
            if text.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if "float" in annotation:
            return float(value)
        if "int" in annotation:
            return int(value)
        return str(value)
    except (TypeError, ValueError):
        shape = "LOW,HIGH with LOW <= HIGH" if "tuple" in annotation else annotation.replace(" | None", " or none")
        raise OmnigymError(f"{where}: expected {shape}") from None


def _check(cfg: TaskConfig) -> None:
    def need(ok: bool, message: str) -> None:
        if not ok:
            raise OmnigymError(f"--env-kwargs {message}")

    r, c = cfg.randomization, cfg.commands
    need(cfg.robot in ROBOTS, f"robot={cfg.robot}: choose {', '.join(ROBOTS)}")
    need(cfg.terrain in ("flat", "rough"), f"terrain={cfg.terrain}: choose flat or rough")
    need(cfg.stepper in STEPPERS, f"stepper={cfg.stepper}: choose {', '.join(STEPPERS)}")
    need(cfg.threads >= 0, f"threads={cfg.threads}: must be 0 or more")
    need(cfg.sim_dt > 0 and cfg.decimation >= 1, "sim_dt must be positive and decimation at least 1")
    need(cfg.episode_length_s >= cfg.dt, f"episode_length_s={cfg.episode_length_s}: shorter than one policy step")
    need(r.friction is None or r.friction[0] > 0, f"friction={r.friction}: friction must be positive")
    need(r.motor_strength is None or r.motor_strength[0] > 0, f"motor_strength={r.motor_strength}: must be positive")
    need(r.push_interval is None or r.push_interval > 0, f"push_interval={r.push_interval}: positive seconds or none")
    need(r.push_velocity >= 0 and r.obs_noise >= 0, "push_velocity and obs_noise must be 0 or more")
    need(0 <= r.action_latency[0] and r.action_latency[1] <= cfg.decimation,
         f"action_latency={r.action_latency}: physics substeps between 0 and decimation ({cfg.decimation})")
    need(c.resampling_time > 0, f"resampling_time={c.resampling_time}: must be positive")


def _spaces(batch: LocomotionBatch):
    obs = gym.spaces.Box(-np.inf, np.inf, (batch.obs_dim,), np.float32)
    action = gym.spaces.Box(-ACTION_LIMIT, ACTION_LIMIT, (batch.nj,), np.float32)
    return obs, action


class LocomotionEnv(gym.Env):
    """One robot (the batch of one): for gymnasium's sync/async vector envs, video and eval."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 50}

    def __init__(self, render_mode: str | None = None, **settings):
        self.cfg = task_config(**{"stepper": "loop", **settings})  # one env: no thread pool
        self.batch = LocomotionBatch(1, self.cfg)
        self.observation_space, self.action_space = _spaces(self.batch)
        self.render_mode = render_mode
        self.metadata = {**self.metadata, "render_fps": int(round(1 / self.cfg.dt))}
        self._renderer = self._data = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None or not hasattr(self, "_seeded"):
            self.batch.seed(seed)
            self._seeded = True
        return self.batch.reset(np.array([0]))[0], {}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.batch.step(np.asarray(action)[None])
        return obs[0], float(reward[0]), bool(terminated[0]), bool(truncated[0]), {k: v[0] for k, v in info.items()}

    def render(self):
        import mujoco

        if self._renderer is None:
            model = self.batch.models[0]
            self._renderer, self._data = mujoco.Renderer(model, 240, 320), mujoco.MjData(model)
            self._camera = mujoco.MjvCamera()
            self._camera.distance, self._camera.elevation, self._camera.azimuth = 1.6, -20.0, 120.0
        self._data.qpos[:] = self.batch.stepper.qpos[0]
        mujoco.mj_forward(self.batch.models[0], self._data)
        self._camera.lookat[:] = self._data.qpos[:3]  # follow the base
        self._renderer.update_scene(self._data, self._camera)
        return self._renderer.render()

    def close(self):
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        self.batch.close()


class LocomotionVectorEnv(gym.vector.VectorEnv):
    """N robots stepped together (sim.py's stepper: mujoco.rollout by default)."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, num_envs: int, render_mode: str | None = None, **settings):
        if render_mode is not None:
            raise OmnigymError("the batched locomotion env does not render; video runs on --backend sync")
        self.cfg = task_config(**settings)
        self.batch = LocomotionBatch(num_envs, self.cfg)
        self.num_envs = num_envs
        self.single_observation_space, self.single_action_space = _spaces(self.batch)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self._autoreset = np.zeros(num_envs, bool)
        self._seeded = False

    def reset(self, *, seed=None, options=None):
        if isinstance(seed, (list, tuple)):
            seed = seed[0]
        if seed is not None or not self._seeded:
            self.batch.seed(seed)
            self._seeded = True
        self._autoreset[:] = False
        return self.batch.reset(np.arange(self.num_envs)), {}

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.batch.step(np.asarray(actions, dtype=np.float64))
        restarted = self._autoreset
        if restarted.any():  # NEXT_STEP: these envs ended last step; this step resets them instead
            reset_obs = self.batch.reset(restarted)
            obs[restarted] = reset_obs[restarted]
            reward[restarted], terminated[restarted], truncated[restarted] = 0.0, False, False
            for key in info:
                info[key][restarted] = 0
        self._autoreset = terminated | truncated
        info = {**info, **{f"_{key}": np.ones(self.num_envs, bool) for key in info}}
        return obs, reward, terminated, truncated, info

    def close_extras(self, **kwargs):
        self.batch.close()
