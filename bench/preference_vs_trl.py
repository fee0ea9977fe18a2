"""Seconds per step of SFT, reward-model and DPO training: omnigym vs TRL's SFTTrainer,
RewardTrainer and DPOTrainer, in one run, on the same work.

Same model (the ~1M-parameter Llama with a character tokenizer, saved once and loaded by
both with from_pretrained), same data (the offline RLHF demo's conversational random-word
demonstrations, and gold-labelled pairs of such replies), batch 16, max length 256, AdamW at
the same learning rate, completion-only loss, no packing, same torch thread count and
device. Each (trainer, framework) runs in a fresh process; the frameworks alternate. A
step's time is the interval between consecutive step ends; the first 3 steps are dropped as
warm-up, the median of the rest is reported per repetition, and the median over repetitions
is compared.

    python bench/preference_vs_trl.py [--reps 3] [--steps 30] [--threads 1] [--device cpu]
                                      [--trainers sft,rm,dpo] [--unshared]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

STEP_TIMES = "STEP_TIMES "
BATCH, MAX_LENGTH, LR = 16, 256, 1e-4


def data(kind: str, unshared: bool) -> list[dict]:
    """The demo's rows. Their prompts all start "Say a few words about"; ``unshared`` reverses
    each prompt's words (same length), so that rows share nothing but the chat template's
    first token and omnigym's batch-wide shared prefix has nothing to save."""
    from omnigym.tasks.gold_world import demonstrations, label_pairs, prompts, reply

    if kind == "sft":
        rows = demonstrations(2000, 1)
    else:
        rng, rows = random.Random(1), prompts(2400, 1)
        rows = label_pairs(rows, [(reply(rng), reply(rng)) for _ in rows])
    if unshared:
        for row in rows:
            turn = row["prompt"][-1]
            turn["content"] = " ".join(reversed(turn["content"].split(" ")))
    return rows


def run_omnigym(kind: str, model_dir: str, steps: int, threads: int, device: str, unshared: bool) -> list[float]:
    from omnigym.algos import get_algorithm
    from omnigym.track.run import Run

    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "data.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in data(kind, unshared))
    stamps, original = [], Run.log

    def timed_log(self, step, metrics):
        original(self, step, metrics)
        stamps.append(time.perf_counter())

    Run.log = timed_log
    module = get_algorithm(kind)
    extra = {"gold_reward": None} if kind == "dpo" else {}
    cfg = module.CONFIG(model=model_dir, data=path, steps=steps, batch_size=BATCH, max_length=MAX_LENGTH,
                        learning_rate=LR, eval_size=16, eval_every=10**9, checkpoint_every=0, device=device,
                        run_dir=os.path.join(folder, "run"), progress=False, plot=False, tensorboard=False,
                        torch_threads=threads, **extra)
    module.train(cfg)
    # the first logged row is the start (step 0), the last step also evaluates: both intervals dropped
    return [b - a for a, b in zip(stamps, stamps[1:])][1:-1]


def run_trl(kind: str, model_dir: str, steps: int, threads: int, device: str, unshared: bool) -> list[float]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback

    stamps = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    common = dict(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=BATCH, learning_rate=LR,
                  max_steps=steps, use_cpu=device == "cpu", report_to="none", save_strategy="no",
                  logging_steps=10**6, seed=1, bf16=False, max_length=MAX_LENGTH, dataset_num_proc=None)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = Dataset.from_list(data(kind, unshared))
    if kind == "sft":
        from trl import SFTConfig, SFTTrainer

        trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir),
                             args=SFTConfig(completion_only_loss=True, packing=False, **common),
                             train_dataset=dataset, processing_class=tokenizer, callbacks=[Stamp()])
    elif kind == "rm":
        from trl import RewardConfig, RewardTrainer

        model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1)
        model.config.pad_token_id = tokenizer.pad_token_id
        trainer = RewardTrainer(model=model, args=RewardConfig(**common), train_dataset=dataset,
                                processing_class=tokenizer, callbacks=[Stamp()])
    else:
        from trl import DPOConfig, DPOTrainer

        trainer = DPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir),
                             args=DPOConfig(beta=0.1, **common), train_dataset=dataset,
                             processing_class=tokenizer, callbacks=[Stamp()])
    trainer.train()
    return [b - a for a, b in zip(stamps, stamps[1:])]


def child(framework: str, kind: str, model_dir: str, steps: int, threads: int, device: str, unshared: bool) -> None:
    import torch

    torch.set_num_threads(threads)
    times = (run_omnigym if framework == "omnigym" else run_trl)(kind, model_dir, steps, threads, device, unshared)
    print(STEP_TIMES + json.dumps(times), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each framework's process")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--trainers", default="sft,rm,dpo")
    parser.add_argument("--unshared", action="store_true",
                        help="prompts that share no beginning (each prompt's words reversed)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = set(args.trainers.split(",")) - {"sft", "rm", "dpo"}
    if unknown:
        parser.error(f"--trainers takes sft, rm and dpo; got {', '.join(sorted(unknown))}")
    if args.child:
        return child(*args.child, args.steps, args.threads, args.device, args.unshared)

    from omnigym.models.lm import build_tiny_model

    model_dir = str(build_tiny_model(tempfile.mkdtemp(prefix="omnigym-tiny-"), seed=0))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    table = []
    for kind in args.trainers.split(","):
        medians: dict[str, list[float]] = {"omnigym": [], "trl": []}
        for rep in range(args.reps):
            for framework in ("omnigym", "trl"):
                out = subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--threads",
                                      str(args.threads), "--device", args.device, "--child", framework, kind, model_dir]
                                     + (["--unshared"] if args.unshared else []),
                                     capture_output=True, text=True, env=env)
                line = next((l for l in out.stdout.splitlines() if l.startswith(STEP_TIMES)), None)
                if line is None:
                    sys.exit(f"{framework} {kind} failed:\n{out.stderr[-3000:]}")
                times = json.loads(line[len(STEP_TIMES):])[3:]
                medians[framework].append(statistics.median(times))
                print(f"{kind} rep {rep + 1} {framework:8s} median {medians[framework][-1]:.3f} s/step "
                      f"over {len(times)} steps", flush=True)
        o, t = statistics.median(medians["omnigym"]), statistics.median(medians["trl"])
        table.append((kind, o, t))
    print("\n| trainer | omnigym s/step | TRL s/step | omnigym / TRL |\n|---|---|---|---|")
    for kind, o, t in table:
        print(f"| {kind} | {o:.3f} | {t:.3f} | {o / t:.2f} |")


if __name__ == "__main__":
    main()
