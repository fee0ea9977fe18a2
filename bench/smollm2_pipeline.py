"""The RLHF commands on a real pretrained model, offline: SmolLM2-135M-Instruct (``make smollm2``).

Runs SFT, a reward model on Anthropic HH-RLHF harmless-base, PPO-RLHF against that reward
model, and DPO, each with LoRA for a few steps, then GRPO on 1-digit addition (a short warm-up on
demonstrations of the answer format, then GRPO); records seconds per step, peak resident memory (of a fresh
process per stage) and the reward model's held-out accuracy after its fixed budget, and
GRPO's reward curve. Each stage is a separate ``omnigym`` process, as a user runs them.

    python bench/smollm2_pipeline.py [--model models/smollm2-135m-instruct]
        [--hh ../shared/data/hh-rlhf/harmless-base-test.jsonl.gz] [--threads 2] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def stage(name: str, argv: list[str], env: dict) -> dict:
    """Run one ``omnigym train`` in a fresh process; its wall time, peak memory and metrics. A
    finished run in ``--root`` (its ``model/`` is there) is read instead (peak memory unknown)."""
    run_dir = Path(argv[argv.index("--run-dir") + 1])
    if (run_dir / "model").is_dir():
        rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
        rate = [r["perf/steps_per_second"] for r in rows if "perf/steps_per_second" in r][-1]
        print(f"{name}: read from {run_dir}, {1 / rate:.2f} s/step", flush=True)
        return {"rows": rows, "s_per_step": 1 / rate, "peak_mb": float("nan"), "seconds": float("nan")}
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen([sys.executable, "-m", "omnigym.cli", "train", *argv], env=env,
                                 stdout=subprocess.DEVNULL, stderr=err, text=True)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak memory, not the largest so far
        child.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read()
    seconds = time.perf_counter() - started
    if child.returncode != 0:
        sys.exit(f"{name} failed:\n{stderr[-3000:]}")
    peak_mb = usage.ru_maxrss / 1024
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    rates = [r["perf/steps_per_second"] for r in rows if "perf/steps_per_second" in r]
    print(f"{name}: {seconds:.0f} s in all, {1 / rates[-1]:.2f} s/step, peak RSS {peak_mb:.0f} MB", flush=True)
    print("  " + stderr.strip().splitlines()[-1], flush=True)
    return {"rows": rows, "s_per_step": 1 / rates[-1], "peak_mb": peak_mb, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models/smollm2-135m-instruct")
    parser.add_argument("--hh", default=str(Path(__file__).resolve().parents[2] / "shared/data/hh-rlhf/"
                                            "harmless-base-test.jsonl.gz"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--grpo-steps", type=int, default=12)
    parser.add_argument("--root", default=None, help="where the runs go; finished runs there are read, not redone")
    args = parser.parse_args()
    if not (Path(args.model) / "config.json").is_file():
        sys.exit(f"{args.model} is not there; make it with: make smollm2")
    if not Path(args.hh).is_file():
        sys.exit(f"{args.hh} is not there (HH-RLHF harmless-base, jsonl.gz)")
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="omnigym-smollm2-"))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    common = ["--lora-r", "16", "--torch-threads", str(args.threads), "--device", args.device, "--no-progress",
              "--no-tensorboard", "--no-plot"]
    model = ["--model", args.model]
    results = {
        "sft": stage("SFT (HH-RLHF chosen conversations)", ["sft", *model, "--data", write_sft_rows(args.hh, root),
                     "--steps", "10", "--batch-size", "4", "--max-length", "384", "--eval-size", "32",
                     "--eval-every", "10", "--learning-rate", "2e-4", "--run-dir", str(root / "sft"), *common], env),
        "rm": stage("RM (HH-RLHF harmless-base)", ["rm", *model, "--data", args.hh, "--steps", "40", "--batch-size",
                    "8", "--max-length", "384", "--eval-size", "200", "--eval-every", "40", "--learning-rate", "2e-4",
                    "--run-dir", str(root / "rm"), *common], env),
    }
    results["rlhf"] = stage("PPO-RLHF (HH prompts, the RM above)", [
        "rlhf", *model, "--reward-model", str(root / "rm"), "--data", args.hh, "--max-prompt-length", "256",
        "--steps", "4", "--prompts-per-step", "8", "--minibatches", "2", "--ppo-epochs", "2", "--max-new-tokens", "32",
        "--eval-prompts", "8", "--eval-every", "4", "--learning-rate", "1e-5", "--value-learning-rate", "1e-4",
        "--run-dir", str(root / "rlhf"), *common], env)
    results["dpo"] = stage("DPO (HH-RLHF harmless-base)", [
        "dpo", *model, "--data", args.hh, "--steps", "10", "--batch-size", "4", "--max-length", "384", "--eval-size",
        "32", "--eval-every", "10", "--learning-rate", "5e-5", "--run-dir", str(root / "dpo"), *common], env)
    # The instruct model answers in prose even when told the format (docs/benchmarks.md), so GRPO's own
    # warm-up first shows it the <answer> tags on a few demonstrations, then GRPO trains from rewards alone.
    results["grpo"] = stage("GRPO (1-digit addition, warm-up then GRPO)", [
        "grpo", *model, "--digits", "1", "--sft-steps", "30", "--sft-batch-size", "16", "--sft-eval-every", "10",
        "--sft-learning-rate", "2e-4", "--steps", str(args.grpo_steps), "--prompts-per-step", "4", "--group-size", "8",
        "--max-new-tokens", "32", "--eval-size", "40", "--eval-every", "6", "--learning-rate", "1e-4",
        "--run-dir", str(root / "grpo"), *common], env)
    accuracy = [r["eval/accuracy"] for r in results["rm"]["rows"] if "eval/accuracy" in r]
    print(f"\nRM held-out accuracy on 200 HH pairs: {accuracy[0]:.3f} -> {accuracy[-1]:.3f} after 40 steps of 8 pairs")
    rewards = [r["reward/mean"] for r in results["grpo"]["rows"] if "reward/mean" in r]
    accuracy = [r["eval/accuracy"] for r in results["grpo"]["rows"] if "eval/accuracy" in r]
    print(f"GRPO held-out accuracy {' -> '.join(f'{a:.3f}' for a in accuracy)}; mean reward per step: "
          f"{' '.join(f'{r:.2f}' for r in rewards)}")
    print("\n| stage | s/step | peak RSS (MB) |\n|---|---|---|")
    for name, result in results.items():
                print(f"| {name} | {result['s_per_step']:.2f} | {result['peak_mb']:.0f} |")
    print(f"(runs in {root})")


def write_sft_rows(hh: str, root: Path) -> str:
    """SFT rows from HH-RLHF: each pair's chosen transcript as a conversation."""
    import gzip

    from omnigym.tasks.preference_data import hh_messages

    out = root / "hh_chosen.jsonl"
    with gzip.open(hh, "rt") as f, open(out, "w") as sink:
        for i, line in enumerate(f):
            messages = hh_messages(f"hh:{i}", json.loads(line)["chosen"])
            if messages and messages[-1]["role"] == "assistant" and messages[-1]["content"]:
                sink.write(json.dumps({"messages": messages}) + "\n")
    return str(out)


if __name__ == "__main__":
    main()
