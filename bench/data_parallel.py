"""Steps/s of data-parallel training on 2 processes vs 1 process, same global batch.

SFT on the built-in arithmetic data with the ~1M-parameter Llama (``--model tiny``), a
global batch of ``--batch-size`` sequences, ``--steps`` steps, no evaluation in between,
one torch thread per process. Each run is a fresh command, one after another:

  local-1t  one process, one thread            local-2t  one process, two threads
  ddp       torchrun, 2 processes, DDP (gloo)  fsdp2     torchrun, 2 processes, FSDP2 (gloo)
  deepspeed torchrun, 2 processes, ZeRO-2      (only where DeepSpeed is installed)

steps/s is the run's own (``perf/steps_per_second`` at its last step), and the final
held-out loss shows the runs learned alike.

    python bench/data_parallel.py [--steps 60] [--batch-size 64] [--model tiny]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent
ZERO2 = str(Path(__file__).resolve().parent.parent / "configs" / "deepspeed" / "zero2.json")


def run(name: str, flags: list[str]) -> dict:
    run_dir = tempfile.mkdtemp(prefix=f"dp-{name}-") + "/run"
    if name in ("local-1t", "local-2t"):
        command = [str(BIN / "omnigym"), *flags, "--torch-threads", name[-2]]
    else:
        extra = ["--deepspeed-config", ZERO2] if name == "deepspeed" else []
        command = [str(BIN / "torchrun"), "--nproc-per-node", "2", "-m", "omnigym", *flags, "--training-backend", name,
                   *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([*command, "--run-dir", run_dir], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{name} failed:\n{done.stderr[-2000:]}")
    rows = [json.loads(line) for line in open(Path(run_dir) / "metrics.jsonl")]
    return {"name": name, "steps_per_s": rows[-1]["perf/steps_per_second"], "loss": rows[-1]["eval/loss"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--model", default="tiny")
    args = parser.parse_args()
    if args.steps < 1 or args.batch_size < 2:
        parser.error(f"--steps must be positive and --batch-size at least 2, got {args.steps} and {args.batch_size}")
    flags = ["train", "sft", "--model", args.model, "--steps", str(args.steps), "--batch-size", str(args.batch_size),
             "--eval-size", "50", "--eval-every", str(args.steps), "--checkpoint-every", str(args.steps),
             "--no-progress", "--no-plot", "--no-tensorboard"]
    names = ["local-1t", "local-2t", "ddp", "fsdp2"] + (["deepspeed"] if importlib.util.find_spec("deepspeed") else [])
    results = []
    for name in names:
        results.append(run(name, flags))
        print(f"{name:10} {results[-1]['steps_per_s']:.2f} steps/s", flush=True)
    base = results[0]["steps_per_s"]
    print(f"\nSFT, {args.model}, global batch {args.batch_size}, {args.steps} steps\n")
    print("| run | processes | steps/s | vs local-1t | held-out loss at the end |\n|---|---|---|---|---|")
    for r in results:
        print(f"| {r['name']} | {1 if r['name'].startswith('local') else 2} | {r['steps_per_s']:.2f} "
              f"| {r['steps_per_s'] / base:.2f}x | {r['loss']:.4f} |")


if __name__ == "__main__":
    main()
