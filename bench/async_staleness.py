"""Asynchronous RLHF's central comparison on the offline RLHF demo: how much each loss loses when
its samples are K policy versions old (Noukhovitch et al., 2025, find online DPO degrades least).

For each seed the demo's stages are made once (SFT policy, reward model on gold-labelled pairs);
then online DPO, PPO-RLHF and GRPO with the reward model each train from that SFT policy with
``--runtime ray --max-staleness K`` (the schedule makes every sample after the first K steps
exactly K versions old), on the same samples per step and the same number of steps. Every
final policy is then scored the same way: one reply per held-out prompt (the prompts none of
them trained on), the hidden gold reward of the replies and their KL to the SFT policy.

    python bench/async_staleness.py --out /tmp/staleness           # 2 seeds x K in 0 1 2 4
    python bench/async_staleness.py --seeds 1 --staleness 0 4 --steps 20 --out /tmp/quick

Prints a table (and writes table.csv and staleness.png in --out).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # before transformers is imported: no loading bars
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import argparse  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from omnigym.evaluation.text import sampled_rewards  # noqa: E402
from omnigym.inference import make_engine  # noqa: E402
from omnigym.inference.engine import SamplingParams  # noqa: E402
from omnigym.models.lm import load_policy_and_tokenizer  # noqa: E402
from omnigym.models.reference import FrozenReference  # noqa: E402
from omnigym.rewards import parse_weights  # noqa: E402
from omnigym.tasks.preference_data import read_prompts  # noqa: E402
from omnigym.tasks.prompt_set import PromptSetConfig, split_prompts  # noqa: E402

SAMPLES_PER_STEP = 32
REPLY_TOKENS = 40
ALGORITHMS = {  # the same 32 samples a step: 16 pairs, 32 single replies, 8 groups of 4
    "online_dpo": lambda rm: ["--rewards", f"rm:{rm}:1.0", "--prompts-per-step", "16", "--samples-per-prompt", "2"],
    "rlhf": lambda rm: ["--reward-model", str(rm), "--prompts-per-step", "32", "--minibatches", "4"],
    "grpo": lambda rm: ["--rewards", f"rm:{rm}:1.0", "--prompts-per-step", "8", "--group-size", "4", "--sft-steps",
                        "0", "--system-prompt", "", "--eval-every", "1000000", "--eval-size", "128"],
}


def omnigym(*args: str, log: Path) -> float:
    started = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "w") as out:
        done = subprocess.run([sys.executable, "-m", "omnigym.cli", *args, "--no-progress", "--no-plot"],
                              stdout=out, stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        sys.exit(f"failed ({done.returncode}): omnigym {' '.join(args)}; see {log}")
    return time.perf_counter() - started


def stages(out: Path, seed: int) -> tuple[Path, Path]:
    """The demo's SFT policy and reward model for ``seed`` (a one-step online DPO run makes them)."""
    donor = out / f"stages-seed{seed}"
    if not (donor / "model").is_dir():
        omnigym("train", "online_dpo", "--seed", str(seed), "--steps", "1", "--run-dir", str(donor), "--overwrite",
                log=out / f"stages-seed{seed}.log")
    return donor / "stages" / "sft", donor / "stages" / "rm"


def heldout(seed: int, tokenizer) -> list:
    """The held-out prompts of the prompt split every algorithm here uses (GRPO's task file
    leaves them out)."""
    cfg = PromptSetConfig()
    cfg.seed = seed
    held, training, _ = split_prompts(cfg, read_prompts("words", "train", seed), tokenizer)
    return held, training


def grpo_task(out: Path, seed: int, training: list) -> Path:
    path = out / f"words-seed{seed}.jsonl"
    path.write_text("".join(json.dumps({"question": e["prompt"], "answer": ""}) + "\n" for e, _ in training))
    return path


@torch.no_grad()
def score(model_dir: Path, sft: Path, seed: int, examples: list, prompt_ids: list) -> dict:
    """Gold reward and KL to the SFT policy of one sampled reply per held-out prompt."""
    policy, tokenizer = load_policy_and_tokenizer(str(model_dir), seed, need_chat_template=False)
    start, _ = load_policy_and_tokenizer(str(sft), seed, need_chat_template=False)
    torch.manual_seed(seed)
    return sampled_rewards(policy, FrozenReference(start), make_engine(policy, tokenizer), tokenizer, examples,
                           prompt_ids, {"gold": parse_weights("gold_vowels:1.0")},
                           SamplingParams(max_new_tokens=REPLY_TOKENS, temperature=1.0))


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for algo in ALGORITHMS:
        mine = [r for r in rows if r["algo"] == algo]
        ks = sorted({r["staleness"] for r in mine})
        means = [sum(r["gold"] for r in mine if r["staleness"] == k) / len([r for r in mine if r["staleness"] == k])
                 for k in ks]
        line, = left.plot(ks, means, marker="o", label=algo)
        left.scatter([r["staleness"] for r in mine], [r["gold"] for r in mine], color=line.get_color(), alpha=0.4, s=12)
        right.scatter([r["kl"] for r in mine], [r["gold"] for r in mine], color=line.get_color(), label=algo,
                      marker="o", alpha=0.8)
        for r in mine:
            right.annotate(str(r["staleness"]), (r["kl"], r["gold"]), fontsize=7)
    left.set(xlabel="staleness K (policy versions)", ylabel="held-out gold reward", title="gold reward vs staleness")
    right.set(xlabel="KL to the SFT policy (nats per reply)", ylabel="held-out gold reward",
              title="gold reward vs KL (labels: K)")
    left.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 4, 1, 2])
    parser.add_argument("--algos", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    rows = []
    for seed in args.seeds:
        sft, rm = stages(args.out, seed)
        _, tokenizer = load_policy_and_tokenizer(str(sft), seed, need_chat_template=False)
        held, training = heldout(seed, tokenizer)
        examples, prompt_ids = [e for e, _ in held], [ids for _, ids in held]
        task = grpo_task(args.out, seed, training)
        base = score(sft, sft, seed, examples, prompt_ids)
        print(f"seed {seed}: the SFT policy's gold reward {base['eval/gold']:.3f}", flush=True)
        for k in args.staleness:  # every algorithm at one lag before the next lag: a cut-short run compares them
            for algo in args.algos:
                run_dir = args.out / f"{algo}-K{k}-seed{seed}"
                flags = ALGORITHMS[algo](rm) + (["--task", str(task)] if algo == "grpo" else ["--gold-reward",
                                                                                            "gold_vowels:1.0"])
                seconds = omnigym("train", algo, "--model", str(sft), "--seed", str(seed), "--steps", str(args.steps),
                                  "--max-new-tokens", str(REPLY_TOKENS), "--runtime", "ray", "--max-staleness", str(k),
                                  *flags, "--run-dir", str(run_dir), "--overwrite", log=args.out / f"{run_dir.name}.log")
                result = score(run_dir / "model", sft, seed, examples, prompt_ids)
                rows.append({"algo": algo, "staleness": k, "seed": seed, "gold": result["eval/gold"],
                             "kl": result["eval/kl"], "sft_gold": base["eval/gold"], "seconds": round(seconds, 1)})
                print(f"{algo:10s} K={k} seed {seed}: gold {result['eval/gold']:.3f} at KL {result['eval/kl']:.2f} "
                      f"({seconds:.0f} s)", flush=True)
                with open(args.out / "table.csv", "w", newline="") as f:  # after each run: a cut-short bench keeps them
                    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                    writer.writeheader()
                    writer.writerows(rows)
    print("\n| algorithm | " + " | ".join(f"K={k}" for k in sorted(args.staleness)) + " |")
    print("|---|" + "---|" * len(args.staleness))
    for algo in args.algos:
        cells = []
        for k in sorted(args.staleness):
            mine = [r for r in rows if r["algo"] == algo and r["staleness"] == k]
            cells.append(" / ".join(f"{r['gold']:.3f} ({r['kl']:.1f})" for r in mine))
        print(f"| {algo} | " + " | ".join(cells) + " |")
    print("(held-out gold reward (KL nats) per seed)")
    plot(rows, args.out / "staleness.png")
    print(f"plot: {args.out / 'staleness.png'}")


if __name__ == "__main__":
    main()
