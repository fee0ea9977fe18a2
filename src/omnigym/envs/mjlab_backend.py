"""``--backend mjlab``: mjlab's GPU-batched tasks (Isaac Lab's manager API on MuJoCo Warp) as
a gymnasium ``VectorEnv``, behind the ``[gpu-sim]`` extra; it needs an NVIDIA GPU.

mjlab keeps its own task registry (``mjlab.tasks.registry``: ids such as
``Mjlab-Velocity-Flat-Unitree-Go1``), not gymnasium's. A task is an env config
(``load_env_cfg``) that ``ManagerBasedRlEnv(cfg, device)`` builds into ``cfg.scene.num_envs``
envs stepped together on the GPU. Its ``step(actions)`` takes a torch tensor and returns torch
tensors on the GPU: an observation dict by group (``actor``: what the policy sees, ``critic``:
privileged terms), rewards (scaled by the control dt), ``terminated`` and ``truncated`` (time
outs), and ``extras``. Any ``Mjlab-...`` id runs as it is; omnigym's locomotion ids map to
mjlab's velocity task on the same terrain. mjlab ships the Unitree Go1, not the Go2, so those
runs train a Go1 (one line says so), and their observation layout is mjlab's, not omnigym's.

How the step semantics map. mjlab resets a finished env inside the same ``step`` by default,
returning its reset observation and dropping the terminal one. omnigym's vector envs reset on
the NEXT step (envs/vector.py): the step that ends an episode returns its true terminal
observation, the following step returns the reset observation with reward 0, not done, and
ignores that env's action. The adapter builds the env with ``auto_reset=False`` (mjlab then
returns the terminal observation and refuses to step until those envs are reset) and, on the
step after an episode ended: resets those envs (``reset(env_ids=...)``), steps all envs
together (mjlab cannot step a subset), then resets the finished ones again, and returns their
fresh reset observations with reward 0 and no done flag, the other envs' rows as the step gave
them. The finished envs' one simulated step in between is thrown away, so what a policy sees
is exactly gymnasium's NEXT_STEP; the cost is one extra reset of the finished envs and a
physics step they waste. mjlab's own episode logs (``extras["log"]``) count that thrown-away
step as a one-step episode; omnigym's episode statistics (``RecordEpisodeStatistics``) do not.

Observations come back as float32 numpy arrays on the CPU and actions go to the GPU as a
tensor, one copy each way per step (4096 envs x 48 floats is 0.8 MB): omnigym's algorithms
work on numpy batches. The critic's privileged group is left out (omnigym's PPO is not
asymmetric). docs/gpu_sim.md says what was run and what was not (no GPU was lent).
"""

from __future__ import annotations

import difflib
import importlib.util
from types import MappingProxyType

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from omnigym.errors import OmnigymError, missing_extra

LOCOMOTION_TASKS = MappingProxyType({
    "omnigym/Go2-Velocity-Flat-v0": "Mjlab-Velocity-Flat-Unitree-Go1",
    "omnigym/Go2-Velocity-Rough-v0": "Mjlab-Velocity-Rough-Unitree-Go1",
})
"""omnigym's locomotion ids and mjlab's velocity task on the same terrain"""
POLICY_GROUP = "actor"
"""mjlab's observation group the policy reads (its velocity tasks'; a task without one gives its first)"""


def _box(space, bound: float | None = None) -> gym.spaces.Box:
    """An mjlab space (shape, dtype, low, high; mjlab.utils.spaces) as a gymnasium Box."""
    low, high = (-bound, bound) if bound is not None else (getattr(space, "low", -np.inf), getattr(space, "high", np.inf))
    return gym.spaces.Box(np.float32(low) if np.isscalar(low) else np.asarray(low, np.float32),
                          np.float32(high) if np.isscalar(high) else np.asarray(high, np.float32),
                          tuple(space.shape), np.float32)


class MjlabVectorEnv(gym.vector.VectorEnv):
    """An mjlab ``ManagerBasedRlEnv`` (built with ``auto_reset=False``) as a NEXT_STEP
    ``VectorEnv`` of numpy batches. ``clip_actions``: the Box bound the task's RL config
    clips actions to (rsl_rl's ``clip_actions``), or None for mjlab's unbounded actions."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, env, clip_actions: float | None = None, group: str = POLICY_GROUP):
        if getattr(env.cfg, "auto_reset", False):
            raise ValueError("MjlabVectorEnv needs an env built with cfg.auto_reset = False")
        self.env, self.clip_actions = env, clip_actions
        groups = env.single_observation_space.spaces
        self.group = group if group in groups else next(iter(groups))
        if getattr(groups[self.group], "spaces", None) is not None:  # a group whose terms are not concatenated
            raise OmnigymError(f"mjlab's observation group {self.group!r} is a dict of terms; omnigym's networks take "
                               "one array: set concatenate_terms=True in the task's ObservationGroupCfg")
        self.num_envs = env.num_envs
        self.device = torch.device(env.device)
        self.single_observation_space = _box(groups[self.group])
        self.single_action_space = _box(env.single_action_space, clip_actions)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self._ended = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)

    def _numpy(self, obs: dict) -> np.ndarray:
        return obs[self.group].detach().to("cpu", torch.float32).numpy()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, _ = self.env.reset(seed=seed)
        self._ended.zero_()
        return self._numpy(obs), {}

    def step(self, actions):
        actions = torch.as_tensor(np.asarray(actions), dtype=torch.float32, device=self.device)
        if self.clip_actions is not None:
            actions = actions.clamp(-self.clip_actions, self.clip_actions)
        ended = self._ended
        ids = ended.nonzero(as_tuple=False).squeeze(-1)
        if len(ids):  # mjlab steps no env it left at its terminal state
            self.env.reset(env_ids=ids)
        obs, rewards, terminated, truncated, _ = self.env.step(actions)
        obs = {self.group: obs[self.group].clone()}  # kept apart from what the reset below recomputes
        if len(ids):  # the autoreset step: fresh reset observations, reward 0, not done
            reset_obs, _ = self.env.reset(env_ids=ids)
            rows = ended.view(-1, *[1] * (obs[self.group].dim() - 1))
            obs[self.group] = torch.where(rows, reset_obs[self.group], obs[self.group])
            rewards = rewards.masked_fill(ended, 0.0)
            terminated, truncated = terminated & ~ended, truncated & ~ended
        self._ended = terminated | truncated
        return (self._numpy(obs), rewards.detach().to("cpu", torch.float64).numpy(),
                terminated.cpu().numpy(), truncated.cpu().numpy(), {})

    @property
    def step_dt(self) -> float:
        """seconds of simulated time per step (the control period)"""
        return float(self.env.step_dt)

    @property
    def max_episode_steps(self) -> int:
        return int(self.env.max_episode_length)

    def base_lin_vel(self) -> np.ndarray:
        """The robot's base linear velocity in its own frame (num_envs x 3), as the velocity
        command is given: what a tracking evaluation compares with the command."""
        return self.env.scene["robot"].data.root_link_lin_vel_b.detach().to("cpu", torch.float64).numpy()

    def close(self, **kwargs):
        self.env.close()


def check_available(device="cuda:0") -> str:
    """mjlab installed and ``device`` one it can run on (a CUDA GPU torch sees, or the CPU), as a
    torch device string; else one line naming what is wrong. ``device="cpu"`` (``--env-kwargs
    device=cpu``) runs Warp's CPU kernels: the same task and adapter, ~94 env steps/s with 8 envs
    on 2 cores (too slow to train; the tests use it)."""
    if importlib.util.find_spec("mjlab") is None:
        raise missing_extra("mjlab", "gpu-sim")
    try:  # a name, not a bare GPU index (torch versions read 0 differently)
        parsed = torch.device(device) if isinstance(device, (str, torch.device)) else None
    except (RuntimeError, TypeError, ValueError):
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise OmnigymError(f"--backend mjlab runs on cuda, cuda:N or cpu (Warp's devices); got device={device!r}")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise OmnigymError("--backend mjlab needs an NVIDIA GPU with CUDA (mjlab runs on MuJoCo Warp); torch sees none "
                           "here; use the CPU backends (--backend auto)")
    if parsed.type == "cuda" and (parsed.index or 0) >= torch.cuda.device_count():
        raise OmnigymError(f"device={device!r}: torch sees {torch.cuda.device_count()} CUDA GPU(s) here, "
                           f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return str(parsed)


def mjlab_task(env_id) -> str:
    """The mjlab task id for ``env_id``, saying so in one line where it is a stand-in."""
    if not isinstance(env_id, str):
        raise OmnigymError(f"--backend mjlab runs mjlab's task ids (Mjlab-...) and {', '.join(LOCOMOTION_TASKS)}; "
                           f"got {env_id!r}")
    if env_id in LOCOMOTION_TASKS:
        task = LOCOMOTION_TASKS[env_id]
        print(f"mjlab ships the Unitree Go1, not the Go2: --backend mjlab runs {task} for {env_id}", flush=True)
        return task
    return env_id


def fix_command(cfg, command: tuple[float, float, float]) -> None:
    """A velocity task's config changed so every env tracks one body-frame ``command`` (vx, vy,
    yaw rate) for its whole episode: no resampling, no standing, heading or forward-only envs,
    no command curriculum (it would widen the ranges again). For tracking evaluations."""
    twist = cfg.commands.get("twist") if isinstance(getattr(cfg, "commands", None), dict) else None
    if twist is None or not hasattr(twist, "ranges"):
        raise OmnigymError("--command evaluates velocity tasks; this mjlab task has no 'twist' velocity command")
    vx, vy, yaw = command
    twist.ranges.lin_vel_x, twist.ranges.lin_vel_y, twist.ranges.ang_vel_z = (vx, vx), (vy, vy), (yaw, yaw)
    twist.heading_command, twist.ranges.heading, twist.resampling_time_range = False, None, (1e9, 1e9)
    for share in ("rel_standing_envs", "rel_heading_envs", "rel_forward_envs", "rel_world_envs", "init_velocity_prob"):
        setattr(twist, share, 0.0)
    cfg.curriculum.pop("command_vel", None)


def make_mjlab_vec(env_id, num_envs: int, seed: int | None = None, video_dir: str | None = None,
                   device: str = "cuda:0", command: tuple[float, float, float] | None = None) -> MjlabVectorEnv:
    """``num_envs`` envs of the mjlab task for ``env_id`` on ``device`` (from Python:
    ``make_vec(id, n, backend="mjlab", device="cuda:1")``; the command line uses the first GPU,
    or the one ``--env-kwargs device=...`` names). ``command``: one fixed velocity command
    (``fix_command``), for tracking evaluations."""
    if video_dir is not None:
        raise OmnigymError("--capture-video does not record --backend mjlab runs (mjlab renders its own videos: "
                           "mjlab's play script)")
    device = check_available(device)
    task = mjlab_task(env_id)
    import mjlab.tasks  # noqa: F401  (registers mjlab's own tasks)
    import warp
    from mjlab.envs import ManagerBasedRlEnv
    from mjlab.tasks.registry import list_tasks, load_env_cfg, load_rl_cfg

    if task not in list_tasks():
        close = difflib.get_close_matches(task, list_tasks(), n=3, cutoff=0.5)
        raise OmnigymError(f"unknown mjlab task {task!r}; " + (f"closest: {', '.join(close)}" if close else
                                                                f"mjlab has {', '.join(list_tasks())}"))
    cfg = load_env_cfg(task)
    cfg.scene.num_envs, cfg.auto_reset = num_envs, False
    if seed is not None:
        cfg.seed = seed
    if command is not None:
        fix_command(cfg, command)
    warp.config.log_level = warp.LOG_WARNING  # not a line per kernel module Warp compiles or loads
    return MjlabVectorEnv(ManagerBasedRlEnv(cfg=cfg, device=device), clip_actions=load_rl_cfg(task).clip_actions)
