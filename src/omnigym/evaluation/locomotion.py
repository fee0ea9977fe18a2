"""``omnigym eval RUN --randomize``: a locomotion policy run in worlds it was not trained in.

The sim-to-sim check legged_gym and Isaac Lab users do before a robot: the same task on a
differently parameterized model (``SIM_TO_SIM``: wider friction, a heavier or lighter base, weaker
or stronger motors, frequent pushes) and a fixed command. Each of ``episodes`` envs plays one
episode (up to the task's 20 s); reported: how often the robot fell, the mean velocity-tracking
error, and how many episodes tracked the commanded forward speed within 25% without falling (the
mean base velocity after the first 2 s, so the start-up is not counted).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from omnigym.errors import OmnigymError

if TYPE_CHECKING:  # the annotation only: the env stack is imported when a report is made
    from omnigym.evaluation.control import LoadedRun

SIM_TO_SIM = MappingProxyType({
    "friction": (0.3, 1.5),          # training default 0.5-1.25 (legged_gym)
    "added_base_mass": (-1.0, 3.0),  # Isaac Lab's Go2 rough config add_base_mass range; training default: none
    "motor_strength": (0.8, 1.2),    # training default: none
    "push_interval": 5.0,            # training default 15 s (legged_gym)
    "push_velocity": 0.5,            # Isaac Lab's push_robot velocity range +-0.5 m/s
})
SETTLE_S = 2.0
TOLERANCE = 0.25


@dataclass
class TrackingReport:
    episodes: int
    fell: int
    tracked: int
    mean_error: float
    mean_speed: float
    command: tuple[float, float, float]
    randomized: bool

    def line(self) -> str:
        where = "randomized model (" + ", ".join(f"{k}={v}" for k, v in SIM_TO_SIM.items()) + ")" \
            if self.randomized else "the training model"
        vx = self.command[0]
        return (f"locomotion, command vx={vx:g} vy={self.command[1]:g} yaw={self.command[2]:g} on {where}: "
                f"fell {self.fell}/{self.episodes}, tracked within {TOLERANCE:.0%} without falling "
                f"{self.tracked}/{self.episodes}, mean speed {self.mean_speed:.3f} m/s, "
                f"mean tracking error {self.mean_error:.3f} m/s")


def check_tracking(cfg, run_dir: str, randomize: bool) -> None:
    """Refuse what --randomize/--command cannot evaluate, from the run's config alone (before
    its checkpoint is read)."""
    from omnigym.envs.locomotion import TASK_IDS

    on_mjlab = cfg.backend == "mjlab"
    if not on_mjlab and cfg.env_id not in TASK_IDS:
        raise OmnigymError(f"--randomize and --command evaluate locomotion runs ({', '.join(TASK_IDS)}, or a "
                           f"--backend mjlab velocity task); {run_dir} trained on {cfg.env_id}")
    if on_mjlab and randomize:
        raise OmnigymError("--randomize builds omnigym's own Go2 task; a --backend mjlab run's policy reads mjlab's "
                           "observations, so evaluate it with --command alone (mjlab randomizes friction, mass "
                           "centre, encoders and pushes in training already)")


def tracking_report(run: LoadedRun, episodes: int = 10, randomize: bool = False,
                    command: tuple[float, float, float] = (0.5, 0.0, 0.0), greedy: bool = False,
                    seed: int = 12345) -> TrackingReport:
    """Plays ``episodes`` episodes of a loaded locomotion run's policy at a fixed ``command``
    (``omnigym.runs.evaluate_tracking`` is the same from a run directory)."""
    from omnigym.envs.locomotion import TASK_IDS
    from omnigym.envs.locomotion.env import LocomotionVectorEnv
    from omnigym.envs.vector import parse_env_kwargs
    from omnigym.process import run_scope

    if episodes <= 0:
        raise OmnigymError(f"--episodes must be positive, got {episodes}")
    cfg, run_dir = run.cfg, run.dir
    check_tracking(cfg, run_dir, randomize)
    on_mjlab = cfg.backend == "mjlab"
    if on_mjlab:  # mjlab's own task on its own simulator, every env given the one command
        from omnigym.envs.mjlab_backend import make_mjlab_vec

        envs = make_mjlab_vec(cfg.env_id, episodes, seed=seed, command=tuple(command),
                              **parse_env_kwargs(cfg.env_kwargs))
        dt, max_steps = envs.step_dt, envs.max_episode_steps
        base_velocity = lambda info: envs.base_lin_vel()  # noqa: E731
    else:
        settings = {**TASK_IDS[cfg.env_id], **parse_env_kwargs(cfg.env_kwargs)}
        vx, vy, yaw = command
        settings.update(lin_vel_x=(vx, vx), lin_vel_y=(vy, vy), ang_vel_yaw=(yaw, yaw), resampling_time=1e9,
                        small_to_zero=0.0, curriculum=False)
        if randomize:
            settings.update(SIM_TO_SIM)
        envs = LocomotionVectorEnv(episodes, **settings)
        dt, max_steps = envs.cfg.dt, envs.batch.max_steps
        base_velocity = lambda info: info["base_lin_vel"]  # noqa: E731
    with run_scope(seed):
        policy = run.policy(envs, greedy)
        obs, _ = envs.reset(seed=seed)
        settle = int(SETTLE_S / dt)
        done = np.zeros(episodes, bool)
        fell = np.zeros(episodes, bool)
        speed_sum, error_sum, counted = np.zeros(episodes), np.zeros(episodes), np.zeros(episodes)
        target = np.array(command[:2])
        for t in range(max_steps):
            obs, _, terminated, truncated, info = envs.step(policy(obs))
            live = ~done
            if t >= settle:
                velocity = base_velocity(info)
                speed_sum += live * velocity[:, 0]
                error_sum += live * np.linalg.norm(velocity[:, :2] - target, axis=1)
                counted += live
            fell |= live & terminated
            done |= terminated | truncated
            if done.all():
                break
    envs.close()
    vx = command[0]
    counted = np.maximum(counted, 1)
    speed = speed_sum / counted
    tracked = ~fell & (np.abs(speed - vx) <= TOLERANCE * max(abs(vx), 1e-6))
    return TrackingReport(episodes, int(fell.sum()), int(tracked.sum()), float(np.mean(error_sum / counted)),
                          float(np.mean(speed)), tuple(command), randomize)
