"""GRPO samples/s and held-out accuracy: asynchronous rollouts on Ray (K = 1, 2) vs sync.

The workload is the GRPO demo's (the ~1M-parameter Llama on 2-digit addition, 16 prompts x
8 samples a step, one torch thread per process), where sampling a step and training on it
cost about the same. The model is warmed up once (the demo's supervised phase and one GRPO
step) and saved; every mode then trains that same model for ``--steps`` GRPO steps, each in
a fresh process, one after another on the same cores:

  sync-1t   generate, then train, in one process with one thread (omnigym's default)
  sync-2t   the same with two threads (the machine's cores, for a fair sync)
  ray-K0    one generator actor beside the trainer, never ahead (the split's overhead)
  ray-K1/2  one generator actor up to K policy versions ahead of the trainer

samples/s is measured between step ends, leaving out the first and last steps (they
evaluate). Held-out accuracy is the demo's (500 problems, greedy) before and after, at equal
samples. ``--json FILE`` writes the runs for ``bench/scaling_sim.py --validate FILE``.

    python bench/async_vs_sync.py [--steps 40] [--modes sync-1t,sync-2t,ray-K0,ray-K1,ray-K2] [--json runs.json]
                                  [--model WARMED_UP_FOLDER]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

MODES = {"sync-1t": dict(torch_threads=1), "sync-2t": dict(torch_threads=2),
         "ray-K0": dict(runtime="ray", max_staleness=0), "ray-K1": dict(runtime="ray", max_staleness=1),
         "ray-K2": dict(runtime="ray", max_staleness=2)}
RESULT = "RESULT "


def warm_model(folder: str, seed: int, sft_steps: int) -> None:
    """The demo's warm-up (and one GRPO step), saved as a model folder every mode starts from."""
    import torch
    from transformers import AutoModelForCausalLM

    from omnigym.algos import grpo
    from omnigym.models.lm import build_tiny_model

    run = tempfile.mkdtemp()
    grpo.train(grpo.GRPOConfig(seed=seed, steps=1, sft_steps=sft_steps, eval_size=20, run_dir=run, progress=False,
                               plot=False, tensorboard=False))
    weights = torch.load(os.path.join(run, "checkpoint.pt"), weights_only=False)["components"]["trainer"]["model"]
    build_tiny_model(folder, seed=seed)
    model = AutoModelForCausalLM.from_pretrained(folder)
    model.load_state_dict(weights)
    model.save_pretrained(folder)


def one_run(model: str, mode: str, steps: int, seed: int) -> dict:
    """One mode in this process; prints its figures as JSON."""
    from omnigym.algos import grpo
    from omnigym.runtime import sync as sync_runtime
    from omnigym.track.run import Run

    stamps, generating, made = [], [], []
    original_log, original_rollouts = Run.log, grpo.make_rollouts
    original_trajectories = sync_runtime.SyncRollouts.trajectories

    def timed_log(self, step, metrics):
        original_log(self, step, metrics)
        stamps.append((time.perf_counter(), metrics))

    def timed_trajectories(self, step):
        start = time.perf_counter()
        out = original_trajectories(self, step)
        generating.append(time.perf_counter() - start)
        return out

    def kept_rollouts(*args, **kwargs):
        made.append(original_rollouts(*args, **kwargs))
        return made[-1]

    Run.log, grpo.make_rollouts = timed_log, kept_rollouts
    sync_runtime.SyncRollouts.trajectories = timed_trajectories
    cfg = grpo.GRPOConfig(model=model, system_prompt="", seed=seed, sft_steps=0, steps=steps, eval_every=steps,
                          checkpoint_every=steps,  # "": no system message, as the demo's warm-up trained it
                          run_dir=tempfile.mkdtemp(), progress=False, plot=False, tensorboard=False,
                          **MODES[mode])
    grpo.train(cfg)
    intervals = [b[0] - a[0] for a, b in zip(stamps, stamps[1:])][1:-1]  # the first and last steps evaluate
    rows = [m for _, m in stamps]
    accuracy = [m["eval/accuracy"] for m in rows if "eval/accuracy" in m]
    step_s = statistics.mean(intervals)
    samples = cfg.prompts_per_step * cfg.group_size
    out = {"name": mode, "mode": "async" if "K" in mode and mode != "ray-K0" else "sync", "samples_per_step": samples,
           "samples_per_s": samples / step_s, "step_seconds": step_s, "accuracy_before": accuracy[0],
           "accuracy_after": accuracy[-1], "reward_last10": statistics.mean(m["reward/mean"] for m in rows[-10:]),
           "sync_seconds": 0.0}
    if generating:  # sync: sampling timed apart; the rest of a step is training
        gen = statistics.mean(generating[1:-1])
        out.update(gen_seconds_per_step=gen, train_seconds_per_step=step_s - gen)
    else:
        rollouts = made[-1]
        out.update(max_staleness=cfg.max_staleness, mean_staleness=statistics.mean(
            m["async/staleness_mean"] for m in rows[2:]),
            gen_seconds_per_step=rollouts.generator_busy / steps,
            train_seconds_per_step=step_s - rollouts.trainer_waiting / steps,
            generator_idle_percent=rows[-1]["async/generator_idle_percent"],
            trainer_idle_percent=rows[-1]["async/trainer_idle_percent"])
    print(RESULT + json.dumps(out), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sft-steps", type=int, default=1000, help="cap on the demo's warm-up steps")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json", help="write the runs here (for scaling_sim.py --validate)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--model", help="the warmed-up model folder an earlier run printed (skips the warm-up)")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if args.sft_steps < 1:
        parser.error(f"--sft-steps must be positive, got {args.sft_steps}")
    if args.steps < 4:
        parser.error(f"--steps must be at least 4 (the first and last steps evaluate), got {args.steps}")
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes takes a comma-separated list of {', '.join(MODES)}; got {args.modes!r}")
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        parser.error(f"--json {args.json}: its folder does not exist")
    if args.one:
        one_run(args.model, args.one, args.steps, args.seed)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    folder = args.model
    if folder is None:
        folder = tempfile.mkdtemp(prefix="warm-")
        print(f"warming up the demo model (seed {args.seed}) into {folder} ...", flush=True)
        warm_model(folder, args.seed, args.sft_steps)
    elif not os.path.isfile(os.path.join(folder, "config.json")):
        parser.error(f"--model {folder} is not a model folder (no config.json)")
    runs = []
    for mode in modes:
        done = subprocess.run([sys.executable, __file__, "--one", mode, "--model", folder, "--steps", str(args.steps),
                               "--seed", str(args.seed)], env=env, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
        if done.returncode != 0 or not lines:
            sys.exit(f"{mode} failed:\n{done.stderr[-2000:]}")
        runs.append(json.loads(lines[-1][len(RESULT):]))
        r = runs[-1]
        print(f"{mode:8} {r['samples_per_s']:7.1f} samples/s  accuracy {r['accuracy_before']:.3f} -> "
              f"{r['accuracy_after']:.3f}", flush=True)
    base = runs[0]
    print(f"\n{args.steps} GRPO steps x {base['samples_per_step']} samples, same warmed-up model, seed {args.seed}\n")
    print("| mode | samples/s | vs " + base["name"] + " | gen s/step | train s/step | mean staleness "
          "| held-out accuracy before -> after | mean reward, last 10 steps |")
    print("|---|---|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['name']} | {r['samples_per_s']:.1f} | {r['samples_per_s'] / base['samples_per_s']:.2f}x "
              f"| {r['gen_seconds_per_step']:.2f} | {r['train_seconds_per_step']:.2f} "
              f"| {r.get('mean_staleness', 0.0):.2f} | {r['accuracy_before']:.3f} -> {r['accuracy_after']:.3f} "
              f"| {r['reward_last10']:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
        print(f"\nruns: {args.json}  (python bench/scaling_sim.py --validate {args.json})")


if __name__ == "__main__":
    main()
