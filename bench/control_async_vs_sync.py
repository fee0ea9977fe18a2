"""PPO's control rollouts on Ray workers (K = 0, 1) vs in process: env steps/s and return at equal steps.

Every run is ``omnigym train ppo`` in a fresh process, one after another on the same cores,
with the same flags but the runtime's:

  sync-1t   step the envs, then train, in one process with one torch thread (omnigym's default)
  sync-2t   the same with two threads (the machine's two cores, for a fair sync)
  ray-K0    one rollout worker beside the learner, never ahead (the split's overhead)
  ray-K1    one rollout worker stepping update k+1 while the learner trains update k
  ray-K1-2t the same with two threads for the learner (where it is the bottleneck)

Workloads (``--workloads``): ``cartpole`` (the default PPO: 8 envs x 32 steps, tiny MLP),
``halfcheetah`` (CleanRL's MuJoCo settings: 1 env x 2048 steps, 10 epochs x 32 minibatches),
``pong`` (the PPO paper's Atari settings: 8 envs x 128 steps, Nature CNN). steps/s is
``perf/sps`` of the last update (env steps since the first update began); the return is
``charts/return_last_20`` at the end, at the same number of env steps in every mode.

    python bench/control_async_vs_sync.py [--workloads cartpole,halfcheetah,pong] [--modes sync-1t,ray-K1]
                                          [--scale 1.0] [--seeds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = {"sync-1t": ["--torch-threads", "1"], "sync-2t": ["--torch-threads", "2"],
         "ray-K0": ["--runtime", "ray", "--max-staleness", "0"], "ray-K1": ["--runtime", "ray", "--max-staleness", "1"],
         "ray-K1-2t": ["--runtime", "ray", "--max-staleness", "1", "--torch-threads", "2"]}
WORKLOADS = {  # (flags, env steps at --scale 1)
    "cartpole": (["--env-id", "CartPole-v1"], 50_000),
    "halfcheetah": (["--env-id", "HalfCheetah-v5"], 40_960),
    "pong": (["--env-id", "ALE/Pong-v5"], 16_384),
}


def one_run(workload: str, mode: str, steps: int, seed: int) -> dict:
    flags, _ = WORKLOADS[workload]
    run_dir = Path(tempfile.mkdtemp()) / "run"
    omnigym = str(Path(sys.executable).parent / "omnigym")
    command = [omnigym, "train", "ppo", *flags, *MODES[mode], "--total-timesteps", str(steps), "--seed", str(seed),
               "--run-dir", str(run_dir), "--no-progress", "--no-plot", "--no-tensorboard"]
    done = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{workload} {mode} failed:\n{done.stderr[-2000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    returns = [r["charts/return_last_20"] for r in rows if "charts/return_last_20" in r]
    last = rows[-1]
    return {"workload": workload, "mode": mode, "seed": seed, "sps": last["perf/sps"], "steps": last["global_step"],
            "return": returns[-1] if returns else float("nan"),
            "staleness": last.get("async/staleness_mean", 0.0),
            "trainer_idle": last.get("async/trainer_idle_percent"),
            "worker_idle": last.get("async/generator_idle_percent")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies each workload's env steps")
    parser.add_argument("--seeds", type=int, default=1, help="seeds 1..N for each mode")
    args = parser.parse_args()
    workloads = [w for w in args.workloads.split(",") if w]
    modes = [m for m in args.modes.split(",") if m]
    if not workloads or any(w not in WORKLOADS for w in workloads):
        parser.error(f"--workloads takes a comma-separated list of {', '.join(WORKLOADS)}; got {args.workloads!r}")
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes takes a comma-separated list of {', '.join(MODES)}; got {args.modes!r}")
    if not args.scale > 0:
        parser.error(f"--scale must be positive, got {args.scale}")
    if args.seeds < 1:
        parser.error(f"--seeds must be positive, got {args.seeds}")
    print("| workload | mode | env steps | steps/s | vs " + modes[0] + " | return (last 20) | mean staleness "
          "| learner idle % | worker idle % |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for workload in workloads:
        steps = max(int(WORKLOADS[workload][1] * args.scale), 1)
        runs = {mode: [one_run(workload, mode, steps, seed) for seed in range(1, args.seeds + 1)] for mode in modes}
        base = statistics.mean(r["sps"] for r in runs[modes[0]])
        for mode in modes:
            rs = runs[mode]
            sps, ret = statistics.mean(r["sps"] for r in rs), [r["return"] for r in rs]
            idle = [f"{statistics.mean(r[k] for r in rs):.0f}" if rs[0][k] is not None else "-"
                    for k in ("trainer_idle", "worker_idle")]
            spread = f" ± {statistics.stdev(ret):.1f}" if len(ret) > 1 else ""
            print(f"| {workload} | {mode} | {rs[0]['steps']} | {sps:.0f} | {sps / base:.2f}x "
                  f"| {statistics.mean(ret):.1f}{spread} | {statistics.mean(r['staleness'] for r in rs):.2f} "
                  f"| {idle[0]} | {idle[1]} |", flush=True)


if __name__ == "__main__":
    main()
