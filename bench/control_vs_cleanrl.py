"""Training speed (env steps per second) of omnigym's control algorithms vs CleanRL's, side by side.

Pairs (omnigym command vs CleanRL script, the same hyperparameters on both command lines):

    ppo-halfcheetah  omnigym train ppo  --env-id HalfCheetah-v5     vs  ppo_continuous_action.py  HalfCheetah-v4
    ppo-pong         omnigym train ppo  --env-id ALE/Pong-v5        vs  ppo_atari_envpool.py      Pong-v5 (EnvPool)
                     --sticky-actions 0
    dqn-pong         omnigym train dqn  --env-id PongNoFrameskip-v4 vs  dqn_atari.py              PongNoFrameskip-v4
    sac-halfcheetah  omnigym train sac  --env-id HalfCheetah-v5     vs  sac_continuous_action.py  HalfCheetah-v4

    python bench/control_vs_cleanrl.py --cleanrl DIR [--pairs ...] [--steps N | --seconds S] [--repeats R]

DIR holds CleanRL's ``cleanrl/*.py`` and ``cleanrl_utils/`` (``git clone
https://github.com/vwxyzjn/cleanrl``; nothing of CleanRL is kept in this repository). CleanRL
runs in a venv of its own, built on first use in bench/.cache/cleanrl-control-venv with the
pins printed by ``--show-venv`` (gymnasium 0.29.1, MuJoCo 2.3.7 for the -v4 robots, EnvPool
0.8.4 with gym 0.23.1 for ppo_atari_envpool.py, ale-py 0.8.1 + Shimmy 1.3.0 for
dqn_atari.py, whose Pong ROM is imported from this venv's ale-py wheel; torch the same
version as here, so no CUDA download).

Every run is a fresh process; omnigym and CleanRL alternate (omnigym, CleanRL, omnigym, ...)
so that drifts in machine load hit both alike. Each run stops after ``--steps`` env steps
(``--total-timesteps`` on both sides) or is stopped after ``--seconds`` of wall time (then
``--total-timesteps`` is the published budget, so the schedules are the published ones).
SPS is what each program reports itself, measured the same way on both sides (env steps
since its training loop started / seconds since then): omnigym's last ``perf/sps`` in
RUN_DIR/metrics.jsonl, CleanRL's last ``SPS:`` line. The table gives medians over repeats.

Episode returns against the global step (the ``global_step=..., episodic_return=...`` lines
both print) go into one PNG per pair in ``--out``.

Threads: by default each library runs as it does out of the box (omnigym ``--torch-threads
1``; CleanRL torch's default, all cores: OMP_NUM_THREADS is removed from its environment);
``--threads N`` gives both N. ``--variant NAME=FLAGS`` adds a row of omnigym with extra flags
(e.g. ``compiled=--compile``), alternated with the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
VENV = CACHE / "cleanrl-control-venv"
EPISODE = re.compile(r"global_step=(\d+), episodic_return=\[?\s*([-\d.e+]+)")
SPS = re.compile(r"^SPS:\s*(\d+)", re.M)

# What CleanRL's scripts need here (Python 3.11), found by trying: gymnasium 0.29.1 (the
# scripts' pin); MuJoCo 2.3.7 for gymnasium 0.29.1's -v4 robots (plus imageio, which its
# MuJoCo env imports); EnvPool 0.8.4 (the first with Python 3.11 wheels; CleanRL pins <0.7)
# with gym 0.23.1 (ppo_atari_envpool.py uses gym's 4-tuple step API, which EnvPool gives
# for gym < 0.26) and numpy < 2 (EnvPool 0.8.4 is built against numpy 1.x); ale-py 0.8.1 and
# Shimmy 1.3.0 register PongNoFrameskip-v4 for gymnasium 0.29.1 (ale-py >= 0.9, which ships
# ROMs, needs gymnasium 1.x); opencv for cleanrl_utils' Atari wrappers; psutil for its
# replay buffer's memory check.
CLEANRL_PINS = ["gymnasium==0.29.1", "numpy==1.26.4", "tyro==1.0.17", "tensorboard==2.21.0", "mujoco==2.3.7",
                "imageio==2.38.1", "envpool==0.8.4", "gym==0.23.1", "opencv-python-headless==4.11.0.86",
                "psutil==7.2.2", "ale-py==0.8.1", "shimmy[atari]==1.3.0"]
ROMS = ["pong"]


@dataclass
class Pair:
    algo: str
    omnigym_env: str
    cleanrl_script: str
    cleanrl_env: str
    published_steps: int
    shared: dict
    """hyperparameters passed under the same flag name to both programs (both use tyro)"""
    omnigym_only: list[str] = field(default_factory=list)
    """omnigym flags for what CleanRL's script hard-codes (its network, its wrappers)"""
    note: str = ""


PPO_MUJOCO = dict(num_envs=1, num_steps=2048, learning_rate=3e-4, anneal_lr=True, gamma=0.99, gae_lambda=0.95,
                  num_minibatches=32, update_epochs=10, norm_adv=True, clip_coef=0.2, clip_vloss=True, ent_coef=0.0,
                  vf_coef=0.5, max_grad_norm=0.5)
PPO_ATARI = dict(num_envs=8, num_steps=128, learning_rate=2.5e-4, anneal_lr=True, gamma=0.99, gae_lambda=0.95,
                 num_minibatches=4, update_epochs=4, norm_adv=True, clip_coef=0.1, clip_vloss=True, ent_coef=0.01,
                 vf_coef=0.5, max_grad_norm=0.5)
# buffer_size: half the published 1M on both sides. CleanRL's replay buffer keeps 4 stacked
# frames per transition, np.zeros((1M, 1, 4, 84, 84)) = 26.3 GiB, which a 24 GiB machine
# refuses to allocate (omnigym's keeps each frame once: about 8.8 GB for 1M).
DQN_ATARI = dict(num_envs=1, learning_rate=1e-4, buffer_size=500_000, gamma=0.99, tau=1.0,
                 target_network_frequency=1000, batch_size=32, start_e=1.0, end_e=0.01, exploration_fraction=0.10,
                 learning_starts=80_000, train_frequency=4)
SAC_MUJOCO = dict(num_envs=1, buffer_size=1_000_000, gamma=0.99, tau=0.005, batch_size=256, learning_starts=5000,
                  policy_lr=3e-4, q_lr=1e-3, policy_frequency=2, target_network_frequency=1, alpha=0.2, autotune=True)
# Atari preprocessing as both CleanRL scripts do it (EnvPool's defaults; cleanrl_utils' wrappers):
# 30 no-ops, skip 4 with max-pooling, fire reset, 84x84 gray, 4 frames, episodic life and
# clipped rewards for learning, no sticky actions, 108k frames per game at most.
ATARI_FLAGS = ["--noop-max", "30", "--frame-skip", "4", "--fire-reset", "--episodic-life", "--clip-rewards",
               "--frame-stack", "4", "--sticky-actions", "0"]

PAIRS = {
    "ppo-halfcheetah": Pair("ppo", "HalfCheetah-v5", "ppo_continuous_action.py", "HalfCheetah-v4", 1_000_000, PPO_MUJOCO,
                            ["--preset", "mujoco", "--normalize-obs", "--normalize-reward", "--hidden", "64", "64"],
                            "CleanRL normalizes observations and rewards (gymnasium wrappers, clipped to +-10) and "
                            "uses 64x64 tanh MLPs in its code; gymnasium 0.29.1 has HalfCheetah-v4, omnigym's "
                            "gymnasium 1.x runs -v5 (the same robot, reward and 1000-step episodes)"),
    "ppo-pong": Pair("ppo", "ALE/Pong-v5", "ppo_atari_envpool.py", "Pong-v5", 10_000_000, PPO_ATARI,
                     ["--preset", "atari", *ATARI_FLAGS],
                     "omnigym steps ale-py's C++ vector env (--backend auto), CleanRL EnvPool; EnvPool's Pong-v5 "
                     "has no sticky actions, so omnigym gets --sticky-actions 0"),
    "dqn-pong": Pair("dqn", "PongNoFrameskip-v4", "dqn_atari.py", "PongNoFrameskip-v4", 10_000_000, DQN_ATARI,
                     ["--preset", "atari", "--gradient-steps", "1", "--no-double-dqn", *ATARI_FLAGS],
                     "one gradient step every 4 env steps on both (CleanRL's is fixed in its code); replay memory "
                     "500k, not 1M, on both: CleanRL's 1M would need 26.3 GiB at once"),
    "sac-halfcheetah": Pair("sac", "HalfCheetah-v5", "sac_continuous_action.py", "HalfCheetah-v4", 1_000_000,
                            SAC_MUJOCO, ["--hidden", "256", "256"],
                            "CleanRL's actor and critics are 256x256 ReLU MLPs in its code"),
}


def flags(hparams: dict) -> list[str]:
    out = []
    for key, value in hparams.items():
        name = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out.append(name if value else "--no-" + key.replace("_", "-"))
        else:
            out += [name, str(value)]
    return out


def cleanrl_python(torch_version: str) -> str:
    """CleanRL's venv, built once (a few minutes): the pins above, and the Atari ROMs that
    ale-py 0.8.1 lacks, imported from the ROMs this venv's ale-py wheel ships."""
    python = VENV / "bin" / "python"
    if not (VENV / ".complete").exists():
        shutil.rmtree(VENV, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"torch=={torch_version}", *CLEANRL_PINS], check=True)
        import ale_py.roms

        with tempfile.TemporaryDirectory() as roms:
            for rom in ROMS:
                shutil.copy(ale_py.roms.get_rom_path(rom), roms)
            subprocess.run([str(VENV / "bin" / "ale-import-roms"), roms], check=True, stdout=subprocess.DEVNULL)
        (VENV / ".complete").write_text(" ".join([f"torch=={torch_version}", *CLEANRL_PINS]) + "\n")
    return str(python)


@dataclass
class Result:
    sps: float
    steps: int
    seconds: float
    episodes: list[tuple[int, float]]
    returncode: int | None


def run(cmd: list[str], cwd: str, env: dict, seconds: float | None, log: Path) -> tuple[str, float, int | None]:
    """Run ``cmd`` to its end (or for ``seconds``, then stop it); its output, wall time and exit code."""
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            returncode = proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            # SIGTERM, not SIGINT: omnigym undoes a run stopped by Ctrl-C before its first checkpoint,
            # metrics.jsonl included; a terminated process leaves its files.
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            returncode = None  # stopped by us
    return log.read_text(errors="replace"), time.perf_counter() - start, returncode


def episodes(text: str) -> list[tuple[int, float]]:
    return [(int(m.group(1)), float(m.group(2))) for m in EPISODE.finditer(text)]


def run_omnigym(pair: Pair, hparams: dict, total: int, seed: int, threads: int, seconds, workdir: Path,
                extra: tuple[str, ...] = ()) -> Result:
    run_dir = workdir / f"omnigym-{pair.algo}-{seed}-{time.time_ns()}"
    cmd = [sys.executable, "-m", "omnigym.cli", "train", pair.algo, "--env-id", pair.omnigym_env, "--seed", str(seed),
           "--total-timesteps", str(total), *flags(hparams), *pair.omnigym_only, *extra, "--run-dir", str(run_dir),
           "--print-episodes", "--no-progress", "--no-plot", "--checkpoint-every", "0",
           "--torch-threads", str(threads or 1)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    text, wall, rc = run(cmd, str(workdir), env, seconds, workdir / f"{run_dir.name}.log")
    sps, steps = float("nan"), 0
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line cut by the stop
                continue
            if "perf/sps" in row:
                sps, steps = row["perf/sps"], row["global_step"]
    if rc not in (0, None) or sps != sps:
        print(f"  omnigym exited {rc}; last lines of {workdir / (run_dir.name + '.log')}:\n"
              + "\n".join(text.splitlines()[-8:]), flush=True)
    return Result(sps, steps, wall, episodes(text), rc)


def run_cleanrl(pair: Pair, hparams: dict, total: int, seed: int, threads: int, seconds, workdir: Path,
                python: str, cleanrl_dir: Path) -> Result:
    script = cleanrl_dir / "cleanrl" / pair.cleanrl_script
    cmd = [python, str(script), "--env-id", pair.cleanrl_env, "--seed", str(seed), "--total-timesteps", str(total),
           *flags(hparams)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(cleanrl_dir), "WANDB_MODE": "disabled"}
    env.pop("OMP_NUM_THREADS", None)
    env.pop("MKL_NUM_THREADS", None)
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    name = f"cleanrl-{pair.algo}-{seed}-{time.time_ns()}"
    (workdir / name).mkdir()
    text, wall, rc = run(cmd, str(workdir / name), env, seconds, workdir / f"{name}.log")
    found = SPS.findall(text)
    eps = episodes(text)
    steps = eps[-1][0] if eps else 0
    if rc not in (0, None) or not found:
        print(f"  CleanRL exited {rc}; last lines of {workdir / (name + '.log')}:\n"
              + "\n".join(text.splitlines()[-8:]), flush=True)
    return Result(float(found[-1]) if found else float("nan"), steps, wall, eps, rc)


def plot(name: str, pair: Pair, results: dict[str, list[Result]], out: Path) -> Path:
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = ["tab:blue", "tab:green", "tab:red", "tab:purple"]
    for lib, color in zip(results, [*colors[:len(results) - 1], "tab:orange"]):
        for i, result in enumerate(results[lib]):
            if result.episodes:
                steps, returns = (np.array(x) for x in zip(*result.episodes))
                label = lib if i == 0 else None
                if len(steps) < 30:
                    ax.plot(steps, returns, color=color, alpha=0.8, marker=".", label=label)
                    continue
                window = max(len(steps) // 20, 5)  # each episode faint, a moving mean over `window` bold
                ax.plot(steps, returns, color=color, alpha=0.2, linewidth=0.6)
                mean = np.convolve(returns, np.ones(window) / window, mode="valid")
                ax.plot(steps[window - 1:], mean, color=color, linewidth=1.6, label=label)
    ax.set_xlabel("global step")
    ax.set_ylabel("episodic return")
    envs = pair.omnigym_env if pair.omnigym_env == pair.cleanrl_env else f"{pair.omnigym_env} / {pair.cleanrl_env}"
    ax.set_title(f"{name}: omnigym train {pair.algo} vs CleanRL {pair.cleanrl_script}\n{envs}, "
                 f"{len(results['omnigym'])} run(s) each", fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no episode finished", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    path = out / f"{name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cleanrl", help="folder holding CleanRL's cleanrl/*.py and cleanrl_utils/ (a clone of "
                                          "github.com/vwxyzjn/cleanrl)")
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--steps", type=int, help="env steps per run (--total-timesteps on both sides)")
    budget.add_argument("--seconds", type=float, help="stop each run after this many seconds of wall time")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="torch threads for both (0: each library's default)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="change a hyperparameter on both sides of every pair that has it, e.g. "
                             "learning_starts=1000 (printed with the rest)")
    parser.add_argument("--variant", nargs="+", default=[], metavar="NAME=FLAGS",
                        help="also run omnigym with these extra flags, one row each, e.g. 'compiled=--compile'")
    parser.add_argument("--out", type=Path, default=CACHE / "plots", help="folder for the PNGs")
    parser.add_argument("--show-venv", action="store_true", help="print CleanRL's venv pins and exit")
    parser.add_argument("--build-venv", action="store_true", help="build CleanRL's venv (if not built) and exit")
    args = parser.parse_args()

    import torch

    torch_version = torch.__version__.split("+")[0]
    if args.show_venv:
        print("\n".join([f"torch=={torch_version}", *CLEANRL_PINS]))
        return
    if args.build_venv:
        print(cleanrl_python(torch_version))
        return
    if not args.cleanrl:
        parser.error("--cleanrl DIR is needed (git clone https://github.com/vwxyzjn/cleanrl DIR)")
    cleanrl_dir = Path(args.cleanrl).resolve()
    missing = [PAIRS[p].cleanrl_script for p in args.pairs if not (cleanrl_dir / "cleanrl" / PAIRS[p].cleanrl_script).exists()]
    if missing:
        parser.error(f"{cleanrl_dir}/cleanrl lacks {', '.join(missing)}")
    if args.steps is None and args.seconds is None:
        args.steps = 100_000
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        key = key.replace("-", "_")
        overrides[key] = value.lower() == "true" if value.lower() in ("true", "false") else value
    variants = {"omnigym": ()}
    for item in args.variant:
        name, sep, extra = item.partition("=")
        if not sep or not name or name in ("omnigym", "CleanRL") or name in variants:
            parser.error(f"--variant takes NAME=FLAGS with a new name (not omnigym or CleanRL), got {item!r}")
        variants[name] = tuple(extra.split())
    python = cleanrl_python(torch_version)
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="omnigym-vs-cleanrl-"))
    budget = f"{args.steps} env steps" if args.steps else f"{args.seconds:g} s of wall time"
    threads = f"{args.threads} torch threads each" if args.threads else \
        "omnigym 1 torch thread, CleanRL torch's default"
    print(f"budget: {budget} per run, {args.repeats} repeats, seed {args.seed}, {threads}; logs in {workdir}",
          flush=True)

    summary = []
    for name in args.pairs:
        pair = PAIRS[name]
        hparams = {**pair.shared, **{k: v for k, v in overrides.items() if k in pair.shared}}
        unknown = [k for k in overrides if k not in pair.shared]
        total = args.steps or pair.published_steps
        print(f"\n== {name}: omnigym train {pair.algo} {pair.omnigym_env} vs CleanRL {pair.cleanrl_script} "
              f"{pair.cleanrl_env}\n   both: --total-timesteps {total} {' '.join(flags(hparams))}"
              f"\n   omnigym also: {' '.join(pair.omnigym_only)}\n   ({pair.note})"
              + (f"\n   --set {', '.join(unknown)}: not a hyperparameter of this pair, ignored" if unknown else ""),
              flush=True)
        results: dict[str, list[Result]] = {name: [] for name in variants} | {"CleanRL": []}
        for rep in range(args.repeats):
            seed = args.seed + rep
            for variant, extra in variants.items():
                r = run_omnigym(pair, hparams, total, seed, args.threads, args.seconds, workdir, extra)
                results[variant].append(r)
                print(f"   {variant:8s} seed {seed}: {r.sps:8.0f} SPS ({r.steps} steps, {r.seconds:.1f} s, "
                      f"{len(r.episodes)} episodes)", flush=True)
            r = run_cleanrl(pair, hparams, total, seed, args.threads, args.seconds, workdir, python, cleanrl_dir)
            results["CleanRL"].append(r)
            print(f"   CleanRL  seed {seed}: {r.sps:8.0f} SPS ({r.seconds:.1f} s, {len(r.episodes)} episodes)",
                  flush=True)
        medians = {lib: statistics.median(r.sps for r in rs) for lib, rs in results.items()}
        path = plot(name, pair, results, args.out)
        print(f"   returns plotted in {path}", flush=True)
        summary += [(name, variant, medians[variant], medians["CleanRL"]) for variant in variants]

    print(f"\nmedian SPS over {args.repeats} repeats ({budget} each); target: omnigym >= 3x CleanRL")
    print(f"{'pair':16s} {'omnigym':18s} {'omnigym SPS':>12s} {'CleanRL SPS':>12s} {'ratio':>7s}")
    for name, variant, ours, theirs in summary:
        print(f"{name:16s} {variant:18s} {ours:12.0f} {theirs:12.0f} {ours / theirs if theirs else float('nan'):6.2f}x")


if __name__ == "__main__":
    main()
