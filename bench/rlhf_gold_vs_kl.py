"""Gold and proxy reward against KL in the offline RLHF demo, per seed: the figure in docs/rlhf.md.

For each seed: ``omnigym train rlhf`` with the demo's defaults except ``--steps`` and a
denser ``--eval-every`` (evaluation never touches training's random stream, so the step-20
evaluation is the default demo's final one), then ``omnigym train dpo`` on the same pairs
from the same SFT model. Prints the reward model's held-out accuracy and, for PPO (at step
20 and at the end) and DPO, the gold reward of sampled replies before and after with the
KL to the reference; draws gold and reward-model score against KL.

    python bench/rlhf_gold_vs_kl.py [--seeds 1 2] [--steps 40] [--out docs/img/rlhf_gold_vs_kl.png]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def evaluations(run_dir: Path) -> list[dict]:
    from omnigym.track.files import read_metrics

    return [r for r in read_metrics(run_dir) if "eval/kl" in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", default="docs/img/rlhf_gold_vs_kl.png")
    parser.add_argument("--root", default=None, help="where the runs go (default: a temporary folder)")
    args = parser.parse_args()

    from omnigym.algos import dpo, rlhf

    root = Path(args.root or tempfile.mkdtemp(prefix="omnigym-rlhf-demo-"))
    quiet = dict(progress=False, plot=False, tensorboard=False)
    curves = {}
    for seed in args.seeds:
        ppo_dir, dpo_dir = root / f"ppo-{seed}", root / f"dpo-{seed}"
        stages = ppo_dir / "stages"
        if not (ppo_dir / "model").is_dir():  # a finished run in --root is read, not trained again
            rlhf.train(rlhf.RLHFConfig(seed=seed, run_dir=str(ppo_dir), steps=args.steps, eval_every=2, **quiet))
        if not (dpo_dir / "model").is_dir():
            dpo.train(dpo.DPOConfig(seed=seed, run_dir=str(dpo_dir), data=str(stages / "pairs.jsonl"),
                                    model=str(stages / "sft"), gold_reward="gold_vowels:1.0", eval_every=10, **quiet))
        ppo, preference = evaluations(ppo_dir), evaluations(dpo_dir)
        at_20 = next(r for r in ppo if r["global_step"] == 20)
        accuracy = json.loads((stages / "rm" / "model" / "omnigym_reward.json").read_text())["heldout_accuracy"]
        print(f"seed {seed}: RM held-out accuracy {accuracy:.3f}")
        print(f"  PPO-RLHF gold {ppo[0]['eval/gold_reward']:.3f} -> {at_20['eval/gold_reward']:.3f} at step 20 "
              f"(KL {at_20['eval/kl']:.2f}), {ppo[-1]['eval/gold_reward']:.3f} at step {ppo[-1]['global_step']} "
              f"(KL {ppo[-1]['eval/kl']:.2f}); RM score {ppo[0]['eval/rm_score']:.3f} -> {at_20['eval/rm_score']:.3f}")
        print(f"  DPO gold {preference[0]['eval/gold_reward']:.3f} -> {preference[-1]['eval/gold_reward']:.3f} "
              f"(KL {preference[-1]['eval/kl']:.2f}); held-out preference accuracy {preference[-1]['eval/accuracy']:.3f}")
        curves[seed] = (ppo, preference)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    proxy_axis = axis.twinx()
    for seed, (ppo, preference) in curves.items():
        kl = [r["eval/kl"] for r in ppo]
        axis.plot(kl, [r["eval/gold_reward"] for r in ppo], "o-", label=f"PPO gold, seed {seed}")
        proxy_axis.plot(kl, [r["eval/rm_score"] for r in ppo], "x--", alpha=0.5, label=f"PPO proxy (RM), seed {seed}")
        axis.plot([r["eval/kl"] for r in preference], [r["eval/gold_reward"] for r in preference], "s:",
                  label=f"DPO gold, seed {seed}")
    axis.set_xlabel("KL(policy || reference), nats per reply")
    axis.set_ylabel("gold reward (vowel fraction)")
    proxy_axis.set_ylabel("reward-model score (proxy)")
    lines = axis.get_legend_handles_labels()
    more = proxy_axis.get_legend_handles_labels()
    axis.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="lower right")
    axis.set_title("Offline RLHF demo: gold and proxy reward against KL")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    print(f"figure: {args.out}  (runs in {root})")


if __name__ == "__main__":
    main()
