"""Does a judge reward raise the hidden gold score? GRPO with ``--rewards judge:RUN:1.0`` on the
offline RLHF world (``omnigym.tasks.gold_world``): the figures in docs/judges.md.

No hub is reachable, so the judge is a model built here, the way the demo's reward model is:

1. The demo's stages, as ``omnigym train rlhf --seed N`` makes them (``pipelines/rlhf_demo.py``):
   the SFT policy (120 steps on random-word replies) and its 2,000 prompts x 2 sampled replies
   labelled by gold. The 200 pairs the reward model holds out (the same shuffle by the seed)
   are held out here too.
2. The judge: the built-in tiny model trained by ``omnigym train sft`` to answer the rubric
   prompt (rendered by ``rewards/judge.py``'s own ``render``, so training and use read the same
   text) with ``Score: N``, N = min(10, round(gold x K)), K = 20. Its data: the SFT replies of
   the training pairs, and as many random-word strings whose letters are vowels with a
   probability drawn from [0, 0.6] (5% of the SFT replies score 8 or more: a judge never
   shown a 9 never says 9). Only the label is gold-derived, as the reward model's pairs are.
   K = 20 spreads the SFT policy's replies (90% have a gold between 0 and 0.375) over scores 0
   to 8; with K = 10, 86% of them would score 1, 2 or 3, and GRPO's groups would tie more
   often. The price: the judge's 10 means any gold of 0.5 or more.
3. Its agreement with gold on the 200 held-out pairs, judged through ``JudgeReward`` itself
   (the in-process engine, greedy): pairwise accuracy (ties count as misses) and mean |N - gold K|.
4. ``omnigym train grpo`` from the SFT stage on the world's prompts (a task file; no system
   prompt, as the SFT demonstrations had none) with ``--rewards judge:JUDGE:1.0,gold_vowels:0``:
   gold has weight 0, so it is logged per step (``reward/gold_vowels``) and never trained on.
5. Gold and judge score of one reply sampled (temperature 1, 40 tokens, as the demo's pairs) on
   200 held-out prompts from the SFT policy and from GRPO's final policy.

    python bench/judge_gold.py [--seeds 1 2] [--judge-steps 600] [--grpo-steps 40] [--root DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path

K = 20
"""a reply's score is min(10, round(gold * K)): see the module's docstring"""
REPLY_TOKENS = 40
HELDOUT_PAIRS = 200
"""the reward model's held-out pairs (train rm's --eval-size), the same ones"""
RUBRIC = """Grade the reply below: the larger the share of its letters that are vowels, the better.
Reply: {reply}
End with one last line: Score: N (0 to 10)"""


@dataclass
class Sizes:
    """The bench's sizes; the test (tests/test_judge_gold.py) runs a smaller set."""
    judge_model: str = "tiny"
    """what the judge is trained from: a built-in model ("tiny", or "tiny-small": a quarter of its weights)"""
    judge_steps: int = 600
    judge_batch: int = 32
    judge_learning_rate: float = 1e-3
    judge_pairs: int | None = None
    """training pairs whose replies the judge learns from (None: all, about 1,700)"""
    grpo_steps: int = 40
    prompts_per_step: int = 16
    group_size: int = 8
    learning_rate: float = 3e-4
    eval_prompts: int = 200
    rubric: str = RUBRIC
    """the judge's rubric: the test's shorter one makes its judge's sequences a third as long"""


def label(reply: str) -> int:
    from omnigym.tasks.gold_world import gold_reward

    return min(10, round(gold_reward(reply) * K))


def vowel_words(rng: random.Random, p: float) -> str:
    """3 to 5 words of 2 to 6 letters, as the SFT demonstrations, each letter a vowel with probability ``p``."""
    from omnigym.tasks.gold_world import LETTERS, VOWELS

    vowels, consonants = sorted(VOWELS), [c for c in LETTERS if c not in VOWELS]
    return " ".join("".join(rng.choice(vowels if rng.random() < p else consonants) for _ in range(rng.randint(2, 6)))
                    for _ in range(rng.randint(3, 5)))


def demo_stages(root: Path, seed: int) -> Path:
    """The RLHF demo's SFT stage and gold-labelled pairs (``rlhf_demo.prepare``'s first two stages,
    the same calls with the same seed), made once in ``root/stages``."""
    from omnigym.algos.lm import sft
    from omnigym.pipelines.rlhf_demo import SFT_STEPS, finished, write_gold_pairs

    stages = root / "stages"
    if not finished(stages / "sft", seed):
        sft.train(sft.CONFIG(data="words", steps=SFT_STEPS, run_dir=str(stages / "sft"), seed=seed,
                             overwrite=(stages / "sft").exists(), progress=False, tensorboard=False, plot=False))
    if not (stages / "pairs.jsonl").is_file():
        write_gold_pairs(stages / "sft", stages / "pairs.jsonl", seed, "cpu")
    return stages


def split_pairs(pairs: Path, seed: int) -> tuple[list[dict], list[dict]]:
    """(held-out, training) pairs: ``train rm``'s shuffle by the seed, its first 200 held out."""
    from omnigym.tasks.datasets import read_rows

    rows = [row for _, row in read_rows(str(pairs))]
    random.Random(seed).shuffle(rows)
    return rows[:HELDOUT_PAIRS], rows[HELDOUT_PAIRS:]


def judge_rows(training: list[dict], seed: int, rubric: str) -> list[dict]:
    """SFT rows (conversational prompt/completion): the rubric prompt of a reply, and ``Score: N``."""
    from omnigym.rewards.judge import question_text, render

    rng = random.Random(seed + 31)
    replies = [(question_text(p), p[side][0]["content"]) for p in training for side in ("chosen", "rejected")]
    replies += [(q, vowel_words(rng, rng.uniform(0.0, 0.6))) for q, _ in replies]
    return [{"prompt": [{"role": "user", "content": render(rubric, q, r, None)}],
             "completion": [{"role": "assistant", "content": f"Score: {label(r)}"}]} for q, r in replies]


def train_judge(root: Path, pairs: list[dict], seed: int, sizes: Sizes) -> Path:
    from omnigym.algos.lm import sft

    judge = root / "judge"
    if not (judge / "model" / "config.json").is_file():
        data = root / "judge_data.jsonl"
        rows = judge_rows(pairs[:sizes.judge_pairs], seed, sizes.rubric)
        data.write_text("".join(json.dumps(row) + "\n" for row in rows))
        sft.train(sft.CONFIG(data=str(data), model=sizes.judge_model, steps=sizes.judge_steps,
                             batch_size=sizes.judge_batch, learning_rate=sizes.judge_learning_rate,
                             eval_size=min(200, len(rows) // 10), eval_every=sizes.judge_steps, run_dir=str(judge),
                             seed=seed, overwrite=judge.exists(), progress=False, tensorboard=False, plot=False))
    return judge


def agreement(judge, heldout: list[dict]) -> dict:
    """The judge's pairwise accuracy on held-out gold-labelled pairs (a tie is a miss), its tie
    share, and its mean |N - gold K| over their replies."""
    from omnigym.tasks.gold_world import gold_reward

    examples = [{"prompt": p["prompt"]} for p in heldout]
    chosen = [p["chosen"][0]["content"] for p in heldout]
    rejected = [p["rejected"][0]["content"] for p in heldout]
    a, b = judge(chosen, examples).tolist(), judge(rejected, examples).tolist()
    error = [abs(10 * s - gold_reward(r) * K) for s, r in zip(a + b, chosen + rejected)]
    return {"pairwise": sum(x > y for x, y in zip(a, b)) / len(a), "ties": sum(x == y for x, y in zip(a, b)) / len(a),
            "mean_abs_error": sum(error) / len(error)}


def sampled(model_dir: Path, judge, seed: int, n: int) -> dict:
    """Gold and judge score of one reply per held-out prompt, sampled at temperature 1."""
    import torch

    from omnigym.generators.text_env import render
    from omnigym.inference import make_engine
    from omnigym.inference.engine import SamplingParams
    from omnigym.models.lm import load_policy_and_tokenizer
    from omnigym.tasks.gold_world import gold_reward, prompts

    model, tokenizer = load_policy_and_tokenizer(str(model_dir), seed)
    rows = prompts(n, seed + 100_000)
    torch.manual_seed(seed)
    samples = make_engine(model, tokenizer).generate([render(tokenizer, row["prompt"]) for row in rows], 1,
                                                     SamplingParams(max_new_tokens=REPLY_TOKENS, temperature=1.0))
    replies = [tokenizer.decode(group[0].completion_ids, skip_special_tokens=True) for group in samples]
    scores = judge(replies, rows).tolist()
    return {"gold": sum(map(gold_reward, replies)) / len(replies), "judge": sum(scores) / len(scores),
            "example": replies[0]}


def run_grpo(root: Path, stages: Path, judge_dir: Path, seed: int, sizes: Sizes) -> Path:
    from omnigym.algos.lm import grpo
    from omnigym.tasks.gold_world import prompts

    task = root / "prompts.jsonl"
    task.write_text("".join(json.dumps({"question": row["prompt"][0]["content"], "answer": "none"}) + "\n"
                            for row in prompts(2000, seed)))
    rubric = root / "rubric.txt"
    rubric.write_text(sizes.rubric)
    out = root / "grpo"
    if not (out / "model" / "config.json").is_file():
        steps = sizes.grpo_steps
        grpo.train(grpo.CONFIG(model=str(stages / "sft"), task=str(task), system_prompt="", sft_steps=0,
                               rewards=f"judge:{judge_dir}:1.0,gold_vowels:0", judge_rubric=str(rubric),
                               max_new_tokens=REPLY_TOKENS, steps=steps, prompts_per_step=sizes.prompts_per_step,
                               group_size=sizes.group_size, learning_rate=sizes.learning_rate, eval_size=50,
                               eval_every=steps, checkpoint_every=steps, run_dir=str(out), seed=seed,
                               overwrite=out.exists(), progress=False, tensorboard=False, plot=False))
    return out


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_seed(root: Path, seed: int, sizes: Sizes, stages: Path | None = None) -> dict:
    """Judge and GRPO for one seed in ``root``; ``stages``: the demo's finished stages (SFT and
    pairs) of this seed made elsewhere (default: made, or reused, in ``root/stages``)."""
    from omnigym.rewards.judge import JudgeReward
    from omnigym.track.files import read_metrics

    times, clock = {}, (cpu(), time.perf_counter())

    def lap(name):
        nonlocal clock
        now = (cpu(), time.perf_counter())
        times[name] = (now[0] - clock[0], now[1] - clock[1])
        clock = now

    root.mkdir(parents=True, exist_ok=True)
    # the judge and GRPO runs in root are reused when finished: only if they were made with these sizes
    made_with, wanted = root / "sizes.json", json.dumps({"seed": seed, **asdict(sizes)}, sort_keys=True)
    if made_with.is_file() and made_with.read_text() != wanted:
        raise SystemExit(f"{root} holds runs made with other sizes ({made_with}); give another --root")
    made_with.write_text(wanted)
    stages = stages or demo_stages(root, seed)
    lap("stages")
    heldout, training = split_pairs(stages / "pairs.jsonl", seed)
    judge_dir = train_judge(root, training, seed, sizes)
    lap("judge")
    judge = JudgeReward(str(judge_dir), sizes.rubric)
    agree = agreement(judge, heldout)
    before = sampled(stages / "sft", judge, seed, sizes.eval_prompts)
    lap("measure")
    out = run_grpo(root, stages, judge_dir, seed, sizes)
    lap("grpo")
    after = sampled(out / "model", judge, seed, sizes.eval_prompts)
    rows = [r for r in read_metrics(out) if "reward/gold_vowels" in r]
    return {"seed": seed, "agreement": agree, "before": before, "after": after, "times": times,
            "kl": rows[-1]["kl/mean"], "train_gold": [(r["global_step"], r["reward/gold_vowels"]) for r in rows]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--judge-steps", type=int, default=Sizes.judge_steps)
    parser.add_argument("--grpo-steps", type=int, default=Sizes.grpo_steps)
    parser.add_argument("--learning-rate", type=float, default=Sizes.learning_rate, help="GRPO's")
    parser.add_argument("--root", default=None, help="where the runs go (default: a temporary folder); "
                                                     "finished stages there are reused")
    args = parser.parse_args()
    # checked before minutes of training, each in one line (the trainers would say it only when reached)
    if min(args.seeds) < 0 or args.judge_steps <= 0 or args.grpo_steps <= 0 or not args.learning_rate > 0:
        parser.error("--seeds must be 0 or more, and --judge-steps, --grpo-steps and --learning-rate positive")
    if args.root and not Path(args.root).parent.is_dir():
        parser.error(f"--root {args.root}: its parent folder does not exist")

    import tempfile

    from omnigym.errors import OmnigymError

    root = Path(args.root or tempfile.mkdtemp(prefix="omnigym-judge-gold-"))
    try:
        for seed in args.seeds:
            report(seed, one_seed(root / f"seed{seed}", seed, sizes := Sizes(
                judge_steps=args.judge_steps, grpo_steps=args.grpo_steps, learning_rate=args.learning_rate)), sizes)
    except OmnigymError as exc:  # what a trainer refused, as the CLI says it
        raise SystemExit(f"judge_gold: error: {exc}") from None


def report(seed: int, r: dict, sizes: Sizes) -> None:
    a, b, c = r["agreement"], r["before"], r["after"]
    print(f"seed {seed}: judge on {HELDOUT_PAIRS} held-out gold pairs: pairwise accuracy {a['pairwise']:.3f} "
          f"(ties {a['ties']:.3f}), mean |N - {K} gold| {a['mean_abs_error']:.2f}")
    print(f"  GRPO {sizes.grpo_steps} steps: gold {b['gold']:.3f} -> {c['gold']:.3f}, judge score "
          f"{b['judge']:.3f} -> {c['judge']:.3f} ({sizes.eval_prompts} held-out prompts, one reply each), "
          f"KL {r['kl']:.3f} (GRPO's k3 per token, last step); "
          f"e.g. {b['example']!r} -> {c['example']!r}")
    curve = r["train_gold"]
    print("  training gold by step: " + ", ".join(f"{s}:{g:.2f}" for s, g in curve[:: max(1, len(curve) // 8)]))
    print("  CPU / wall s: " + ", ".join(f"{k} {v[0]:.0f}/{v[1]:.0f}" for k, v in r["times"].items()))


if __name__ == "__main__":
    main()
