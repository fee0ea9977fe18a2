"""Peak memory per process of SFT under DeepSpeed ZeRO-2, ZeRO-3 and ZeRO-3 with CPU offload.

Each run is ``torchrun --nproc-per-node 2 -m omnigym train sft --training-backend deepspeed``
with one of configs/deepspeed/{zero2,zero3,zero3-offload}.json, on ``--model`` (a folder:
SmolLM2-135M-Instruct from ``make smollm2``) or else a Llama built offline (``build_tiny_model``
with ``--hidden`` and ``--layers``), one after another, one torch thread per process. While a
run goes, the kernel's own peak resident set of each of its two processes (``VmHWM``) is read
from /proc every 50 ms; the larger of the two is reported:

  start      loading, the first evaluation and sampling (up to step 0's metrics row)
  steps      training steps only: the peak is reset at step 0's row and read at the row of
             step ``--steps`` - 1 (evaluation comes at the last step only)
  whole run  everything, the final checkpoint and export included, which gather the whole
             model and optimizer state into the first process under every stage
  above overhead  steps, less the same figure for ZeRO-2 on the ~1M-parameter tiny model
             (Python, torch, DeepSpeed, the data: what no stage can shard)

and the ratios of ZeRO-3 to ZeRO-2. On a CPU "offload" moves nothing (the optimizer state
and the weights are in the same memory); it is measured to show what its buffers cost.

    python bench/zero3_memory.py [--model models/smollm2-135m-instruct] [--hidden 768] [--layers 8]
                                 [--steps 4] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "deepspeed"
STAGES = ("zero2", "zero3", "zero3-offload")


def workers(launcher: int) -> list[int]:
    """The omnigym processes torchrun started (not DeepSpeed's compiler subprocesses)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == launcher \
                    and b"omnigym" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def peak_kib(pid: int) -> int:
    """The process's resident high-water mark (VmHWM), 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def reset_peak(pid: int) -> None:
    """VmHWM from now on (Linux: 5 to clear_refs)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        pass


def logged_steps(metrics: Path) -> set[int]:
    if not metrics.exists():
        return set()
    return {json.loads(line)["global_step"] for line in metrics.read_text().splitlines() if line.endswith("}")}


def run(stage: str, model: str, steps: int, batch_size: int) -> dict:
    """Peaks in MiB of the larger process: ``start`` (loading, the first evaluation and
    sampling: up to step 0's metrics row), ``steps`` (the peak reset there, read at step
    ``steps - 1``'s row: training steps only) and ``whole`` (the whole run, checkpoint included)."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"zero3-{stage}-")) / "run"
    command = [str(BIN / "torchrun"), "--nproc-per-node", "2", "-m", "omnigym", "train", "sft", "--model", model,
               "--steps", str(steps), "--batch-size", str(batch_size), "--eval-size", "8", "--eval-every",
               str(steps), "--checkpoint-every", str(steps), "--no-progress", "--no-plot", "--no-tensorboard",
               "--training-backend", "deepspeed", "--deepspeed-config", str(CONFIGS / f"{stage}.json"),
               "--run-dir", str(run_dir)]
    # glibc hands every freed tensor over 64 KiB back to the OS, so that the resident peak is
    # the peak of live tensors, not of what the allocator keeps cached (which favours whichever
    # stage allocates in fewer, larger pieces)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    log = run_dir.parent / "stderr.log"  # a file, not a pipe: an unread pipe fills and stalls the run
    launcher = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    peaks = {"start": None, "steps": None, "whole": 0}
    started = time.perf_counter()
    while launcher.poll() is None:
        pids, logged = workers(launcher.pid), logged_steps(run_dir / "metrics.jsonl")
        now = max((peak_kib(pid) for pid in pids), default=0)
        peaks["whole"] = max(peaks["whole"], now)
        if peaks["start"] is None and 0 in logged:
            peaks["start"] = now
            for pid in pids:
                reset_peak(pid)
        elif peaks["start"] is not None and peaks["steps"] is None and steps - 1 in logged:
            peaks["steps"] = now
        time.sleep(0.05)
    if launcher.returncode != 0 or None in peaks.values():
        sys.exit(f"{stage} on {model} failed (or its steps went unseen):\n{log.read_text()[-3000:]}")
    return {"stage": stage, **{k: v / 1024 for k, v in peaks.items()}, "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a model folder (default: a Llama built with --hidden and --layers)")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    if min(args.hidden, args.layers) < 1 or args.steps < 2 or args.hidden % 64 or args.batch_size < 2:
        parser.error("--hidden must be a positive multiple of 64, --layers positive, --steps >= 2, --batch-size >= 2")
    if importlib.util.find_spec("deepspeed") is None:
        sys.exit("zero3_memory.py: error: needs DeepSpeed: pip install --no-build-isolation 'omnigym[deepspeed]'")
    if args.model:
        folder = Path(args.model)
        config = json.loads((folder / "config.json").read_text())
        from safetensors import safe_open

        with safe_open(str(folder / "model.safetensors"), "pt") as weights:
            parameters = sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())
        what = f"{folder.name} ({config.get('model_type')}, hidden {config.get('hidden_size')}, " \
               f"{config.get('num_hidden_layers')} layers)"
    else:
        from omnigym.models.lm import build_tiny_model

        folder = build_tiny_model(Path(tempfile.mkdtemp(prefix="zero3-model-")) / "llama", hidden=args.hidden,
                                  layers=args.layers, heads=args.hidden // 64)
        parameters = args.layers * 16 * args.hidden ** 2  # attention 4h², MLP 3 x 4h², per layer (+ small parts)
        what = f"a Llama built offline, hidden {args.hidden}, {args.layers} layers"
    print(f"model: {what}, {parameters / 1e6:.0f}M parameters ({parameters * 4 / 2**20:.0f} MiB in fp32); "
          f"SFT, {args.steps} steps of batch {args.batch_size}, 2 processes")
    overhead = run("zero2", "tiny", args.steps, args.batch_size)
    print(f"overhead: ZeRO-2 on the 1M-parameter tiny model: {overhead['steps']:.0f} MiB per process in its steps")
    print(f"{'config':<15}{'start MiB':>11}{'steps MiB':>11}{'steps above overhead':>22}{'whole run MiB':>15}"
          f"{'seconds':>9}")
    results = {}
    for stage in STAGES:
        r = results[stage] = run(stage, str(folder), args.steps, args.batch_size)
        print(f"{stage:<15}{r['start']:>11.0f}{r['steps']:>11.0f}{r['steps'] - overhead['steps']:>22.0f}"
              f"{r['whole']:>15.0f}{r['seconds']:>9.0f}", flush=True)
    base = results["zero2"]
    for stage in STAGES[1:]:
        r = results[stage]
        print(f"{stage} / zero2: start {r['start'] / base['start']:.2f}, steps {r['steps'] / base['steps']:.2f}, "
              f"steps above overhead {(r['steps'] - overhead['steps']) / (base['steps'] - overhead['steps']):.2f}, "
              f"whole run {r['whole'] / base['whole']:.2f}")


if __name__ == "__main__":
    main()
