"""Continuous control from pixels: MuJoCo and dm_control tasks observed through rendered frames.

``--pixels`` replaces a task's state observation by what a camera sees, as DrQ (Kostrikov,
Yarats & Fergus, 2020) and DrQ-v2 (Yarats et al., 2021) train on the DeepMind Control Suite:

=================  =========  ==============================================================
flag               default    what it does
=================  =========  ==============================================================
--pixels           off        observe rendered RGB frames (uint8, channels first) instead of
                              the state; dm_control ids through shimmy
                              (``dm_control/cartpole-swingup-v0``) and gymnasium's MuJoCo ids
                              (``InvertedPendulum-v5``) rendered with ``rgb_array``
--image-size       84         frames are this many pixels square (DrQ-v2's 84; PlaNet's 64)
--frame-stack      3 (drq)    the observation is the last N frames along the channel axis:
                              ``3N x size x size`` (DrQ-v2 stacks 3; ppo keeps Atari's 4)
--action-repeat    per task   repeat each action this many simulator steps, rewards summed;
                              default PlaNet's per-domain values that DrQ uses (cartpole 8,
                              reacher, cheetah and ball_in_cup 4, finger and walker 2;
                              Hafner et al., 2019), else DrQ-v2's 2 for every task
=================  =========  ==============================================================

The wrappers are gymnasium's where it has one (``FrameStackObservation`` repeats the first
frame after a reset, as DrQ-v2's ``FrameStackWrapper`` does), and three small ones here:
``ActionRepeat`` (gymnasium has none for continuous control), ``RenderedFrames`` (the
rendered frame, channels first, as the observation; a frame is rendered only after the
last repeated step, not after each) and ``StackedChannels`` (the stack folded into channels).

Resuming: gymnasium's MuJoCo envs continue mid-episode from a checkpoint (their physics
state is saved, envs/cursor.py); dm_control's physics is not saved, so a resumed dm_control
run starts fresh episodes, seeded by the step count.

A frame is one simulator step: a run with action repeat 8 takes one decision per 8 frames.
dm_control's episodes are 1000 frames long whatever the repeat.

Rendering is headless: envs are made (and MuJoCo first imported) inside envs/video.py's
``headless_gl``, which sets ``MUJOCO_GL=egl`` while it runs unless you chose a backend
(``MUJOCO_GL=osmesa`` works too). ``check_renderer`` renders one frame of a
tiny model before any env or run directory exists, so a machine that cannot render is told
so in one line.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass
from types import MappingProxyType

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from omnigym.envs.video import HEADLESS_HINT, headless_gl
from omnigym.errors import OmnigymError, missing_extra, require

DM_CONTROL_PREFIX = "dm_control/"
MIN_IMAGE_SIZE = 16
"""the DrQ encoder's smallest input (its four 3x3 convolutions leave 1 x 1); ppo's Nature CNN needs 36"""
MAX_IMAGE_SIZE = 512
ACTION_REPEAT = MappingProxyType({"cartpole": 8, "reacher": 4, "cheetah": 4, "ball_in_cup": 4, "finger": 2, "walker": 2})
"""PlaNet's action repeat per dm_control domain (Hafner et al., 2019, Table F.1), which DrQ,
CURL and SAC-AE use for the PlaNet benchmark"""
DEFAULT_ACTION_REPEAT = 2
"""DrQ-v2's action repeat, the same for every task (Yarats et al., 2021, Appendix B)"""
NOT_REBUILT = ("InvertedPendulumEnv", "InvertedDoublePendulumEnv")
"""gymnasium 1.4's v5 pendulums leave ``default_camera_config`` out of their ``EzPickle`` arguments,
so a copy rebuilt from a checkpoint gets ``reset_noise_scale`` as its camera and cannot render:
they restart their episodes on resume, as dm_control does"""
CAMERA_ID = MappingProxyType({"quadruped": 2})
"""the camera DrQ-v2 renders (``camera_id = 2 if domain == 'quadruped' else 0``)"""


@dataclass(frozen=True)
class PixelOptions:
    """What ``--pixels`` observes and how often the agent acts; ``from_config`` resolves the
    per-task action repeat."""

    enabled: bool = False
    image_size: int = 84
    frame_stack: int = 3
    action_repeat: int = 1

    @classmethod
    def from_config(cls, cfg) -> "PixelOptions":
        """The options of a control config, checked (one line naming the flag when out of range)."""
        enabled = bool(getattr(cfg, "pixels", False))
        repeat = getattr(cfg, "action_repeat", None)
        if not enabled:
            require(repeat is None, "--action-repeat is read with --pixels only (Atari has --frame-skip)")
            return cls()
        require(MIN_IMAGE_SIZE <= cfg.image_size <= MAX_IMAGE_SIZE,
                f"--image-size must be between {MIN_IMAGE_SIZE} and {MAX_IMAGE_SIZE} pixels, got {cfg.image_size}")
        require(cfg.frame_stack > 0, f"--frame-stack must be positive, got {cfg.frame_stack}")
        if repeat is None:
            repeat = default_action_repeat(cfg.env_id)
        require(repeat > 0, f"--action-repeat must be positive, got {repeat}")
        return cls(True, cfg.image_size, cfg.frame_stack, repeat)


def domain(env_id: str) -> str:
    """``dm_control/cartpole-swingup-v0`` -> ``cartpole``; gymnasium ids: lower-case name."""
    name = env_id[len(DM_CONTROL_PREFIX):] if env_id.startswith(DM_CONTROL_PREFIX) else env_id
    return name.split("-")[0].lower()


def default_action_repeat(env_id) -> int:
    if isinstance(env_id, str) and env_id.startswith(DM_CONTROL_PREFIX):
        return ACTION_REPEAT.get(domain(env_id), DEFAULT_ACTION_REPEAT)
    return DEFAULT_ACTION_REPEAT


def register_dm_control() -> None:
    """shimmy's ``dm_control/...`` ids enter gymnasium's registry when shimmy is imported."""
    if importlib.util.find_spec("shimmy") is None or importlib.util.find_spec("dm_control") is None:
        raise missing_extra("shimmy and dm_control", "pixels")
    import shimmy

    gym.register_envs(shimmy)


def check_renderable(env_id, family: str | None) -> None:
    """``--pixels`` renders MuJoCo: dm_control ids and gymnasium's MuJoCo family."""
    is_dm_control = isinstance(env_id, str) and env_id.startswith(DM_CONTROL_PREFIX)
    if not (is_dm_control or family == "mujoco"):
        raise OmnigymError(f"--pixels renders MuJoCo tasks (dm_control/... ids, gymnasium's MuJoCo ids such as "
                           f"InvertedPendulum-v5); {env_id} is neither")


def check_renderer() -> None:
    """Render one frame of an empty MuJoCo model offscreen, or refuse ``--pixels`` in one line."""
    try:
        with headless_gl():
            backend = os.environ.get("MUJOCO_GL")
            import mujoco

            renderer = mujoco.Renderer(mujoco.MjModel.from_xml_string("<mujoco/>"), MIN_IMAGE_SIZE, MIN_IMAGE_SIZE)
            try:
                renderer.render()
            finally:
                renderer.close()
    except Exception as exc:  # no libEGL / libOSMesa, no display, a bad MUJOCO_GL value
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OmnigymError(f"--pixels needs MuJoCo to render offscreen and MUJOCO_GL={backend} failed here ({detail}); "
                           f"{HEADLESS_HINT}") from None


class StackedChannels(gym.ObservationWrapper):
    """``[stack, 3, H, W]`` frames as one ``[3 * stack, H, W]`` image (gymnasium's
    ``ReshapeObservation`` holds a lambda, which a checkpoint cannot pickle)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        stack, channels, height, width = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 255, (stack * channels, height, width), np.uint8)

    def observation(self, observation):
        return np.asarray(observation).reshape(self.observation_space.shape)


class ActionRepeat(gym.Wrapper):
    """Each action acts ``repeat`` simulator steps (fewer when the episode ends first); the
    rewards are summed."""

    def __init__(self, env: gym.Env, repeat: int):
        super().__init__(env)
        self.repeat = repeat

    def step(self, action):
        total = 0.0
        for _ in range(self.repeat):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info


class RenderedFrames(gym.ObservationWrapper):
    """The observation is the env's rendered RGB frame, channels first (``3 x H x W`` uint8).

    ``resumable`` False (dm_control, whose physics a checkpoint does not hold) makes the env
    refuse to pickle, so that a resumed run starts fresh seeded episodes (envs/cursor.py)
    rather than step a rebuilt env that was never reset (or, ``NOT_REBUILT``, cannot render)."""

    CAMERA = ("lookat", "distance", "azimuth", "elevation")
    """gymnasium's MuJoCo viewer camera, which moves as it renders (its lookat drifts by
    millimetres): not in MjData, so a checkpoint carries it, or resumed frames differ"""

    def __init__(self, env: gym.Env, size: int, resumable: bool = True):
        super().__init__(env)
        self.observation_space = gym.spaces.Box(0, 255, (3, size, size), np.uint8)
        self.resumable, self.camera = resumable, None

    def __reduce_ex__(self, protocol):
        if not self.resumable:
            raise TypeError("a dm_control env's physics is not saved: a resumed run starts fresh episodes")
        return super().__reduce_ex__(protocol)

    def _viewer(self):
        return getattr(getattr(self.env.unwrapped, "mujoco_renderer", None), "viewer", None)

    def __getstate__(self):
        state, viewer = dict(self.__dict__), self._viewer()
        if viewer is not None:
            state["camera"] = {name: np.array(getattr(viewer.cam, name)) for name in self.CAMERA}
        return state

    def observation(self, observation):
        # gymnasium's MuJoCo viewer picks its GL backend when it is made, at the first render: here,
        # and (a resumed run) maybe long after the block that made the env.
        with headless_gl():
            return self._frame()

    def _frame(self):
        if self.camera is not None:  # restored from a checkpoint: the viewer exists after one render
            self.env.render()
            for name, value in self.camera.items():
                if np.ndim(value):
                    getattr(self._viewer().cam, name)[:] = value
                else:
                    setattr(self._viewer().cam, name, float(value))
            self.camera = None
        frame = np.asarray(self.env.render())
        if frame.shape != (*self.observation_space.shape[1:], 3):
            raise OmnigymError(f"the env rendered a frame of shape {frame.shape}, not "
                               f"{(*self.observation_space.shape[1:], 3)}: it does not render rgb_array at that size")
        return np.ascontiguousarray(frame.transpose(2, 0, 1))


def make_pixel_env(env_id: str, options: PixelOptions, env_kwargs: dict | None = None) -> gym.Env:
    """One env of ``env_id`` (made with ``env_kwargs``, as ``--env-kwargs`` gives them) rendered
    at ``options.image_size``, repeated and stacked."""
    with headless_gl():  # mujoco and dm_control pick their GL backend when first imported
        return _make_pixel_env(env_id, options, env_kwargs or {})


def _make_pixel_env(env_id: str, options: PixelOptions, env_kwargs: dict) -> gym.Env:
    size = options.image_size
    if env_id.startswith(DM_CONTROL_PREFIX):
        register_dm_control()  # in this process: async envs make theirs in subprocesses
        env = gym.make(env_id, render_mode="rgb_array", **env_kwargs,
                       render_kwargs={"width": size, "height": size, "camera_id": CAMERA_ID.get(domain(env_id), 0)})
    else:  # gymnasium's MujocoEnv renders width x height from its default camera
        env = gym.make(env_id, render_mode="rgb_array", width=size, height=size, **env_kwargs)
    resumable = not env_id.startswith(DM_CONTROL_PREFIX) and type(env.unwrapped).__name__ not in NOT_REBUILT
    env = RenderedFrames(ActionRepeat(env, options.action_repeat), size, resumable)
    return StackedChannels(gym.wrappers.FrameStackObservation(env, options.frame_stack, padding_type="reset"))


def make_pixel_vec(env_id: str, num_envs: int, backend: str, options: PixelOptions,
                   env_kwargs: dict | None = None) -> gym.vector.VectorEnv:
    """``num_envs`` pixel envs; sync by default (env fns that pickle: a checkpoint holds the
    envs), async in subprocesses (each renders on its own context)."""
    require(backend in ("auto", "sync", "async"), f"--pixels runs on --backend sync or async, not {backend}")
    fns = [functools.partial(make_pixel_env, env_id, options, env_kwargs)] * num_envs
    vector_cls = gym.vector.AsyncVectorEnv if backend == "async" else gym.vector.SyncVectorEnv
    return vector_cls(fns, autoreset_mode=AutoresetMode.NEXT_STEP)


def frames_per_step(cfg) -> int:
    """Simulator frames per agent step: the action repeat with ``--pixels``, else 1."""
    return PixelOptions.from_config(cfg).action_repeat
