"""The flags every algorithm shares, their range checks, and reading a saved config back.

Each algorithm has one config dataclass that extends ``RunConfig`` (language) or
``ControlConfig`` (gymnasium envs); the CLI is generated from it by tyro. ``cfg.check()``
runs first in every ``train`` (``process.scoped_run`` calls it): a value out of range is
refused in one line that names the flag, before anything is built or written.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

from omnigym.envs.atari import AtariOptions as ATARI  # the Atari flags' defaults live with the preprocessing
from omnigym.errors import OmnigymError, flag, require, show_flag  # noqa: F401  (flag, show_flag: config's names too)


def require_positive(cfg, *names: str) -> None:
    """Each named flag above 0 (each element of a tuple flag such as --hidden)."""
    for name in names:
        value = getattr(cfg, name)
        # --hidden with no widths parsed as () and trained a linear policy in silence
        require(value != (), f"{flag(name)} needs one or more values, got none (e.g. {flag(name)} 64 64)")
        ok = all(v > 0 for v in value) if isinstance(value, tuple) else value > 0
        require(ok, f"{flag(name)} must be positive, got {value}")


def require_rollout_holds_a_step(cfg) -> None:
    """A rollout of the on-policy algorithms is 2 or more steps an env. The step after an episode
    ends only starts the next one (gymnasium's next-step autoreset, no transition), so a 1-step
    rollout could hold no transition at all (PPO's update raised on an empty list, REINFORCE's loss
    was nan); of any two steps in a row, one is a transition."""
    require(cfg.num_steps >= 2, f"--num-steps must be 2 or more, got {cfg.num_steps}: the step after an episode "
                                "ends only starts the next one, so a rollout of 1 step an env can hold no transition")


def require_buffer_holds_a_batch(cfg) -> None:
    """An off-policy replay memory holds at least one minibatch (``--buffer-size 1`` with a batch of 64
    was taken, and every minibatch drew the same transition 64 times)."""
    require(cfg.buffer_size >= cfg.batch_size, f"--buffer-size {cfg.buffer_size} holds fewer transitions than one "
                                               f"--batch-size {cfg.batch_size} minibatch; give --buffer-size "
                                               f"{cfg.batch_size} or more")


def require_non_negative(cfg, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        require(value >= 0, f"{flag(name)} must be 0 or more, got {value}")


def require_fraction(cfg, *names: str) -> None:
    """Discounts, lambdas, probabilities: between 0 and 1."""
    for name in names:
        value = getattr(cfg, name)
        require(0 <= value <= 1, f"{flag(name)} must be between 0 and 1, got {value}")


def check_device(device: str) -> None:
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise OmnigymError(f"unknown --device {device!r}; use cpu, cuda, cuda:N or mps") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        require(count > 0, f"--device {device}: torch sees no CUDA GPU here (torch {torch.__version__}, "
                           f"CUDA build: {torch.version.cuda or 'no'}); use --device cpu")
        require(parsed.index is None or parsed.index < count,
                f"--device {device}: there are only {count} CUDA device(s) (cuda:0 to cuda:{count - 1})")
    elif parsed.type == "mps":
        require(torch.backends.mps.is_available(), f"--device {device}: MPS is not available here; use --device cpu")
    else:
        require(parsed.type == "cpu", f"--device {device} is not supported; use cpu, cuda, cuda:N or mps")


def check_precision(precision: str) -> None:
    """``--precision``: one of ``models.precision.PRECISIONS`` (language models, offline control)."""
    from omnigym.models.precision import PRECISIONS

    require(precision in PRECISIONS, f"unknown --precision {precision!r}; choose {' or '.join(PRECISIONS)}")


def check_compiler(device: str) -> None:
    """``--compile``: torch.compile's backend builds C++ kernels on CPU and Triton kernels on CUDA;
    without the tool it fails at the first minibatch with a page of traceback, so say it here."""
    import importlib.util
    import os
    import shutil

    import torch

    kind = torch.device(device).type
    require(kind in ("cpu", "cuda"), f"--compile runs on cpu or cuda, not {device}; leave --compile off")
    if kind == "cpu":
        compiler = os.environ.get("CXX", "g++")
        require(shutil.which(compiler) is not None, f"--compile needs a C++ compiler on CPU and {compiler} is not on "
                                                    "PATH; install g++ (apt-get install g++) or leave --compile off "
                                                    "(--no-compile on a resume)")
    else:
        require(importlib.util.find_spec("triton") is not None,
                "--compile on CUDA needs triton (CUDA builds of torch bring it); leave --compile off")
    # inductor makes this folder when torch._inductor is imported and writes its kernels there; one
    # it cannot make failed at that import with an OSError's traceback. Its default, as torch 2.13
    # names it (importing torch's own function would import torch._inductor, and fail the same way):
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    require(cache != "", "TORCHINDUCTOR_CACHE_DIR is set but empty, and torch would then write its kernels into the "
                         "working directory; unset it or name a folder")
    if cache is None:
        import getpass
        import re
        import tempfile

        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = f"uid_{os.getuid()}"
        cache = os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))
    cache = os.path.abspath(cache)
    try:
        os.makedirs(cache, exist_ok=True)
        writable = os.access(cache, os.W_OK | os.X_OK)
    except OSError:
        writable = False
    require(writable, f"--compile keeps its kernels in {cache}, which cannot be made or written to; set "
                      "TORCHINDUCTOR_CACHE_DIR to a folder you can write or leave --compile off (--no-compile on a "
                      "resume)")


def compiled(function, dynamic: bool, what: str):
    """``torch.compile(function)`` for a run with ``--compile`` (``check_compiler`` passed): a
    build that still fails at the first call (a compiler on PATH that cannot build, such as
    ``CXX=/bin/false``, or a broken toolchain) is one line naming ``what`` it was building, not
    inductor's page of traceback."""
    import torch

    graph = torch.compile(function, dynamic=dynamic)

    def call(*args, **kwargs):
        try:
            return graph(*args, **kwargs)
        except (torch._inductor.exc.InductorError, torch._dynamo.exc.BackendCompilerFailed) as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise OmnigymError(f"--compile could not build {what} ({reason}); fix the C++ compiler or leave "
                               "--compile off (--no-compile on a resume)") from None

    return call


@dataclass
class RunConfig:
    """Flags every algorithm has: seed, run directory, resume, threads, device, tracking."""

    seed: int = 1
    """seed for torch, numpy, python and the envs: same seed, same metrics on CPU"""
    run_dir: str | None = None
    """where the run writes (default runs/<algo>__<env or model>__<seed>__<time>); must be new or empty"""
    resume: str | None = None
    """continue the run in this directory from its last checkpoint"""
    overwrite: bool = False
    """let --run-dir replace the run already in that directory"""
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
    """show a progress bar on a terminal (a progress line every 30 s elsewhere)"""
    plot: bool = True
    """write the learning curve PNG at the end"""
    checkpoint_minutes: float = 30.0
    """also write a checkpoint when this many minutes have passed since the last one (or the start), whatever
    --checkpoint-every says: a SIGKILL or a step longer than the stop's grace loses at most this much; 0: by
    step count only"""

    RESUME_FIXED: ClassVar[tuple[str, ...]] = ("seed",)
    """settings a resumed run must keep: its checkpoint only fits them (track/resume.py refuses a change)"""
    SAVED_REQUIRED: ClassVar[tuple[str, ...]] = ()
    """settings a saved config.json must hold (``config_from_dict``): what the run is about"""
    BUDGET: ClassVar[tuple[str, str] | None] = None
    """(the flag that sets the run's length, the checkpoint counter it is compared with): a resumed
    run must have steps left"""
    FINAL_MODEL: ClassVar[bool] = False
    """the run ends by writing ``model/`` (language runs): it is finished only once that folder is whole"""
    RESUMABLE: ClassVar[bool] = True
    """the run writes checkpoints that ``--resume`` continues (text_reinforce's short runs write none)"""

    def check(self) -> None:
        """Refuse values no run can use. Subclasses add their own ranges after this."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, float):
                require(math.isfinite(value), f"{flag(field.name)} must be a finite number, got {value}")
        require_non_negative(self, "torch_threads", "checkpoint_minutes")
        require(0 <= self.seed < 2**32, f"--seed must be between 0 and 2**32 - 1, got {self.seed}")
        if self.wandb:
            import importlib.util

            require(importlib.util.find_spec("wandb") is not None,
                    "wandb is not installed; install it with: pip install 'omnigym[wandb]'")
        require(not (self.resume and self.overwrite), "--resume continues a run and --overwrite replaces it; "
                                                      "give one of them")
        for name in ("run_dir", "resume"):  # "" read as not given: a new run under runs/, even for --resume ""
            require(getattr(self, name) != "", f"{flag(name)} is empty; name a directory")
        check_device(self.device)
        check_named_folders(self)

    @classmethod
    def unknown_settings(cls, values: dict) -> dict:
        """The keys of a saved config.json this config has no field for (``track/run.py`` keeps
        them when a resume rewrites the file; a method so that the run need not import this module)."""
        return unknown_settings(cls, values)

    def apply_preset(self, given: set[str] | None = None) -> tuple["RunConfig", str | None]:
        """The config a run trains with, and the line that says what a preset filled in (None:
        nothing; printed when the run starts). Only control configs have presets."""
        return self, None

    def with_preset(self, given: set[str] | None = None) -> "RunConfig":
        """This config with its family's preset applied to the flags not in ``given``."""
        return self.apply_preset(given)[0]

    def trains_on_ray(self) -> bool:
        """Whether ``train()`` runs as a Ray task (``--ray-trainer``, where the config has it)."""
        return False

    def data_parallel(self) -> bool:
        """Whether the run trains on processes a launcher started (a language config's backend)."""
        return False


@dataclass
class ControlConfig(RunConfig):
    """Flags of the control algorithms: the env, its vectorization, the step budget."""

    env_id: str = "CartPole-v1"
    """gymnasium env id, or module:EnvName for your own env (``omnigym list`` shows what is installed)"""
    total_timesteps: int = 100_000
    """env steps to train for, summed over the vector envs"""
    num_envs: int = 8
    """parallel envs in the vector env"""
    backend: str = "auto"
    """vector env backend: auto, sync, async, native, envpool, ale (Atari); auto picks ale for Atari, native where
    the env has one, else sync"""
    checkpoint_every: int = 25_000
    """env steps between checkpoints (one is always written at the end); 0 writes only the last"""
    print_episodes: bool = False
    """print one line per finished episode (global_step=..., episodic_return=...)"""
    capture_video: bool = False
    """record episodes of env 0 as .mp4 into RUN_DIR/videos (episodes 0, 1, 8, 27, ..., 1000, then every
    1000th; needs omnigym[video]; docs/video.md)"""

    preset: str = "auto"
    """published hyperparameters for the env's family, for every flag you do not give: auto picks
    by env id (atari, mujoco, locomotion; none elsewhere), none keeps the defaults shown here; printed at start"""
    env_kwargs: tuple[str, ...] = ()
    """KEY=VALUE settings passed to the env's constructor, e.g. --env-kwargs friction=0.4,1.0 push_interval=none
    (values are Python literals or strings; docs/robots.md lists the locomotion task's)"""
    noop_max: int = ATARI.noop_max
    """Atari: up to this many no-op actions after a reset"""
    frame_skip: int = ATARI.frame_skip
    """Atari: repeat each action this many frames (max of the last two is the observation)"""
    episodic_life: bool = ATARI.episodic_life
    """Atari: a lost life ends the episode for learning (no bootstrap); returns stay whole games"""
    fire_reset: bool = ATARI.fire_reset
    """Atari: press FIRE after a reset in games that need it"""
    clip_rewards: bool = ATARI.clip_rewards
    """Atari: learn from each reward's sign; returns report the game score"""
    frame_stack: int = ATARI.frame_stack
    """Atari: the observation is the last N 84x84 grayscale frames (--pixels: the last N RGB frames)"""
    sticky_actions: float | None = ATARI.sticky_actions
    """Atari: repeat-previous-action probability (default: the id's own, 0.25 for ALE/*-v5, 0 for NoFrameskip-v4)"""

    pixels: bool = False
    """observe rendered RGB frames instead of the state (dm_control/... and gymnasium MuJoCo ids, headless with
    MUJOCO_GL=egl or osmesa); frames stack along channels; docs/pixels.md"""
    image_size: int = 84
    """--pixels: frames are this many pixels square (DrQ-v2's 84)"""
    action_repeat: int | None = None
    """--pixels: simulator steps per action, rewards summed (default: PlaNet's per-domain value, cartpole 8, reacher
    and cheetah 4, ..., else DrQ-v2's 2)"""

    RESUME_FIXED: ClassVar[tuple[str, ...]] = RunConfig.RESUME_FIXED + ("env_id", "num_envs", "backend", "hidden",
                                                                       "frame_stack", "pixels", "image_size",
                                                                       "action_repeat", "env_kwargs",
                                                                       # a resume applies no preset again: another
                                                                       # one was written to config.json, unapplied
                                                                       "preset")
    SAVED_REQUIRED = ("env_id",)
    BUDGET = ("total_timesteps", "global_step")
    PRESETS: ClassVar[dict[str, tuple[str, dict]]] = {}
    """family -> (where the figures come from, {field: value}); each algorithm has its own"""

    def check(self) -> None:
        super().check()
        require_positive(self, "total_timesteps", "num_envs", "frame_skip", "frame_stack")
        require_non_negative(self, "checkpoint_every", "noop_max")
        if self.sticky_actions is not None:
            require_fraction(self, "sticky_actions")
        require(self.preset in ("auto", "none", *self.PRESETS),
                f"unknown --preset {self.preset!r}; choose auto, none" + "".join(f", {p}" for p in self.PRESETS))

    def preset_field_applies(self, name: str) -> bool:
        """Whether a preset's value for ``name`` is for this run (a mode's own settings are not, without it)."""
        return True

    def _check_preset_fits(self, family: str) -> None:
        """A preset named on the command line is for its family's envs: refused on an env of
        another family, and a game's (its network, its symmetries) on anything but that game.
        ``--preset connect_four`` on CartPole trained with connect four's settings, in silence."""
        from omnigym.envs.games import FAMILIES, is_game_id
        from omnigym.envs.vector import env_family

        own = env_family(self.env_id)
        games = {game_family for _, game_family in FAMILIES}
        # e.g. --preset mujoco on a dm_control or user env, or a board game's on another board: asked for
        if own == family or (own is None and (family not in games or is_game_id(self.env_id))):
            return
        fits = (f"two-seat games ({', '.join(game for game, game_family in FAMILIES if game_family == family)}, "
                "or another board with no preset of its own)" if family in games else f"{family} envs")
        raise OmnigymError(f"--preset {family} is for {fits}; {self.env_id} is "
                           + (f"in the {own} family (--preset auto picks its preset)" if own else "not one")
                           + ": leave --preset out, or give --preset none")

    def apply_preset(self, given: set[str] | None = None) -> tuple["ControlConfig", str | None]:
        """This config with its family's preset applied to the flags not in ``given`` (from Python:
        the fields left at their defaults), and the line saying what was applied. ``omnigym train
        --resume`` gives every field (the run's saved values, and the flags given now), so a
        resumed run keeps its own."""
        if self.preset == "none":
            return self, None
        family = self.preset
        if family == "auto":
            from omnigym.envs.vector import env_family

            family = env_family(self.env_id)
            if family not in self.PRESETS or self.pixels:  # a state preset (MuJoCo's normalization) does not fit frames
                return dataclasses.replace(self, preset="none"), None
        require(family in self.PRESETS, f"unknown --preset {family!r}; choose auto, none"
                + "".join(f", {p}" for p in self.PRESETS))
        if self.preset != "auto":
            self._check_preset_fits(family)
        if given is None:
            given = {f.name for f in dataclasses.fields(self) if f.default is not dataclasses.MISSING
                     and getattr(self, f.name) != f.default}
        source, values = self.PRESETS[family]
        applied = {k: v for k, v in values.items() if k not in given and self.preset_field_applies(k)}
        if not applied:  # e.g. a resumed run from the command line: all its values are its own
            return dataclasses.replace(self, preset=family), None
        shown = " ".join(show_flag(k, v) for k, v in applied.items())
        # Said when the run starts (track/run.py), not here: a run refused before it starts says one line only.
        return dataclasses.replace(self, preset=family, **applied), (
            f"preset {family} ({source}): {shown}\n  (flags you give win; --preset none keeps the plain defaults)")


@dataclass
class LanguageModelConfig(RunConfig):
    """Flags every language-model trainer shares: the model, its chat template, LoRA."""

    model: str = "tiny"
    """hub id or local path of a causal LM; "tiny" builds a ~1M-parameter model offline"""
    chat_template: str | None = None
    """Jinja chat template (string or file) for models that have none"""
    lora_r: int = 0
    """LoRA rank (0 trains all weights)"""
    precision: str = "fp32"
    """fp32, or bf16: the model's matrix products in bfloat16 (autocast), its weights, gradients and
    optimizer state in float32, as TRL's --bf16; fast on CPUs with AMX and on GPUs, slow where
    bf16 is emulated (docs/precision.md)"""
    training_backend: str = "local"
    """where training steps run: local (this process), ddp or fsdp2 (data-parallel over the processes
    torchrun starts: gloo on CPU, NCCL on GPU), deepspeed (ZeRO through the deepspeed launcher and
    --deepspeed-config; the [deepspeed] extra); docs/scale_out.md. Its old name --backend works until
    the next release"""
    deepspeed_config: str | None = None
    """DeepSpeed JSON config for --training-backend deepspeed (ZeRO stage 0-3, precision, CPU offload);
    omnigym's optimizer and batch sizes are used, so leave those out of it"""

    RESUME_FIXED: ClassVar[tuple[str, ...]] = RunConfig.RESUME_FIXED + ("model", "lora_r")
    SAVED_REQUIRED = ("model",)
    BUILT_IN_MODELS: ClassVar[tuple[str, ...]] = ("tiny", "tiny-small", "lstm")
    """--model names omnigym builds itself (models.lm.TINY_MODELS, models/lstm_lm.py), before any folder
    of the same name here: never recorded as a path (track/resume.py)"""
    SCALAR_HEAD: ClassVar[str | None] = None
    """what the run puts a scalar head on --model for (rm, prm: the reward model; rlhf: the value
    model), which a transformers sequence-classification class does, and an LSTM LM has none"""

    def check(self) -> None:
        super().check()
        require_non_negative(self, "lora_r")
        check_precision(self.precision)
        require(self.precision == "fp32" or self.training_backend != "deepspeed",
                "--precision bf16 with --training-backend deepspeed: DeepSpeed's precision is its config's "
                "(a \"bf16\": {\"enabled\": true} section in --deepspeed-config); leave --precision out")
        check_backend(self)
        if self.model == "lstm":  # models/lstm_lm.py: a policy sampled by its own engine only
            require(self.SCALAR_HEAD is None, f"--model lstm is an LSTM policy, and this run needs a transformer "
                                              f"under {self.SCALAR_HEAD}; give tiny, a model folder or a hub id")
            engine = getattr(self, "engine", "auto")
            require(engine == "auto", f"--engine {engine} cannot run a recurrent (LSTM) policy; leave --engine at auto")
            require(not self.lora_r, "--lora-r adapts a transformer's attention and MLP layers, which an LSTM "
                                     "policy has none of; leave --lora-r out (the LSTM trains whole)")

    def data_parallel(self) -> bool:
        return self.training_backend in ("ddp", "fsdp2", "deepspeed")


NAMED_REWARDS = MappingProxyType({"rm:": "rm:RUN_DIR or rm:http://HOST:PORT", "prm:": "prm:RUN_DIR",
                                  "judge:": "judge:MODEL_FOLDER or judge:http://HOST:PORT/v1"})


def check_named_folders(cfg) -> None:
    """An empty folder or file name is refused: "" is ``Path(".")``, and the working directory
    was read as the model, reward model, template or rubric (and a run there trained on)."""
    from omnigym.track.resume import PATH_FLAGS, REWARD_FLAGS, named_folders

    for name in PATH_FLAGS:
        value = getattr(cfg, name, None)
        require(not isinstance(value, str) or bool(value.strip()),
                f"{flag(name)} is empty; give a folder or file, or leave it out")
    for name in REWARD_FLAGS:
        for _, prefix, path in named_folders(name, getattr(cfg, name, None)):
            if not path.strip():
                raise OmnigymError(f"{flag(name)} {prefix} names no {'judge' if prefix == 'judge:' else 'folder'}; "
                                   f"give {NAMED_REWARDS[prefix]}")


def check_backend(cfg) -> None:
    """A data-parallel backend needs the processes its launcher starts; DeepSpeed its extra and
    a readable config."""
    from omnigym.backends import BACKENDS
    from omnigym.distributed import launched_by_torchrun

    backend = cfg.training_backend
    require(backend in BACKENDS, f"unknown --training-backend {backend!r}; choose {', '.join(BACKENDS)}")
    if backend == "local":
        require(cfg.deepspeed_config is None, "--deepspeed-config is read by --training-backend deepspeed only")
        import os

        processes = int(os.environ.get("WORLD_SIZE", "1")) if launched_by_torchrun() else 1
        require(processes == 1, f"torchrun started {processes} processes but --training-backend is local: each "
                                "would train alone into its own run; give --training-backend ddp, fsdp2 or deepspeed")
        return
    # torchrun for every backend, as the README shows (DeepSpeed's own launcher works too)
    also, page = (" (or DeepSpeed's launcher: deepspeed -m omnigym ...)", "docs/scaling.md") \
        if backend == "deepspeed" else ("", "docs/scale_out.md")
    require(launched_by_torchrun(), f"--training-backend {backend} trains on the processes its launcher starts: "
                                    f"torchrun --nproc-per-node 2 -m omnigym train ... --training-backend {backend}"
                                    f"{also} ({page}); one process uses --training-backend local")
    if backend == "deepspeed":
        import importlib.util

        require(importlib.util.find_spec("deepspeed") is not None,
                "--training-backend deepspeed needs DeepSpeed; install it with: pip install 'omnigym[deepspeed]'")
        require(cfg.deepspeed_config is not None, "--training-backend deepspeed needs --deepspeed-config FILE.json "
                                                  "(examples in configs/deepspeed/)")
        from omnigym.backends.deepspeed import read_config

        read_config(cfg.deepspeed_config)
    elif cfg.deepspeed_config is not None:
        raise OmnigymError("--deepspeed-config is read by --training-backend deepspeed only")


RENAMED_FLAGS = (("backend", "training_backend"),)
"""(old name, today's name) of a language config's renamed fields. ``backend`` meant the training
backend on language configs and the vector-env backend on control configs (which keep it); the
old name is read, from the command line and from a saved config.json, until the next release."""


def renamed_flags(argv: list[str], config_cls) -> list[str]:
    """``argv`` with a language command's old flag names put to today's, saying so in one line;
    an old name given beside its new one is refused (which of the two would win is not obvious)."""
    fields = {f.name for f in dataclasses.fields(config_cls)}
    renamed = list(argv)
    for old_name, new_name in RENAMED_FLAGS:
        if old_name in fields or new_name not in fields:  # a control config: --backend is its own flag
            continue
        old, new = flag(old_name), flag(new_name)
        given_old = [i for i, arg in enumerate(argv) if arg == old or arg.startswith(old + "=")]
        if not given_old:
            continue
        require(not any(arg == new or arg.startswith(new + "=") for arg in argv),
                f"{old} is the old name of {new}; give {new} only")
        import os
        import sys

        if os.environ.get("RANK", "0") == "0":  # under torchrun every process reads the flags; the first says it
            print(f"omnigym: warning: {old} is now {new} on this command; {old} will stop working in the next "
                  "release", file=sys.stderr)
        for i in given_old:
            renamed[i] = new + argv[i][len(old):]
    return renamed


def config_from_dict(cls, values: dict, saved_file: str | None = None):
    """A config of class ``cls`` from a saved ``config.json``, checked as the command line checks
    its flags: each value's type (typeguard, tyro's own checker) and range (``cfg.check()``); one
    line naming the key (and ``saved_file``) otherwise. Values read from a file (``saved_file``
    given) must also hold what the run is about (``SAVED_REQUIRED``, its data); a dict from
    Python takes defaults for what it leaves out. A key saved under its old name
    (``RENAMED_FLAGS``) is read as today's; keys this version does not know are left out here
    (``unknown_settings`` names them)."""
    values = renamed_keys(cls, values)
    names = {f.name for f in dataclasses.fields(cls)}
    source = saved_file or "the saved config"
    # What the run is about (its env, its model, its data) has no default that could stand in for
    # it: eval would play CartPole with a HalfCheetah policy. Other missing keys take their defaults,
    # as a config.json written before the setting existed needs (a checkpoint that does not fit
    # them is refused when it is restored).
    for name in (cls.SAVED_REQUIRED + tuple(n for n in ("data", "task") if n in names)) if saved_file else ():
        require(name in values, f"{source} has no {name!r}; the run was made with a value for {flag(name)} "
                                "that its checkpoint needs: put it back, or start a new run")
    known = {k: (tuple(v) if isinstance(v, list) else v) for k, v in values.items() if k in names}
    hints = typing.get_type_hints(cls)
    for name, value in known.items():
        check_saved_type(name, value, hints[name], source)
    cfg = cls(**known)
    # The ranges every run checks, on the settings alone: where this process runs (device,
    # launcher, W&B) and how (--compile: eval and collect never compile, and a resume may turn it
    # off on a machine without a compiler) is the current command's to say, not the saved file's.
    placement = {f.name: f.default for f in dataclasses.fields(cls)
                 if f.name in ("device", "wandb", "resume", "overwrite", "training_backend", "deepspeed_config",
                               "ray_address", "compile")}
    if "training_backend" in placement and data_parallel_launch():
        placement["training_backend"] = "ddp"  # a launcher's processes: the launcher check is this command's
    try:
        dataclasses.replace(cfg, **placement).check()
    except OmnigymError as exc:
        raise OmnigymError(f"{source}: {exc}") from None
    return cfg


def data_parallel_launch() -> bool:
    """This process is one of several a launcher (torchrun, deepspeed) started."""
    import os

    from omnigym.distributed import launched_by_torchrun

    return launched_by_torchrun() and int(os.environ.get("WORLD_SIZE", "1")) > 1


def check_saved_type(name: str, value, annotation, source: str) -> None:
    import typeguard

    # JSON has no int/bool distinction that Python keeps: True is an int to isinstance
    wrong_bool = isinstance(value, bool) and annotation in (int, float, int | None, float | None)
    try:
        # every element of a tuple, not typeguard's default of the first one only
        typeguard.check_type(value, annotation, collection_check_strategy=typeguard.CollectionCheckStrategy.ALL_ITEMS)
    except typeguard.TypeCheckError:
        wrong_bool = True
    if wrong_bool:
        shown = list(value) if isinstance(value, tuple) else value
        plain = isinstance(annotation, type) and not typing.get_args(annotation)
        kind = annotation.__name__ if plain else str(annotation)
        raise OmnigymError(f"{source}: {name!r} must be {kind}, got {shown!r} (edit the file, or start a new run)")


def renamed_keys(cls, values: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    values = dict(values)
    for old, new in RENAMED_FLAGS:
        if old in values and old not in names:
            values.setdefault(new, values.pop(old))
    return values


def unknown_settings(cls, values: dict) -> dict:
    """The keys of a saved config.json that ``cls`` has no field for (a newer version's
    settings, or another algorithm's), besides ``algo``."""
    names = {f.name for f in dataclasses.fields(cls)} | {"algo", "data_files", "paths", "model_weights"}  # track/resume.py
    return {k: v for k, v in renamed_keys(cls, values).items() if k not in names}
