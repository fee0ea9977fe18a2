"""What a run will allocate, estimated before it allocates, against the memory free here.

A run that cannot fit is refused in one line naming the flag that asks for the most and the
estimate, before a single env or buffer exists: ``--num-envs 100000`` used to sit silent for
minutes while memory climbed, and a replay memory larger than the machine fails hours in, when
it has filled (numpy's zeros are only paid for when written). The figures are estimates:
generous enough that a run refused would not have fitted, close enough that every default and
preset fits a machine that can run it.

Control runs get two checks, because what an observation costs is known only once an env
exists: ``check_envs`` before the vector env is made (the envs themselves), ``check_buffers``
after it and before the algorithm builds its rollout storage, replay memory and networks.
Language runs (SFT, DPO, RM) get ``check_language_batch`` once the model and data are loaded,
before the first step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from omnigym.errors import OmnigymError

KB, MB, GB = 1 << 10, 1 << 20, 1 << 30

ENV_BYTES = 64 * KB
"""one gymnasium env in this process, with its wrappers and RNG: 100,000 CartPole envs took 5.5 GB (55 KB each)"""
SIMULATOR_BYTES = 2 * MB
"""one env of the ``atari`` or ``mujoco`` family: an emulator with its frame buffers, or a MuJoCo
model and its data (measured: 1.3 and 1.1 MB)"""
PROCESS_BYTES = 40 * MB
"""what each env of ``--backend async`` adds: a Python process of its own"""
FREE_SHARE = 0.9
"""of the memory free now, what a run may plan to use (the rest for everything not counted)"""
SAID_ABOVE = 1 * GB
"""a part that fits but is this large is said in one line before it is made: building 100,000
envs takes minutes, which used to pass in silence"""


def available_memory() -> int | None:
    """Bytes this process can still allocate: the system's available memory (psutil, else
    /proc/meminfo), capped by a cgroup v2 limit (a container); None where neither can be read,
    and then nothing is refused."""
    free = None
    try:
        import psutil

        free = int(psutil.virtual_memory().available)
    except ImportError:
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * KB
        except (OSError, ValueError, IndexError):
            pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            free = min(free, int(limit) - used) if free is not None else int(limit) - used
    except (OSError, ValueError):
        pass
    return free


def shown(size: float) -> str:
    return f"{size / GB:.1f} GB" if size >= 0.1 * GB else f"{size / MB:.0f} MB"


def check_fits(needs: dict[str, tuple[str, int]], available: int | None) -> None:
    """``needs``: part -> (the flags that size it, bytes). Refuses in one line when the sum is
    more than the memory free here allows, naming the largest part's flags."""
    total = sum(size for _, size in needs.values())
    _, (flags, _) = max(needs.items(), key=lambda item: item[1][1])
    detail = ", ".join(f"{name} {shown(size)}" for name, (_, size) in needs.items() if size >= MB)
    if available is None or total <= FREE_SHARE * available:
        return
    names = " or ".join(word for word in flags.split() if word.startswith("--"))
    raise OmnigymError(f"{flags} needs about {shown(total)} of memory in all ({detail}) and {shown(available)} is "
                       f"free here; give a smaller {names}")


def env_needs(cfg, family: str | None) -> dict[str, tuple[str, int]]:
    """The vector env of a control config, before it is made; ``family``: ``envs.vector.env_family``."""
    each = (SIMULATOR_BYTES if family else ENV_BYTES) + (PROCESS_BYTES if cfg.backend == "async" else 0)
    return {"envs": (f"--num-envs {cfg.num_envs}", cfg.num_envs * each)}


def check_envs(cfg, family: str | None, available: int | None = None) -> None:
    """Refuses envs that cannot fit; envs that fit but take over ``SAID_ABOVE`` are said in one
    line, because making them takes minutes (buffers are not: numpy allocates them lazily)."""
    available = available_memory() if available is None else available
    needs = env_needs(cfg, family)
    check_fits(needs, available)
    (flags, total), = needs.values()
    if total >= SAID_ABOVE:
        free = f" of the {shown(available)} free here" if available is not None else ""
        print(f"omnigym: note: {flags} takes about {shown(total)}{free}; making the envs may take minutes",
              file=sys.stderr, flush=True)


def stored_bytes(space) -> int:
    """One observation or action as the buffers hold it: images as bytes, the rest as float32
    (float64 observations are stored as float32); a Dict (a goal env's), its parts together."""
    parts = getattr(space, "spaces", None)
    if isinstance(parts, dict):
        return sum(stored_bytes(part) for part in parts.values())
    shape = getattr(space, "shape", None) or ()
    itemsize = 1 if getattr(space, "dtype", None) == np.uint8 else 4
    return int(np.prod(shape, dtype=np.int64)) * itemsize if shape else 8


def buffer_needs(cfg, family: str | None, observation_space, action_space) -> dict[str, tuple[str, int]]:
    """The envs, the rollout storage (PPO, REINFORCE: ``--num-steps`` x ``--num-envs``, held
    three times over: numpy buffers, the flat batch, its tensors) or the replay memory (DQN, SAC,
    TD3: ``--buffer-size`` transitions, or the run's length if shorter: numpy pays for a page
    when it is first written; an Atari frame stack stores each frame once, plus 25% slack) and
    the networks (weights, gradients, Adam's two moments, a target copy)."""
    needs = env_needs(cfg, family)
    obs, action = stored_bytes(observation_space), stored_bytes(action_space)
    step_extras = 8 * 4  # reward, value, log-prob, done flags, advantage, return
    if hasattr(cfg, "num_steps"):
        steps = (cfg.num_steps + 1) * cfg.num_envs
        needs["rollout"] = (f"--num-steps {cfg.num_steps} x --num-envs {cfg.num_envs}",
                            3 * steps * (obs + action + step_extras))
    if hasattr(cfg, "buffer_size"):
        held = min(cfg.buffer_size, cfg.total_timesteps + cfg.num_envs)
        stack = getattr(cfg, "frame_stack", 1)
        shape = getattr(observation_space, "shape", None) or ()
        # stacked along channels (Atari: one channel a frame; --pixels: three): a frame is stored once
        per_obs = obs // stack if stack > 1 and len(shape) == 3 and shape[0] % stack == 0 else obs
        # each observation once (a frame once) with its slack, the next-observation index, action, reward, flags
        needs["replay memory"] = (f"--buffer-size {cfg.buffer_size}",
                                  held * (per_obs * 5 // 4 + action + 2 * 8 + 2 * 4))
        if hasattr(cfg, "batch_size"):
            needs["minibatch"] = (f"--batch-size {cfg.batch_size}", 4 * cfg.batch_size * (2 * obs + action + 16))
    hidden = tuple(getattr(cfg, "hidden", ()) or ())
    if len(getattr(observation_space, "shape", ()) or ()) == 3:
        parameters = 1_700_000  # the Nature CNN at 84 x 84
    else:
        sizes = (max(obs // 4, 1), *hidden, max(action // 4, 1))
        parameters = sum(a * b + b for a, b in zip(sizes, sizes[1:]))
    needs["networks"] = (f"--hidden {' '.join(map(str, hidden))}", parameters * 4 * 4 * 3)
    return needs


def check_buffers(cfg, family: str | None, observation_space, action_space, available: int | None = None) -> None:
    check_fits(buffer_needs(cfg, family, observation_space, action_space),
               available_memory() if available is None else available)


def language_batch_bytes(rows: int, tokens: int, model_config, logits: bool = True) -> int:
    """One training step of a language model on ``rows`` sequences of up to ``tokens`` tokens:
    the logits and their log-softmax (float32, 8 bytes a vocabulary entry), and what each layer
    keeps for the backward pass (about 34 bytes of the hidden size a token, Korthikanti et al.
    2022, and the attention scores, 4 bytes a head and key); ``logits`` False: a scalar head (a
    reward model) has none. An estimate on the low side: a
    batch refused by it would not have fitted."""
    vocab = getattr(model_config, "vocab_size", None) or 32_000
    hidden = getattr(model_config, "hidden_size", None) or 1024
    layers = getattr(model_config, "num_hidden_layers", None) or 12
    heads = getattr(model_config, "num_attention_heads", None) or 16
    per_token = (8 * vocab if logits else 0) + layers * (34 * hidden + 4 * heads * tokens)
    return rows * tokens * per_token


def check_language_batch(flag: str, rows: int, tokens: int, model_config, logits: bool = True,
                         available: int | None = None) -> None:
    """Before the first step: the batch a step takes (``rows`` is what it draws, at most the
    training set) fits in the memory free here, else one line naming ``flag``."""
    check_fits({"batch": (flag, language_batch_bytes(rows, tokens, model_config, logits))},
               available_memory() if available is None else available)
