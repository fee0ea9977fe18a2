"""Videos of control episodes: gymnasium's ``RecordVideo`` on the first env of a vector env.

Training (``--capture-video``) records env 0's episodes on gymnasium's capped cubic schedule
(episodes 0, 1, 8, 27, 64, 125, 216, 343, 512, 729, 1000, then every 1000th; CleanRL's
schedule) into ``RUN_DIR/videos/``; ``omnigym eval RUN_DIR --video`` records every episode it
plays into ``RUN_DIR/videos/eval/``. Only env 0 renders (``render_mode="rgb_array"``), so the
other envs cost nothing extra, and a frame is drawn only while an episode is recorded.

What crosses the seam: ``make_vec(..., video_dir=...)`` calls ``recording()`` (checks, backend
fallback, one test frame) and builds its env fns with ``Recording.env_fns``; the algorithms
call ``training_video_dir(cfg, algo)`` for the folder. MuJoCo on a server without a display
renders through EGL: ``MUJOCO_GL=egl`` is set, when unset, while env 0 is made (mujoco is
imported then) and while it renders, and put back after (``headless_gl``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import gymnasium as gym

from omnigym.errors import OmnigymError, missing_extra

VIDEO_FOLDER = "videos"
"""a run's videos, under its directory (eval's in ``videos/eval``)"""
HEADLESS_HINT = ("install EGL with: apt-get install libegl1 libgl1-mesa-dri (or set MUJOCO_GL=osmesa "
                 "with libosmesa6 installed)")
OSMESA_HINT = ("install OSMesa with: apt-get install libosmesa6, or unset MUJOCO_GL to render through EGL "
               "(apt-get install libegl1 libgl1-mesa-dri)")


def every_episode(episode: int) -> bool:
    return True


def training_schedule(episode: int) -> bool:
    """Which of env 0's episodes a training run records: gymnasium's capped cubic schedule."""
    from gymnasium.utils.save_video import capped_cubic_video_schedule

    return capped_cubic_video_schedule(episode)


def training_video_dir(cfg, algo: str) -> str | None:
    """``RUN_DIR/videos`` for ``--capture-video`` (None without it). The run directory is decided
    here when the user named none, as ``start_run`` would (this ``train()`` call keeps it for
    ``start_run``); nothing is written until a recorded episode ends in a run that has begun."""
    if not getattr(cfg, "capture_video", False):
        return None
    from omnigym.track.run import decided_run_dir

    return os.path.join(decided_run_dir(cfg, algo, cfg.env_id), VIDEO_FOLDER)


def check_video_support() -> None:
    """moviepy encodes the videos (gymnasium's RecordVideo uses it)."""
    if importlib.util.find_spec("moviepy") is None:
        raise missing_extra("moviepy", "video")


def headless_gl():
    """A block in which MuJoCo renders offscreen through EGL unless the user chose a backend
    (MUJOCO_GL; mujoco reads it when imported), and pygame (classic control, which reads
    SDL_VIDEODRIVER when it starts drawing) draws into memory without a display, instead of
    printing an error about XDG_RUNTIME_DIR. The environment is as it was after the block."""
    from omnigym.scoped_env import environment

    values = {}
    if "MUJOCO_GL" not in os.environ:
        values["MUJOCO_GL"] = "egl"
        if "PYOPENGL_PLATFORM" not in os.environ:
            values["PYOPENGL_PLATFORM"] = "egl"
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY") and "SDL_VIDEODRIVER" not in os.environ:
        values["SDL_VIDEODRIVER"] = "dummy"
    return environment(values)


class HeadlessRender(gym.Wrapper):
    """Draws each frame inside ``headless_gl`` (what RecordVideo records goes through it)."""

    def render(self):
        with headless_gl():
            return self.env.render()


class RecordEpisodes(gym.wrappers.RecordVideo):
    """gymnasium's RecordVideo that creates its folder when it writes the first video, not when
    it is built (a run that refuses to start leaves no folder), and writes none once the
    folder's parent is gone (a run directory that was put back after a failed start)."""

    def __init__(self, env, video_folder: str, **kwargs):
        folder = Path(video_folder).absolute()
        missing = [p for p in [folder, *folder.parents] if not p.exists()]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overwriting existing videos": the names are new (Recording.prefix)
            super().__init__(env, str(folder), **kwargs)
        for made in missing:  # RecordVideo made the folder; it comes back in stop_recording
            try:
                made.rmdir()
            except OSError:
                break

    def stop_recording(self):
        if not os.path.isdir(os.path.dirname(self.video_folder)):
            self.recorded_frames, self.recording = [], False
            return
        os.makedirs(self.video_folder, exist_ok=True)
        super().stop_recording()


@dataclass
class Recording:
    """Env 0 renders and is recorded; the others are made as without video."""

    folder: str
    trigger: Callable[[int], bool] = training_schedule
    prefix: str = "rl-video"
    render_kwargs: dict = field(default_factory=lambda: {"render_mode": "rgb_array"})

    def wrap(self, env: gym.Env) -> gym.Env:
        return RecordEpisodes(HeadlessRender(env), self.folder, episode_trigger=self.trigger, name_prefix=self.prefix)

    def make_first(self, make: Callable[..., gym.Env], env_kwargs: dict) -> gym.Env:
        with headless_gl():  # a MuJoCo env imports mujoco here, in this process or the async worker's
            return self.wrap(make(**self.render_kwargs, **env_kwargs))

    def env_fns(self, make: Callable[..., gym.Env], num_envs: int, env_kwargs: dict) -> list:
        """``make(**kwargs)`` builds one env; the first one renders and records."""
        return [functools.partial(self.make_first, make, env_kwargs)] + [lambda: make(**env_kwargs)] * (num_envs - 1)


def free_prefix(folder: str, base: str) -> str:
    """``base``, or ``base-2``, ``base-3``, ... when videos of that name are already in ``folder``
    (a resumed run, a second eval): earlier videos are kept."""
    taken = {p.name for p in Path(folder).glob("*.mp4")} if os.path.isdir(folder) else set()
    prefix, n = base, 1
    while any(name.startswith(prefix + "-episode-") for name in taken):
        n += 1
        prefix = f"{base}-{n}"
    return prefix


def recording(env, backend: str, video_dir: str, trigger=None, prefix: str = "rl-video",
              env_kwargs: dict | None = None, auto: str = "sync") -> tuple[Recording, str]:
    """The recording for ``make_vec(env, backend=..., video_dir=...)`` and the backend to use:
    one that runs env 0 as a gymnasium env (sync or async). ``auto`` falls back to sync (one
    line says so) where it would pick a native vector env; a named backend that cannot render
    is refused. A first frame is drawn here, so that a missing renderer is one line now rather
    than a traceback inside the run. ``auto``: the backend ``--backend auto`` picks for ``env``."""
    check_video_support()
    if backend not in ("auto", "sync", "async"):
        raise OmnigymError(f"--backend {backend} cannot record video (gymnasium's RecordVideo wraps one env of a sync "
                           "or async vector env); use --backend sync, async or auto with --capture-video")
    if backend == "auto":
        if auto not in ("sync", "async"):
            print(f"--capture-video: the {auto} backend cannot render one env for video; {env} runs on --backend sync",
                  file=sys.stderr)
        backend = "sync"
    video = Recording(str(video_dir), trigger or training_schedule, free_prefix(str(video_dir), prefix))
    with headless_gl():
        check_render(env, env_kwargs or {})
    return video, backend


def check_render(env, env_kwargs: dict) -> None:
    """Make one env with ``render_mode="rgb_array"`` and draw a frame."""
    made = None
    try:
        if isinstance(env, str):
            check_draws_frames(env)
            made = gym.make(env, render_mode="rgb_array", **env_kwargs)
        elif isinstance(env, gym.Env):
            if env.render_mode != "rgb_array":
                raise OmnigymError(f"video needs an env made with render_mode='rgb_array'; yours has "
                                   f"render_mode={env.render_mode!r}")
            return  # the user's own object: it is env 0 itself, and is not reset here
        else:
            try:
                made = env(render_mode="rgb_array", **env_kwargs)
            except TypeError as exc:
                raise OmnigymError(f"video needs your env to take render_mode='rgb_array' ({exc})") from None
        made.reset(seed=0)
        frame = made.render()
    except OmnigymError:
        raise
    except gym.error.DependencyNotInstalled as exc:
        if "pygame" in str(exc):
            raise missing_extra("pygame", "video") from None
        raise OmnigymError(f"the env cannot render: {exc}") from None
    except Exception as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if _raised_in_gl(exc) or "OpenGL" in detail or "EGL" in detail:
            backend = os.environ.get("MUJOCO_GL")
            hint = (OSMESA_HINT if backend == "osmesa" else HEADLESS_HINT)
            raise OmnigymError(f"MuJoCo could not render headless (MUJOCO_GL={backend}: "
                               f"{type(exc).__name__}: {detail}); {hint}") from None
        raise OmnigymError(f"the env could not render a frame for video: {type(exc).__name__}: {detail}") from None
    finally:
        if made is not None:
            made.close()
    if getattr(frame, "ndim", 0) != 3:
        raise OmnigymError(f"video needs render() to return an RGB image; the env returned {type(frame).__name__}")


def check_draws_frames(env_id: str) -> None:
    """One line for a registered env whose class says it draws no frames (a game's ``TurnEnv``,
    ``render_modes: []``): made with ``render_mode='rgb_array'`` anyway, gymnasium warned and
    passed it on to the game's library, which refused a parameter the user never gave."""
    from gymnasium.envs.registration import load_env_creator

    spec = gym.spec(env_id)
    creator = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    modes = getattr(creator, "metadata", {}).get("render_modes") if isinstance(creator, type) else None
    if modes is not None and "rgb_array" not in modes:
        raise OmnigymError(f"{env_id} draws no frames (render modes: {', '.join(modes) or 'none'}), so there is no "
                           "video to record; leave out --capture-video (or eval's --video)")


def _raised_in_gl(exc: BaseException) -> bool:
    """The error came from MuJoCo's renderer or from PyOpenGL (no usable OpenGL backend)."""
    import traceback

    files = [frame.filename for frame in traceback.extract_tb(exc.__traceback__)]
    return any(f"{os.sep}{name}{os.sep}" in f for f in files for name in ("mujoco", "OpenGL"))
