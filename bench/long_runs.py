"""The long learning runs of docs/benchmarks.md: omnigym's control algorithms at their published
budgets (or as long as this machine allows), several seeds, one curve per seed in one PNG.

    python bench/long_runs.py ppo-halfcheetah --seeds 1 2 3 [--parallel 2] [--extra --compile]
    python bench/long_runs.py sac-halfcheetah --seeds 1 --steps 100000

Runs are plain ``omnigym train`` commands (printed), ``--parallel`` at a time, one torch thread
each. Each run's curve is its episodes' returns (``--print-episodes``); the table gives the
mean return of the last 10 training episodes and of 10 episodes of ``omnigym eval`` on the
final checkpoint. ``--bar`` draws a published figure to compare with, e.g. CleanRL's
``ppo_continuous_action.py`` HalfCheetah 1442 +- 46 at 1M steps (its docs' benchmark table,
3 seeds), the default for ppo-halfcheetah.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
EPISODE = re.compile(r"global_step=(\d+), episodic_return=([-\d.e+]+)")
RUNS = {
    # name: (algo, env id, published budget, omnigym flags, (bar, +-, where it comes from) or None)
    "ppo-halfcheetah": ("ppo", "HalfCheetah-v5", 1_000_000, [],
                        (1442.0, 46.0, "CleanRL ppo_continuous_action.py, HalfCheetah-v4, 1M steps, 3 seeds")),
    "sac-halfcheetah": ("sac", "HalfCheetah-v5", 1_000_000, ["--hidden", "256", "256"], None),
    "ppo-pong": ("ppo", "ALE/Pong-v5", 10_000_000, ["--sticky-actions", "0"], None),
    "dqn-pong": ("dqn", "PongNoFrameskip-v4", 10_000_000, ["--buffer-size", "500000"], None),
    # DrQ from pixels (docs/pixels.md): 64 x 64 frames, batch 64 and an update every 2 agent steps to fit a CPU
    "drq-cartpole": ("drq", "dm_control/cartpole-swingup-v0", 100_000,
                     ["--image-size", "64", "--batch-size", "64", "--update-every", "2", "--log-every", "5000",
                      "--checkpoint-every", "10000"],
                     (759.0, 92.0, "DrQ, cartpole swingup from pixels, 100k frames (Kostrikov et al. 2020, Table 1)")),
    # docs/robots.md: forward commands of 0.5-1 m/s only (no standing command: standing still is where
    # 0-1 m/s runs stopped), no pushes, the locomotion preset with a smaller MLP and 128 envs (CPU); the
    # bar is checked with: omnigym eval RUN --command 0.5,0,0 --greedy --episodes 100
    "ppo-go2-flat": ("ppo", "omnigym/Go2-Velocity-Flat-v0", 5_000_000,
                     ["--num-envs", "128", "--hidden", "256", "128", "--checkpoint-every", "500000", "--env-kwargs",
                      "lin_vel_x=0.5,1.0", "lin_vel_y=0,0", "ang_vel_yaw=0,0", "push_interval=none",
                      "small_to_zero=0"], None),
}


def start(name: str, seed: int, steps: int, extra: list[str], out: Path) -> tuple[subprocess.Popen, Path, Path]:
    algo, env_id, _, flags, _ = RUNS[name]
    run_dir = out / f"{name}-seed{seed}"
    log = out / f"{name}-seed{seed}.log"
    cmd = [sys.executable, "-m", "omnigym.cli", "train", algo, "--env-id", env_id, "--seed", str(seed),
           "--total-timesteps", str(steps), *flags, *extra, "--run-dir", str(run_dir), "--print-episodes",
           "--no-progress", "--torch-threads", "1", "--overwrite"]
    print(" ".join(cmd[2:]), flush=True)
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT), run_dir, log


def evaluate(run_dir: Path, episodes: int = 10) -> float:
    out = subprocess.run([sys.executable, "-m", "omnigym.cli", "eval", str(run_dir), "--episodes", str(episodes)],
                         capture_output=True, text=True)
    found = re.findall(r"mean return[^-\d]*([-\d.e+]+)", out.stdout)
    return float(found[-1]) if found else float("nan")


def plot(name: str, curves: dict[int, list[tuple[int, float]]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = ["tab:blue", "tab:green", "tab:purple", "tab:brown", "tab:pink"]  # orange is the bar's
    for (seed, points), color in zip(curves.items(), colors * 4):
        if not points:
            continue
        steps, returns = (np.array(x) for x in zip(*points))
        window = max(min(len(returns) // 10, 20), 1)
        mean = np.convolve(returns, np.ones(window) / window, mode="valid")
        ax.plot(steps, returns, color=color, alpha=0.15, linewidth=0.6)
        ax.plot(steps[window - 1:], mean, color=color, linewidth=1.6, label=f"omnigym seed {seed}")
    bar = RUNS[name][4]
    if bar:
        ax.axhspan(bar[0] - bar[1], bar[0] + bar[1], color="tab:orange", alpha=0.25, label=bar[2])
    algo, env_id = RUNS[name][:2]
    ax.set_title(f"omnigym train {algo} --env-id {env_id}", fontsize=9)
    ax.set_xlabel("global step")
    ax.set_ylabel("episodic return")
    ax.legend(fontsize=7)
    path = out / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", choices=list(RUNS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, help="env steps per run (default: the published budget)")
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more omnigym flags, e.g. --compile")
    parser.add_argument("--out", type=Path, default=HERE / ".cache" / "long_runs")
    parser.add_argument("--replot", action="store_true", help="redraw the PNG from the logs in --out, run nothing")
    args = parser.parse_args()
    if args.steps is not None and args.steps < 1 or args.parallel < 1:
        parser.error(f"--steps and --parallel must be 1 or more, got {args.steps} and {args.parallel}")
    if args.replot:
        logs = {seed: args.out / f"{args.run}-seed{seed}.log" for seed in args.seeds}
        if not any(log.exists() for log in logs.values()):
            parser.error(f"--replot: no {args.run}-seed*.log for seeds {args.seeds} in {args.out}")
        print(plot(args.run, {seed: [(int(s), float(r)) for s, r in EPISODE.findall(log.read_text())]
                              for seed, log in logs.items() if log.exists()}, args.out))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    steps = args.steps if args.steps is not None else RUNS[args.run][2]

    pending, running, done = list(args.seeds), [], {}
    while pending or running:
        while pending and len(running) < args.parallel:
            seed = pending.pop(0)
            running.append((seed, time.time(), *start(args.run, seed, steps, args.extra, args.out)))
        time.sleep(5)
        for item in [r for r in running if r[2].poll() is not None]:
            running.remove(item)
            seed, began, process, run_dir, log = item
            text = log.read_text()
            episodes = [(int(s), float(r)) for s, r in EPISODE.findall(text)]
            sps = float("nan")
            metrics = run_dir / "metrics.jsonl"
            if metrics.exists():
                rows = [json.loads(line) for line in metrics.read_text().splitlines() if "perf/sps" in line]
                sps = rows[-1]["perf/sps"] if rows else sps
            last = float(np.mean([r for _, r in episodes[-10:]])) if episodes else float("nan")
            done[seed] = (episodes, last, evaluate(run_dir) if process.returncode == 0 else float("nan"), sps,
                          time.time() - began, process.returncode)
            print(f"seed {seed}: exit {process.returncode}, last-10 {last:.1f}, eval {done[seed][2]:.1f}, "
                  f"{sps:.0f} SPS, {done[seed][4]:.0f} s", flush=True)

    path = plot(args.run, {seed: done[seed][0] for seed in sorted(done)}, args.out)
    finals = [done[s][1] for s in sorted(done)]
    print(f"\n{args.run}, {steps} steps: {'seed':>4s} {'last-10 return':>15s} {'eval (10 ep.)':>14s} {'SPS':>6s} "
          f"{'wall s':>7s}")
    for seed in sorted(done):
        _, last, ev, sps, wall, _ = done[seed]
        print(f"{'':{len(args.run) + len(str(steps)) + 9}s}{seed:4d} {last:15.1f} {ev:14.1f} {sps:6.0f} {wall:7.0f}")
    print(f"mean +- std of the last-10 returns over seeds: {np.mean(finals):.1f} +- {np.std(finals):.1f}")
    if RUNS[args.run][4]:
        bar = RUNS[args.run][4]
        print(f"bar: {bar[0]:.0f} +- {bar[1]:.0f} ({bar[2]})")
    print(f"curves: {path}")


if __name__ == "__main__":
    main()
