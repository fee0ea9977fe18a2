"""Peak memory per process of SFT under DeepSpeed ZeRO-2, ZeRO-3 and ZeRO-3 with CPU offload.

Each run is ``torchrun --nproc-per-node 2 -m omnigym train sft --training-backend deepspeed``
with one of configs/deepspeed/{zero2,zero3,zero3-offload}.json on a Llama built offline
(``build_tiny_model`` with ``--hidden`` and ``--layers``: SmolLM2 is not on this machine), one
after another, one torch thread per process. While a run goes, its processes' ``VmHWM`` (the
kernel's own peak resident set) is read from /proc every 50 ms:

  through training  the larger of the two processes' peaks when the last step's metrics row
                    appears: loading, the first evaluation and sampling, every step
  whole run         the largest peak of any process of the run (``getrusage`` of the reaped
                    children): the final checkpoint and export too, which gather the whole
                    model and optimizer state into the first process under every stage
  above overhead    through training, less the same run's figure on the ~1M-parameter tiny
                    model (Python, torch, DeepSpeed and the data: what no stage can shard)

and the ratios of ZeRO-3 to ZeRO-2. On a CPU the "offload" moves nothing (the optimizer state
and weights are in the same memory); it is measured to show what its buffers cost.

    python bench/zero3_memory.py [--hidden 768] [--layers 8] [--steps 3] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "deepspeed"
STAGES = ("zero2", "zero3", "zero3-offload")


def descendants(root: int) -> list[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def peak_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run(stage: str, model: str, steps: int, batch_size: int) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix=f"zero3-{stage}-")) / "run"
    command = [str(BIN / "torchrun"), "--nproc-per-node", "2", "-m", "omnigym", "train", "sft", "--model", model,
               "--steps", str(steps), "--batch-size", str(batch_size), "--eval-size", "8", "--eval-every",
               str(steps), "--checkpoint-every", str(steps), "--no-progress", "--no-plot", "--no-tensorboard",
               "--training-backend", "deepspeed", "--deepspeed-config", str(CONFIGS / f"{stage}.json"),
               "--run-dir", str(run_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    launcher = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peaks: dict[int, int] = {}
    through_training = None
    metrics = run_dir / "metrics.jsonl"
    while launcher.poll() is None:
        for pid in descendants(launcher.pid):
            peaks[pid] = max(peaks.get(pid, 0), peak_kib(pid))
        if through_training is None and metrics.exists() and any(
                json.loads(line).get("step") == steps for line in metrics.read_text().splitlines() if line.strip()):
            through_training = max(peaks.values())
        time.sleep(0.05)
    if launcher.returncode != 0:
        sys.exit(f"{stage} on {model} failed:\n{launcher.stderr.read()[-3000:]}")
    whole_run = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if whole_run <= before:  # a smaller run than an earlier one: ru_maxrss keeps the largest child's
        whole_run = max(peaks.values())
    return {"stage": stage, "through_training_mib": (through_training or max(peaks.values())) / 1024,
            "whole_run_mib": whole_run / 1024, "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    if min(args.hidden, args.layers, args.steps) < 1 or args.hidden % 64 or args.batch_size < 2:
        parser.error("--hidden must be a positive multiple of 64, --layers and --steps positive, --batch-size >= 2")
    if importlib.util.find_spec("deepspeed") is None:
        sys.exit("zero3_memory.py: error: needs DeepSpeed: pip install --no-build-isolation 'omnigym[deepspeed]'")
    from omnigym.models.lm import build_tiny_model

    folder = build_tiny_model(Path(tempfile.mkdtemp(prefix="zero3-model-")) / "llama", hidden=args.hidden,
                              layers=args.layers, heads=args.hidden // 64)
    parameters = args.layers * 16 * args.hidden ** 2  # attention 4h², MLP 3 x 4h², per layer (+ small parts)
    print(f"model: Llama, hidden {args.hidden}, {args.layers} layers, ~{parameters / 1e6:.0f}M parameters "
          f"({parameters * 4 / 2**20:.0f} MiB in fp32); SFT, {args.steps} steps of batch {args.batch_size}, 2 processes")
    overhead = run("zero2", "tiny", args.steps, args.batch_size)["through_training_mib"]
    print(f"overhead (ZeRO-2 on the 1M-parameter tiny model): {overhead:.0f} MiB per process")
    print(f"{'config':<15}{'through training MiB':>22}{'above overhead':>16}{'whole run MiB':>15}{'seconds':>9}")
    results = {}
    for stage in STAGES:
        result = results[stage] = run(stage, str(folder), args.steps, args.batch_size)
        print(f"{stage:<15}{result['through_training_mib']:>22.0f}{result['through_training_mib'] - overhead:>16.0f}"
              f"{result['whole_run_mib']:>15.0f}{result['seconds']:>9.0f}", flush=True)
    base = results["zero2"]
    for stage in STAGES[1:]:
        result = results[stage]
        print(f"{stage} / zero2: through training {result['through_training_mib'] / base['through_training_mib']:.2f}, "
              f"above overhead {(result['through_training_mib'] - overhead) / (base['through_training_mib'] - overhead):.2f}, "
              f"whole run {result['whole_run_mib'] / base['whole_run_mib']:.2f}")


if __name__ == "__main__":
    main()
