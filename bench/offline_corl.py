"""omnigym's offline IQL and TD3+BC vs CORL's single-file ones, side by side on the same local datasets.

    python bench/offline_corl.py --corl DIR [--datasets ID...] [--algos iql td3_bc] [--seeds 0 1 2]
                                 [--steps 20000] [--eval-episodes 10] [--out FILE.json]
                                 [--precision fp32|bf16] [--compile]

DIR is a checkout of CORL (https://github.com/tinkoff-ai/CORL) holding ``algorithms/offline/iql.py``
and ``td3_bc.py``; nothing of CORL is kept in this repository. Its files are imported at bench
time with small stand-ins for the packages they import (bench/corl_standins.py: ``gym``, ``d4rl``,
``pyrallis``, ``wandb``), so CORL runs in this venv, on CPU, with nothing downloaded.

The datasets are Minari ids under ``MINARI_DATASETS_PATH`` (docs/offline.md, "Side by side with
CORL", says how they were made with ``omnigym collect``), with reference returns in their metadata.
For each (dataset, algorithm, seed) both libraries train for ``--steps`` gradient steps with their
defaults (CORL's ``TrainConfig``, which omnigym's defaults follow; IQL with CORL's reward scaling for
Gym-MuJoCo, ``normalize_reward``, on both sides), one torch thread each, each in a fresh process,
omnigym then CORL, and evaluate once at the end with ``--eval-episodes`` episodes:

- **score**: the D4RL normalized score of that evaluation (each library's own evaluation loop, the
  same reference returns);
- **s/100k**: wall-clock seconds per 100k gradient steps, measured over the run's steps and scaled,
  evaluation and dataset loading excluded, the same way on both sides: from the end of the 10th
  gradient step to the end of the last (CORL's: its per-step ``wandb.log``; omnigym's: its
  algorithm's ``update`` wrapped in the worker process);
- **CPU s/100k**: the same span in the process's CPU time (one thread each): what the steps cost,
  less what other jobs on a shared machine took from them;
- **ratio**, **CPU ratio**: CORL's time / omnigym's (above 1: omnigym is faster);
- **warm-up**: omnigym's seconds from its first gradient step's start to its 10th's end (with
  ``--compile``, the graphs' build: CORL builds none, and has no hook before its first step);
- the machine's load average (1 min) when each pair started and ended.

``--precision bf16`` and ``--compile`` are given to omnigym's side (CORL has neither); its scores are
then to be read against CORL's seed range, which the second table gives.

The published CORL D4RL averages over Gym-MuJoCo locomotion (1M steps, D4RL's datasets) are printed
beside the table for orientation only: these are other datasets and far fewer steps.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # corl_standins
ALGOS = ("iql", "td3_bc")
DATASETS = ("halfcheetah/medium-v0", "halfcheetah/medium-replay-v0", "hopper/medium-v0", "hopper/medium-replay-v0")
PUBLISHED = {"iql": 81.6, "td3_bc": 76.5, "cql": 78.3}  # CORL's README: Gym-MuJoCo locomotion averages, D4RL v2
NORMALIZE_REWARD = {"iql": True, "td3_bc": False}  # CORL's Gym-MuJoCo configs; omnigym's defaults


def one_thread_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_worker(side: str, corl: str, dataset: str, algo: str, seed: int, steps: int, eval_episodes: int,
               update_flags: list[str]) -> dict:
    """One run of one library in a fresh process (this file with ``--worker``); its score and times."""
    command = [sys.executable, __file__, "--worker", side, "--corl", corl, "--datasets", dataset, "--algos", algo,
               "--seeds", str(seed), "--steps", str(steps), "--eval-episodes", str(eval_episodes), *update_flags]
    done = subprocess.run(command, env=one_thread_env(), capture_output=True, text=True)
    if done.returncode:  # the worker's own last line (omnigym's one-line error, or a traceback's end)
        said = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        sys.exit(f"offline_corl: the {side} run ({algo}, seed {seed}) failed: {said[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def result(score: float, timing) -> dict:
    return {"score": score, "seconds_per_100k": timing.seconds_per(100_000),
            "cpu_seconds_per_100k": timing.seconds_per(100_000, cpu=True), "warm_up_s": timing.warm_up_seconds()}


def omnigym_worker(dataset: str, algo: str, seed: int, steps: int, eval_episodes: int, update_flags: list[str]) -> None:
    """In a fresh process: ``omnigym train ALGO`` through its CLI, each gradient step's end noted as
    CORL's are (the algorithm's ``update`` wrapped); prints its score and time as JSON."""
    import contextlib

    import corl_standins

    from omnigym.cli import main as omnigym_main

    timing = corl_standins.Timing()
    module = importlib.import_module(f"omnigym.algos.control.{algo}")
    train_offline = module.train_offline

    def timed_train_offline(cfg, name, run, data, evaluator, components, update, act):
        def timed_update(batch, step):
            timing.start()
            losses = update(batch, step)
            timing.log({}, step=step + 1)
            return losses

        return train_offline(cfg, name, run, data, evaluator, components, timed_update, act)

    module.train_offline = timed_train_offline
    with tempfile.TemporaryDirectory(prefix="omnigym-bench-") as tmp:
        run_dir = Path(tmp) / "run"
        command = ["train", algo, "--dataset", dataset, "--seed", str(seed), "--total-timesteps", str(steps),
                   "--eval-every", str(steps), "--log-every", str(steps), "--checkpoint-every", str(steps),
                   "--eval-episodes", str(eval_episodes), "--torch-threads", "1", "--run-dir", str(run_dir),
                   "--no-progress", "--no-plot", "--no-tensorboard",
                   "--normalize-reward" if NORMALIZE_REWARD[algo] else "", *update_flags]
        with contextlib.redirect_stdout(sys.stderr):  # stdout is the result
            code = omnigym_main([c for c in command if c])
        if code:
            sys.exit(code)
        last = [json.loads(line) for line in open(run_dir / "metrics.jsonl")][-1]
    print(json.dumps(result(last["eval/normalized_score"], timing)))


def corl_worker(corl: str, dataset: str, algo: str, seed: int, steps: int, eval_episodes: int) -> None:
    """In a fresh process: CORL's own ``train`` on the stand-ins; prints its score and time as JSON."""
    import contextlib

    import torch

    import corl_standins

    torch.set_num_threads(1)
    timing = corl_standins.install()
    spec = importlib.util.spec_from_file_location(f"corl_{algo}", Path(corl) / "algorithms" / "offline" / f"{algo}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.TrainConfig(env=dataset, seed=seed, max_timesteps=steps, eval_freq=steps, n_episodes=eval_episodes,
                                device="cpu", normalize_reward=NORMALIZE_REWARD[algo], checkpoints_path=None)
    with contextlib.redirect_stdout(sys.stderr):  # CORL prints its progress; stdout is the result
        module.train(config)
    print(json.dumps(result(timing.scores[-1], timing)))


def check_corl(corl: str, algos) -> None:
    missing = [a for a in algos if not (Path(corl) / "algorithms" / "offline" / f"{a}.py").is_file()]
    if missing:
        sys.exit(f"offline_corl: --corl {corl} has no algorithms/offline/{missing[0]}.py; give a CORL checkout "
                 "(git clone https://github.com/tinkoff-ai/CORL)")


def table(rows: list[dict]) -> str:
    lines = [f"omnigym's flags: {rows[0]['omnigym_flags'] if rows else ''}", "",
             "| dataset | algorithm | seed | omnigym score | CORL score | omnigym s/100k | CORL s/100k | ratio "
             "| omnigym CPU s/100k | CORL CPU s/100k | CPU ratio | omnigym warm-up s | load start/end |",
             "|---" * 13 + "|"]
    for r in rows:
        ours, theirs = r["omnigym"], r["corl"]
        lines.append(f"| {r['dataset']} | {r['algo']} | {r['seed']} | {ours['score']:.1f} | {theirs['score']:.1f} | "
                     f"{ours['seconds_per_100k']:.0f} | {theirs['seconds_per_100k']:.0f} | {r['ratio']:.2f}x | "
                     f"{ours['cpu_seconds_per_100k']:.0f} | {theirs['cpu_seconds_per_100k']:.0f} | "
                     f"{r['cpu_ratio']:.2f}x | {ours['warm_up_s']:.1f} | {r['load'][0]:.1f}/{r['load'][1]:.1f} |")
    lines += ["", "| dataset | algorithm | omnigym score (mean ± std over seeds) | CORL score | ratio (median) "
                  "| CPU ratio (median) | CORL published (D4RL, 1M steps) |", "|---|---|---|---|---|---|---|"]
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        for algo in dict.fromkeys(r["algo"] for r in rows):
            group = [r for r in rows if r["dataset"] == dataset and r["algo"] == algo]
            if not group:
                continue
            spread = {lib: [r[lib]["score"] for r in group] for lib in ("omnigym", "corl")}
            shown = {lib: f"{statistics.mean(s):.1f} ± {statistics.stdev(s):.1f}" if len(s) > 1 else f"{s[0]:.1f}"
                     for lib, s in spread.items()}
            lines.append(f"| {dataset} | {algo} | {shown['omnigym']} | {shown['corl']} | "
                         f"{statistics.median(r['ratio'] for r in group):.2f}x | "
                         f"{statistics.median(r['cpu_ratio'] for r in group):.2f}x | {PUBLISHED[algo]} (average) |")
    lines.append(f"\nCORL's published Gym-MuJoCo averages: IQL {PUBLISHED['iql']}, TD3+BC {PUBLISHED['td3_bc']}, "
                 f"CQL {PUBLISHED['cql']} (D4RL v2 datasets, 1M gradient steps; for orientation only)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corl", required=True, help="a CORL checkout (holding algorithms/offline/)")
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS))
    parser.add_argument("--algos", nargs="+", choices=ALGOS, default=list(ALGOS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20_000, help="gradient steps of each run")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--out", help="also write the rows as JSON here")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="omnigym's --precision")
    parser.add_argument("--compile", action="store_true", help="omnigym's --compile (its build time: warm-up)")
    parser.add_argument("--worker", choices=("omnigym", "corl"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    import corl_standins

    if args.steps <= corl_standins.Timing.WARM_UP:
        parser.error(f"--steps must be above {corl_standins.Timing.WARM_UP}: the time is taken after that many "
                     "warm-up steps")
    check_corl(args.corl, args.algos)
    update_flags = ["--precision", args.precision] + ["--compile"] * args.compile  # omnigym's side only
    if args.worker:
        run = (lambda *a: corl_worker(args.corl, *a)) if args.worker == "corl" else \
            (lambda *a: omnigym_worker(*a, update_flags))
        run(args.datasets[0], args.algos[0], args.seeds[0], args.steps, args.eval_episodes)
        return
    rows = []
    for dataset in args.datasets:
        for algo in args.algos:
            for seed in args.seeds:
                load_start = os.getloadavg()[0]
                ours, theirs = (run_worker(side, args.corl, dataset, algo, seed, args.steps, args.eval_episodes,
                                           update_flags) for side in ("omnigym", "corl"))
                row = {"dataset": dataset, "algo": algo, "seed": seed, "steps": args.steps,
                       "omnigym_flags": " ".join(update_flags), "omnigym": ours,
                       "corl": theirs, "ratio": theirs["seconds_per_100k"] / ours["seconds_per_100k"],
                       "cpu_ratio": theirs["cpu_seconds_per_100k"] / ours["cpu_seconds_per_100k"],
                       "load": (load_start, os.getloadavg()[0])}
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    Path(args.out).write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
