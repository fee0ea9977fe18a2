"""One factory for vectorized control environments, with interchangeable backends.

``env`` is a registered gymnasium id (``CartPole-v1``), gymnasium's ``module:EnvName`` (the
module is imported first, so that it can register ``EnvName``; a ``module:Class`` or
``module:factory`` that is not a registered id is used as the env's factory), or, from
Python, a class, a factory function or an env object.

Every backend returns a gymnasium 1.x ``VectorEnv`` in NEXT_STEP autoreset mode (the
mode gymnasium's own vector envs use): the step that ends an episode returns its true
final observation, and the following step returns the reset observation with reward 0.
Algorithms drop that reset transition. Episode statistics come from gymnasium's
``RecordEpisodeStatistics`` on every backend (with a cheaper step, envs/episode_stats.py),
so returns mean the same thing everywhere.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import sys

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from omnigym.envs.atari import AtariOptions, is_atari, make_atari_vec
from omnigym.envs.cursor import LearningSignal
from omnigym.envs.envpool import EnvPoolVectorEnv
from omnigym.envs.episode_stats import RecordEpisodeStatistics
from omnigym.errors import OmnigymError, missing_extra, require
from omnigym.user_code import at, import_object, import_reference, is_reference

BACKENDS = ("auto", "sync", "async", "native", "envpool", "ale", "mjlab")


def _spec(env_id: str) -> gym.envs.registration.EnvSpec:
    _register_optional_envs(env_id)
    if env_id not in gym.registry:
        known = list(gym.registry.keys())
        close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.5)
        hint = f"; closest known ids: {', '.join(close)}" if close else \
            "; python -c 'import gymnasium; gymnasium.pprint_registry()' lists the ids installed here"
        raise OmnigymError(f"unknown env id {env_id!r}{hint}")
    return gym.spec(env_id)


def _register_optional_envs(env_id: str) -> None:
    from omnigym.envs.goal import register_goal_envs

    register_goal_envs(env_id)  # omnigym's goal envs; gymnasium-robotics' (Fetch) for their ids
    # Atari ids (ALE/Pong-v5, PongNoFrameskip-v4) live in ale-py's registry, which is only
    # filled once ale_py is imported.
    if env_id in gym.registry:
        return
    from omnigym.envs.games import is_game_id, register_game

    if is_game_id(env_id):  # pettingzoo/NAME, openspiel/NAME: one seat of the game (envs/games/)
        register_game(env_id)
        return
    if env_id.startswith("dm_control/"):  # shimmy's ids (envs/pixels.py)
        from omnigym.envs.pixels import register_dm_control

        register_dm_control()
        return
    if importlib.util.find_spec("ale_py") is not None:
        import ale_py

        gym.register_envs(ale_py)
    elif env_id.startswith("ALE/") or "NoFrameskip" in env_id:
        raise missing_extra("ale-py", "atari")


def make_run_envs(cfg, algo: str) -> tuple[gym.vector.VectorEnv, LearningSignal]:
    """A control run's vector env, from its config (Atari preprocessing, ``--capture-video``),
    and what its algorithm learns from (Atari's clipped rewards and episodic life)."""
    from omnigym.envs.video import training_video_dir

    from omnigym.envs.pixels import PixelOptions, check_renderable, check_renderer

    options, pixels = AtariOptions.from_config(cfg), PixelOptions.from_config(cfg)
    atari = is_atari(cfg.env_id) or (isinstance(cfg.env_id, str) and cfg.env_id.startswith("ALE/"))
    changed = [flag for flag in AtariOptions.FLAGS if getattr(options, flag) != getattr(AtariOptions(), flag)
               and not (pixels.enabled and flag == "frame_stack")]  # --pixels stacks frames too
    if changed and not atari:
        raise OmnigymError(f"--{changed[0].replace('_', '-')} is Atari preprocessing; {cfg.env_id} is not an Atari game")
    from omnigym.resources import check_buffers, check_envs

    family = env_family(cfg.env_id)
    if pixels.enabled:  # what cannot render is refused before an env or a run directory exists
        require(algo not in ("sac", "td3", "dqn"), f"{algo} learns from state vectors; for continuous control from "
                                                   "pixels run omnigym train drq (SAC with a shared CNN encoder) or ppo")
        require(not cfg.capture_video, "--capture-video records a state-based run; with --pixels it is not supported yet")
        # the refusal came later, from the network, and advised resizing what --image-size itself sets
        require(algo != "ppo" or cfg.image_size >= 36, f"--image-size {cfg.image_size}: ppo's Nature CNN reads squares "
                                                      "of 36 pixels or more; give --image-size 36 or more (drq's "
                                                      "encoder takes 16)")
        check_renderable(cfg.env_id, family)
        check_renderer()
    check_envs(cfg, family)  # before thousands of envs are made, not after
    envs = make_vec(cfg.env_id, cfg.num_envs, backend=cfg.backend, seed=cfg.seed,
                    video_dir=training_video_dir(cfg, algo), atari=options, pixels=pixels,
                    **parse_env_kwargs(cfg.env_kwargs))
    try:  # the rollout storage and replay memory, sized by what an observation turned out to cost
        check_buffers(cfg, family, envs.single_observation_space, envs.single_action_space)
    except OmnigymError:
        envs.close()
        raise
    if cfg.backend == "auto" and atari and not cfg.capture_video:
        print(f"env: {cfg.env_id} x {cfg.num_envs} on the ale backend (ale-py's C++ vector env, the fastest here)",
              flush=True)
    signal = LearningSignal(options.clip_rewards, options.episodic_life) if atari else LearningSignal()
    return envs, signal


def trained_env(run_dir, cfg, env, verb: str, python_call: str) -> tuple:
    """The env a finished run is played or exported in, and the settings to make it with: the
    run's own id with the ``--env-kwargs`` it trained with (the task's commands, randomization,
    time limit), or ``env``, the caller's, as it is. ``verb`` and ``python_call`` name the command
    and the Python call that takes an env object, for a run whose env has no name to rebuild."""
    settings = parse_env_kwargs(getattr(cfg, "env_kwargs", ())) if env is None else {}
    env = env if env is not None else cfg.env_id
    if isinstance(env, str) and env.startswith("<"):  # config.json holds a repr: a lambda or an env object
        raise OmnigymError(f"{run_dir} was trained on a Python object ({env}) that {verb} cannot find by name; "
                           f"{python_call}")
    return env, settings


def parse_env_kwargs(pairs) -> dict:
    """``--env-kwargs KEY=VALUE ...`` as a dict: a value that reads as a Python literal (``3``,
    ``0.5,1.0``, ``None``) is that value, anything else stays a string for the env to check."""
    import ast

    kwargs = {}
    for pair in pairs or ():
        key, sep, value = str(pair).partition("=")
        if not sep or not key.strip().isidentifier():
            raise OmnigymError(f"--env-kwargs takes KEY=VALUE pairs, got {pair!r}")
        if key.strip() in kwargs:  # the last one won in silence (threats=True threats=False trained without planes)
            raise OmnigymError(f"--env-kwargs gives {key.strip()} twice; give it once")
        try:
            kwargs[key.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            # inf and nan are floats to Python's float(), not literals: g=inf reached the env as "inf"
            special = value.strip().lower().lstrip("+-") in ("inf", "infinity", "nan")
            kwargs[key.strip()] = float(value) if special else value
    steps = kwargs.get("max_episode_steps")
    # gymnasium refuses 0 but took -1, and every episode was one step long
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise OmnigymError(f"--env-kwargs max_episode_steps must be a whole number of steps, 1 or more, got {steps!r}")
    return kwargs


def env_family(env) -> str | None:
    """``atari`` (ale-py's games), ``mujoco`` (gymnasium's MuJoCo robots), ``locomotion``
    (envs/locomotion's quadrupeds), ``fetch`` (gymnasium-robotics' Fetch arms, the goal envs
    HER is for), or None: which algorithm presets (``--preset auto``) fit the env."""
    from omnigym.envs.goal import FETCH_IDS
    from omnigym.envs.locomotion import FAMILY, is_locomotion

    if is_locomotion(env):
        return FAMILY
    if not isinstance(env, str) or is_reference(env):
        return None
    if env in FETCH_IDS:
        return "fetch"
    from omnigym.envs.games import game_family, is_game_id

    if is_game_id(env):
        return game_family(env)
    if is_atari(env) or env.startswith("ALE/"):
        return "atari"
    try:
        spec = _spec(env)
    except OmnigymError:
        return None  # an unknown id is refused, in one line, where the env is made
    return "atari" if is_atari(env) else "mujoco" if ".mujoco" in str(spec.entry_point) else None


def has_native(env_id: str) -> bool:
    spec = _spec(env_id)
    return spec.vector_entry_point is not None and "Jax" not in str(spec.vector_entry_point)


def available_backends() -> list[str]:
    names = ["auto", "sync", "async", "native"]
    if importlib.util.find_spec("ale_py") is not None:
        names.append("ale")
    if importlib.util.find_spec("envpool") is not None:
        names.append("envpool")
    if importlib.util.find_spec("mjlab") is not None:
        names.append("mjlab")  # mjlab's GPU tasks (envs/mjlab_backend.py); it needs an NVIDIA GPU
    return names


def resolve_env(env, env_kwargs: dict | None = None):
    """A registered id for ``env``, or the factory (a callable making one env) it names. Your
    env is made and stepped once first, with ``env_kwargs`` (an env that needs an argument
    could not be made without them); so is a registered env given ``env_kwargs``
    (``Pendulum-v1 --env-kwargs g=abc`` failed with a traceback at its first step)."""
    env_kwargs = env_kwargs or {}
    if isinstance(env, str) and is_reference(env):
        module, name = import_reference(env, "--env-id")
        if name in gym.registry:
            check_user_env(lambda: gym.make(name, **env_kwargs))
            return name
        factory = import_object(env, "--env-id")
        if not callable(factory):
            raise OmnigymError(f"--env-id {env}: {name} is neither a registered env id nor a class or function")
        check_user_env(lambda: factory(**env_kwargs))
        return factory
    if isinstance(env, str):
        _spec(env)
        if env_kwargs and is_atari(env):  # they were dropped in silence: Atari's options are flags of their own
            raise OmnigymError(f"--env-kwargs does not apply to Atari ids ({env}): its options are flags of their "
                               "own, --frame-skip, --frame-stack, --noop-max, --sticky-actions, --episodic-life, "
                               "--fire-reset, --clip-rewards (docs/atari.md)")
        if env_kwargs:
            settings = " ".join(f"{key}={value!r}" for key, value in env_kwargs.items())
            check_user_env(lambda: gym.make(env, **env_kwargs), who=f"{env} with --env-kwargs {settings}")
        return env
    if isinstance(env, gym.Env):
        import copy

        check_user_env(lambda: copy.deepcopy(env))
        return env
    if callable(env):
        check_user_env(lambda: env(**env_kwargs))
        return env
    raise OmnigymError(f"env must be an env id, module:EnvName, an env class or factory, or an env; got {env!r}")


def check_user_env(factory, who: str = "your env") -> None:
    """Your env (``who``), made once and stepped once, checked for what the vector env and the
    networks rely on (reset gives ``(obs, info)``, step gives five values with an info dict,
    observations have their space's shape, rewards are numbers), so that a mistake is one line
    here rather than a traceback from deep inside the vector env. Anything else gymnasium
    allows is allowed."""
    try:
        env = factory()
    except OmnigymError:  # omnigym's own env (a game, the locomotion task) said what is wrong
        raise
    except Exception as exc:
        raise OmnigymError(f"{who} could not be made: {type(exc).__name__}: {exc}{at(exc)}") from None
    if not isinstance(env, gym.Env):
        raise OmnigymError(f"your env factory returned {type(env).__name__}, not a gymnasium.Env")
    try:
        try:
            reset = env.reset(seed=0)
            require(isinstance(reset, tuple) and len(reset) == 2 and isinstance(reset[1], dict),
                    f"{who}'s reset() must return (observation, info dict), got {shape_of(reset)}")
            _check_obs(env, reset[0], f"{who}'s reset()")
            step = env.step(env.action_space.sample())
            require(isinstance(step, tuple) and len(step) == 5 and isinstance(step[4], dict),
                    f"{who}'s step() must return (observation, reward, terminated, truncated, info dict), got "
                    f"{shape_of(step)}")
            _check_obs(env, step[0], f"{who}'s step()")
            require(np.ndim(step[1]) == 0 and _is_real(step[1], np.integer, np.floating),
                    f"{who}'s step() returned a reward of {shown(step[1])}; a reward is a real number")
            for name, flag in (("terminated", step[2]), ("truncated", step[3])):
                # The vector env stores these in a bool array: None and "" would read False (an
                # episode that never ends), an array would be a traceback there.
                require(np.ndim(flag) == 0 and _is_real(flag, np.bool_, np.integer),
                        f"{who}'s step() returned {name}={shown(flag)}; it must be a bool")
        finally:
            env.close()
    except OmnigymError:
        raise
    except Exception as exc:  # the env's own code raised (in reset, step or close)
        raise OmnigymError(f"{who} raised {type(exc).__name__}: {exc}{at(exc)}") from None


def _is_real(value, *kinds) -> bool:
    """``value``'s numpy dtype is one of ``kinds`` (complex, strings and objects are not)."""
    try:
        dtype = np.asarray(value).dtype
    except Exception:  # noqa: BLE001 - what numpy cannot read is no number
        return False
    return any(np.issubdtype(dtype, kind) for kind in kinds)


def shown(value) -> str:
    """A value as a refusal names it: its repr, cut short (an env may return a huge array)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def shape_of(returned) -> str:
    """What reset() or step() gave, as its refusal says it: ``a tuple of 5 whose last is list`` where
    the info is not a dict ("got tuple" named the tuple, not the list in it that was wrong)."""
    if not isinstance(returned, tuple):
        return type(returned).__name__
    return f"a tuple of {len(returned)} whose last is {type(returned[-1]).__name__}" if returned else "an empty tuple"


def _check_obs(env, obs, where_from: str) -> None:
    space = env.observation_space
    if isinstance(space, gym.spaces.Box):
        ok = np.shape(obs) == space.shape  # dtype and bounds only warn in gymnasium; the shape must match
    else:
        ok = space.contains(obs)
    if not ok:  # (np.shape of a Tuple space's observation raises: only here, where it is said)
        try:
            shape = f"of shape {np.shape(obs)}"
        except ValueError:
            shape = repr(obs)[:80]
        raise OmnigymError(f"{where_from} returned an observation {shape} that does not fit its observation_space "
                           f"{space}")


def make_vec(
    env,
    num_envs: int = 1,
    backend: str = "auto",
    seed: int | None = None,
    video_dir: str | None = None,
    video_episodes=None,
    atari: "AtariOptions | None" = None,
    pixels=None,
    **env_kwargs,
) -> gym.vector.VectorEnv:
    """Make ``num_envs`` copies of ``env`` as one vector env with episode statistics.

    ``seed`` seeds the action spaces' samplers (and EnvPool's pool); pass it to the first
    ``reset`` too, as the algorithms do, and two runs see the same trajectories.
    ``video_dir`` records env 0's episodes there (envs/video.py; ``video_episodes(episode) ->
    bool`` picks them, by default the capped cubic schedule); it needs a sync or async backend.
    Atari ids get ``atari``'s preprocessing (envs/atari.py; its defaults when None); MuJoCo
    ids are rendered, repeated and stacked with ``pixels`` (envs/pixels.py) when it is enabled.
    """
    if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs <= 0:  # True was gymnasium's TypeError
        raise OmnigymError(f"--num-envs must be a positive whole number, got {num_envs!r}")
    if backend not in BACKENDS:
        raise OmnigymError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "mjlab":  # its own task ids, on the GPU (envs/mjlab_backend.py)
        from omnigym.envs.mjlab_backend import make_mjlab_vec

        return RecordEpisodeStatistics(make_mjlab_vec(env, num_envs, seed, video_dir, **env_kwargs))
    env_id = resolve_env(env, env_kwargs)
    _quiet_mujoco_warnings(env_id)
    video = None
    if video_dir is not None:
        from omnigym.envs.video import recording

        video, backend = recording(env_id, backend, video_dir, video_episodes, env_kwargs=env_kwargs,
                                   auto=auto_backend(env_id))
    if not isinstance(env_id, str):
        envs = _vectorize_factory(env_id, num_envs, backend, env_kwargs, video)
    else:
        try:
            if pixels is not None and pixels.enabled:
                from omnigym.envs.pixels import make_pixel_vec

                envs = make_pixel_vec(env_id, num_envs, backend, pixels, env_kwargs)
            elif is_atari(env_id):
                envs = make_atari_vec(env_id, num_envs, backend, seed, atari or AtariOptions(), video)
            else:
                envs = _make_registered(env_id, num_envs, backend, seed, env_kwargs, video)
        except OmnigymError:
            raise
        except Exception as exc:  # a missing dependency (MuJoCo, ROMs) or an env that fails to build
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise OmnigymError(f"env {env_id} could not be made: {type(exc).__name__}: {detail}") from None
    envs = RecordEpisodeStatistics(envs)
    if seed is not None:
        envs.action_space.seed(seed)
        envs.single_action_space.seed(seed)
    return envs


_MUJOCO_WARNED: set[str] = set()


GYMNASIUMS_OWN_WARNINGS = ("compiler attribute 'settotalmass' is deprecated",)
"""MuJoCo warnings about gymnasium's bundled models (half_cheetah.xml), not the user's to act on: printed,
the line came before a refusal's one line (dqn on HalfCheetah-v5 said two)"""


def _print_mujoco_warning_once(message: str) -> None:
    if any(known in message for known in GYMNASIUMS_OWN_WARNINGS):
        return
    if message not in _MUJOCO_WARNED:
        _MUJOCO_WARNED.add(message)
        print(f"MuJoCo warning: {message}", file=sys.stderr, flush=True)


def _quiet_mujoco_warnings(env_id) -> None:
    """MuJoCo's own warning handler prints a warning again for every model it compiles (gymnasium's
    HalfCheetah: "settotalmass is deprecated", once per env made, 11 lines for an offline run's
    evaluator) and appends it to MUJOCO_LOG.TXT in the working directory, a file nobody asked for.
    Before a MuJoCo env is made, each distinct warning is printed once instead, and nothing written
    (async workers forked afterwards inherit the handler)."""
    if _MUJOCO_WARNED or "mujoco" not in sys.modules and not _is_mujoco(env_id):
        return
    try:
        import mujoco
    except Exception:  # not installed, or its renderer fails to load (MUJOCO_GL=osmesa without OSMesa):
        return  # said in one line where the env is made

    if mujoco.get_mju_user_warning() is None:  # a handler of the user's own stays
        mujoco.set_mju_user_warning(_print_mujoco_warning_once)


def _is_mujoco(env_id) -> bool:
    try:
        return "mujoco" in str(gym.spec(env_id).entry_point).lower()
    except Exception:  # not a registered id: made some other way, checked when it is made
        return False


def _vectorize_factory(factory, num_envs: int, backend: str, env_kwargs: dict, video=None) -> gym.vector.VectorEnv:
    if backend not in ("auto", "sync", "async"):
        raise OmnigymError(f"--backend {backend} needs a registered env id; your own env runs with sync or async")
    if isinstance(factory, gym.Env):  # an env object: it is the first env, copies are the others
        import copy

        made = [factory] + [copy.deepcopy(factory) for _ in range(num_envs - 1)]
        fns = [lambda e=e: e for e in made]
    else:
        fns = [lambda: factory(**env_kwargs)] * num_envs
    if video is not None:  # env 0 renders and is recorded
        fns = [lambda: video.wrap(made[0])] + fns[1:] if isinstance(factory, gym.Env) else \
            video.env_fns(factory, num_envs, env_kwargs)
    vector_cls = gym.vector.AsyncVectorEnv if backend == "async" else gym.vector.SyncVectorEnv
    try:
        return vector_cls(fns, autoreset_mode=AutoresetMode.NEXT_STEP)
    except Exception as exc:  # the user's env failed to build, or its spaces are not a gymnasium env's
        raise OmnigymError(f"your env could not be made: {type(exc).__name__}: {exc}") from None


def auto_backend(env_id) -> str:
    """What ``--backend auto`` runs: ale-py's C++ vector env for Atari, gymnasium's native
    vector env where the id has one (CartPole: numpy, all envs in one array), else sync
    (bench/env_throughput.py measures them side by side)."""
    if is_atari(env_id):
        return "ale"
    return "native" if isinstance(env_id, str) and has_native(env_id) else "sync"


def _make_registered(env_id: str, num_envs: int, backend: str, seed, env_kwargs: dict, video=None) -> gym.vector.VectorEnv:
    if backend == "auto":
        backend = auto_backend(env_id)

    if backend in ("sync", "async") and video is not None:  # env 0 renders and is recorded
        vector_cls = gym.vector.AsyncVectorEnv if backend == "async" else gym.vector.SyncVectorEnv
        envs = vector_cls(video.env_fns(lambda **kw: gym.make(env_id, **kw), num_envs, env_kwargs),
                          autoreset_mode=AutoresetMode.NEXT_STEP)
    elif backend == "sync":  # env fns that pickle (not gym.make_vec's closures): a checkpoint holds the envs
        envs = gym.vector.SyncVectorEnv([functools.partial(gym.make, env_id, **env_kwargs)] * num_envs,
                                        autoreset_mode=AutoresetMode.NEXT_STEP)
    elif backend == "async":
        envs = gym.make_vec(env_id, num_envs, vectorization_mode=backend,
                            vector_kwargs={"autoreset_mode": AutoresetMode.NEXT_STEP}, **env_kwargs)
    elif backend == "ale":
        raise OmnigymError(f"--backend ale runs Atari games (ale-py's vector env); {env_id} is not one: use "
                           "auto, sync, async or native")
    elif backend == "native":
        if not has_native(env_id):
            raise OmnigymError(f"{env_id} has no native vectorized implementation; use --backend sync or async")
        envs = gym.make_vec(env_id, num_envs, vectorization_mode="vector_entry_point", **env_kwargs)
    else:
        envs = _make_envpool(env_id, num_envs, seed, **env_kwargs)
    return envs


def _make_envpool(env_id: str, num_envs: int, seed: int | None, **env_kwargs):
    if importlib.util.find_spec("envpool") is None:
        raise missing_extra("envpool", "envpool")
    import envpool

    if env_id not in envpool.list_all_envs():
        raise OmnigymError(f"envpool has no {env_id}; use --backend sync, async or native")
    return EnvPoolVectorEnv(envpool.make_gymnasium(env_id, num_envs=num_envs, seed=seed or 0, **env_kwargs))
