"""Seconds per GRPO step: omnigym vs TRL's GRPOTrainer, same model, data and settings.

Both train the same ~1M-parameter Llama (character tokenizer, saved and reloaded with
from_pretrained) on the same arithmetic prompts with the same reward (correctness + 0.1 x
format): 16 completions per step (2 prompts x 8 generations), 32 new tokens, beta 0.04,
lr 1e-4, one torch thread (``--threads``). Each repetition is a fresh process; the frameworks alternate.
A step's time is the interval between consecutive step ends (generation, scoring, reference
and policy passes, optimizer step); the first 3 steps are dropped as warm-up.

    python bench/grpo_vs_trl.py [--reps 3] [--steps 20] [--threads 1] [--model DIR] [--precision bf16]

``--model DIR`` runs both on a model folder of your own instead (e.g. ``make smollm2``'s
``models/smollm2-135m-instruct``), loaded by both with ``from_pretrained``, all weights trained.
``--precision bf16`` runs both in mixed precision (omnigym's ``--precision bf16``, TRL's
``bf16=True``: float32 weights, bf16 products); the CPU and its bf16 support are printed.
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
from pathlib import Path

STEP_TIMES = "STEP_TIMES "


def run_omnigym(model_dir: str, steps: int, threads: int, precision: str, scratch: str) -> list[float]:
    from omnigym.algos import grpo
    from omnigym.track.run import Run

    stamps, original = [], Run.log

    def timed_log(self, step, metrics):
        original(self, step, metrics)
        stamps.append(time.perf_counter())

    Run.log = timed_log
    cfg = grpo.GRPOConfig(model=model_dir, sft_steps=0, steps=steps, prompts_per_step=2, group_size=8,
                          max_new_tokens=32, beta=0.04, learning_rate=1e-4, eval_size=1, eval_every=10**9,
                          run_dir=scratch, progress=False, plot=False, tensorboard=False,
                          checkpoint_every=10**9, skip_equal_groups=False, torch_threads=threads,
                          system_prompt="", precision=precision)  # TRL's prompt: the question alone (a folder --model gets a system prompt)
    grpo.train(cfg)
    # the first and last steps also evaluate; they fall among the dropped/edge intervals
    return [b - a for a, b in zip(stamps, stamps[1:])][:-1]


def run_trl(model_dir: str, steps: int, threads: int, precision: str, scratch: str) -> list[float]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from omnigym.rewards import WeightedSum
    from omnigym.tasks.arithmetic import ArithmeticTask

    examples = ArithmeticTask().sample(2000, 1)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": e["question"]}], "answer": e["answer"]}
                              for e in examples])
    score = WeightedSum({"math": 1.0, "format": 0.1})

    def reward(completions, answer, **kwargs):
        return score([c[0]["content"] for c in completions], [{"answer": a} for a in answer]).tolist()

    stamps = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    config = GRPOConfig(output_dir=scratch, per_device_train_batch_size=16, num_generations=8,
                        max_completion_length=32, beta=0.04, learning_rate=1e-4, max_steps=steps, use_cpu=True,
                        report_to="none", save_strategy="no", logging_steps=10**6, seed=1, bf16=precision == "bf16")
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=reward, args=config,
                          train_dataset=data, processing_class=AutoTokenizer.from_pretrained(model_dir),
                          callbacks=[Stamp()])
    trainer.train()
    return [b - a for a, b in zip(stamps, stamps[1:])]


def child(framework: str, model_dir: str, steps: int, threads: int, precision: str) -> None:
    import torch

    torch.set_num_threads(threads)
    # the run's folder goes with the process: a SmolLM2 run's checkpoint is 2.1 GB, and each
    # repetition left one in /tmp until the disk filled
    with tempfile.TemporaryDirectory() as scratch:
        times = (run_omnigym if framework == "omnigym" else run_trl)(model_dir, steps, threads, precision,
                                                                     str(Path(scratch) / "run"))
    print(STEP_TIMES + json.dumps(times), flush=True)


def cpu_name() -> str:
    """The CPU, and whether it multiplies bf16 natively (AMX, AVX512-BF16): bf16 is emulated, and
    slow, without."""
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return "an unknown CPU"
    name = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), "a CPU")
    flags = next((l.split(":", 1)[1].split() for l in info.splitlines() if l.startswith("flags")), [])
    native = [f for f in ("amx_bf16", "avx512_bf16") if f in flags]
    return f"{name} ({', '.join(native) if native else 'no native bf16'})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each framework's process")
    parser.add_argument("--model", help="a model folder both load (default: the ~1M-parameter tiny model, built here)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="both frameworks in it: omnigym's --precision, TRL's bf16=True (autocast; float32 weights)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], args.steps, args.threads, args.precision)
    if min(args.reps, args.steps, args.threads) < 1:
        parser.error("--reps, --steps and --threads are at least 1")
    if args.steps < 6:
        parser.error("--steps is at least 6: the first 3 step times are dropped as warm-up, and the last as the end")
    if args.model is not None and not os.path.isfile(os.path.join(args.model, "config.json")):
        parser.error(f"--model {args.model}: no model folder there (no config.json)")

    from omnigym.models.lm import build_tiny_model

    model_dir = args.model or str(build_tiny_model(tempfile.mkdtemp(prefix="omnigym-tiny-"), seed=0))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    medians: dict[str, list[float]] = {"omnigym": [], "trl": []}
    for rep in range(args.reps):
        for framework in ("omnigym", "trl"):
            out = subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--threads", str(args.threads),
                                  "--precision", args.precision, "--child", framework, model_dir],
                                 capture_output=True, text=True, env=env)
            line = next((l for l in out.stdout.splitlines() if l.startswith(STEP_TIMES)), None)
            if line is None:
                sys.exit(f"{framework} failed:\n{out.stderr[-3000:]}")
            times = json.loads(line[len(STEP_TIMES):])[3:]
            medians[framework].append(statistics.median(times))
            print(f"rep {rep + 1} {framework:8s} median {medians[framework][-1]:.3f} s/step over {len(times)} steps",
                  flush=True)
    o, t = statistics.median(medians["omnigym"]), statistics.median(medians["trl"])
    print(f"\n{args.precision}, on {cpu_name()}")
    print(f"median s/step: omnigym {o:.3f}, TRL {t:.3f}; omnigym takes {o / t:.2f} of TRL's time ({t / o:.1f}x faster)")


if __name__ == "__main__":
    main()
