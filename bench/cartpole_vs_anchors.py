"""Time to solve CartPole-v1: omnigym PPO vs CleanRL's ppo.py vs Stable-Baselines3 PPO.

Each run is a fresh process. The clock starts just before the process is launched and
stops when the mean return of the last 20 finished episodes first reaches 475 (read from
the episode lines each program prints); the process is then stopped. Libraries run in
turn (omnigym, CleanRL, SB3, omnigym, ...) so that drifts in machine load hit them alike.

    python bench/cartpole_vs_anchors.py --cleanrl-ppo PATH/TO/cleanrl/ppo.py

CleanRL's ppo.py needs gymnasium 0.29.1; the script builds a venv of its own for it in
bench/.cache (torch is the same version as here, so no CUDA download). Without
--cleanrl-ppo, CleanRL is left out. Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
EPISODE = re.compile(r"global_step=(\d+), episodic_return=\[?([-\d.e]+)")


def cleanrl_python(torch_version: str) -> str:
    venv = CACHE / "cleanrl-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"torch=={torch_version}", "gymnasium==0.29.1",
                        "numpy<2", "tyro", "tensorboard"], check=True)
    return str(python)


def time_to_solve(cmd: list[str], cwd: str, threshold: float, timeout: float) -> tuple[float, int]:
    """Seconds from launch until the last-20 mean return reaches ``threshold``, and the step."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    recent: deque[float] = deque(maxlen=20)
    try:
        for line in proc.stdout:
            match = EPISODE.search(line)
            if not match:
                continue
            recent.append(float(match.group(2)))
            if len(recent) == 20 and sum(recent) / 20 >= threshold:
                return time.perf_counter() - start, int(match.group(1))
            if time.perf_counter() - start > timeout:
                break
        return float("nan"), -1
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--cleanrl-ppo", help="path to CleanRL's cleanrl/ppo.py (left out when not given)")
    parser.add_argument("--threshold", type=float, default=475.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--libs", nargs="+", default=["omnigym", "cleanrl", "sb3"])
    args = parser.parse_args()

    import torch

    workdir = tempfile.mkdtemp(prefix="omnigym-bench-")
    commands = {
        "omnigym": lambda s: [sys.executable, "-m", "omnigym.cli", "train", "ppo", "--seed", str(s), "--print-episodes",
                              "--no-progress", "--run-dir", f"{workdir}/omnigym-{s}-{time.time_ns()}"],
        "sb3": lambda s: [sys.executable, str(HERE / "_sb3_cartpole.py"), str(s)],
    }
    if "cleanrl" in args.libs and args.cleanrl_ppo:
        python = cleanrl_python(torch.__version__.split("+")[0])
        commands["cleanrl"] = lambda s: [python, str(Path(args.cleanrl_ppo).resolve()), "--seed", str(s),
                                         "--env-id", "CartPole-v1", "--total-timesteps", "500000"]
    libs = [lib for lib in args.libs if lib in commands]

    results: dict[str, list[tuple[float, int]]] = {lib: [] for lib in libs}
    for seed in args.seeds:
        for lib in libs:
            seconds, steps = time_to_solve(commands[lib](seed), workdir, args.threshold, args.timeout)
            results[lib].append((seconds, steps))
            print(f"{lib:8s} seed {seed}: {seconds:6.2f} s, {steps:7d} steps", flush=True)

    print(f"\nmedian over seeds {args.seeds} (time from launch to last-20 mean return >= {args.threshold:g}):")
    print(f"{'library':8s} {'seconds':>8s} {'steps':>8s} {'omnigym speed-up':>17s}")
    median = {lib: (statistics.median(s for s, _ in r), statistics.median(n for _, n in r)) for lib, r in results.items()}
    for lib, (seconds, steps) in median.items():
        ratio = seconds / median["omnigym"][0] if "omnigym" in median else float("nan")
        print(f"{lib:8s} {seconds:8.2f} {steps:8.0f} {ratio:16.1f}x")


if __name__ == "__main__":
    main()
