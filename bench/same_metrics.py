"""Same seed, same metrics: every algorithm's metrics on small fixed workloads, to compare two commits row by row.

A refactor that claims to change no behaviour runs this before and after and compares:

    python bench/same_metrics.py --out before.json          # at the old commit
    python bench/same_metrics.py --out after.json           # at the new one
    python bench/same_metrics.py --compare before.json after.json

Each workload is a short run (seconds) of one algorithm with a fixed seed. Wall-clock metrics
(``perf/``, ``time/``) are left out; everything else must be equal, row by row. ``--only``
picks workloads by name. The table printed by ``--compare`` gives, per workload, the rows and
values compared and the largest difference; metric names present in one file only are listed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

QUIET = dict(progress=False, plot=False, tensorboard=False)


def read_rows(run_dir: Path) -> list[dict]:
    """The run's metrics; GRPO's warm-up stage (``stages/warmup``) first, with GRPO's steps
    counted after it, as the runs before the stage split logged them."""
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    warm_up = run_dir / "stages" / "warmup" / "metrics.jsonl"
    if warm_up.is_file():
        before = [json.loads(line) for line in open(warm_up)]
        rows = before + [{**r, "global_step": r["global_step"] + before[-1]["global_step"]} for r in rows]
    return [{k: v for k, v in r.items() if not k.startswith(("perf/", "time/"))} for r in rows]


def pairs_file(root: Path) -> Path:
    from omnigym.tasks.gold_world import label_pairs, prompts, reply

    rng = random.Random(0)
    rows = prompts(400, 0)
    path = root / "pairs.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in label_pairs(rows, [(reply(rng), reply(rng)) for _ in rows])))
    return path


def workloads(root: Path) -> dict:
    """name -> a function that trains into its run directory (a fresh one under ``root``)."""
    from omnigym.algos import dpo, dqn, grpo, ppo, reinforce, rlhf, rm, sac, sft, td3, text_reinforce

    pairs = pairs_file(root)
    reward_dir = root / "rm"

    def reward_model():
        if not (reward_dir / "model").exists():
            rm.train(rm.RMConfig(run_dir=str(reward_dir), data=str(pairs), eval_size=50, steps=20, batch_size=16,
                                 eval_every=10, learning_rate=1e-3, **QUIET))
        return reward_dir

    grpo_small = dict(sft_steps=20, sft_target_accuracy=1.1, sft_eval_every=10, steps=6, prompts_per_step=2,
                      group_size=4, eval_size=20, eval_every=3, checkpoint_every=2)
    rlhf_small = dict(data=str(pairs), steps=3, prompts_per_step=8, minibatches=2, ppo_epochs=2, eval_prompts=8,
                      eval_every=2, checkpoint_every=2, max_new_tokens=12)
    return {
        "ppo": lambda d: ppo.train(ppo.PPOConfig(run_dir=d, seed=7, total_timesteps=4096, num_envs=4, num_steps=64,
                                                 **QUIET)),
        "ppo-mujoco": lambda d: ppo.train(ppo.PPOConfig(run_dir=d, seed=7, env_id="InvertedPendulum-v5",
                                                        total_timesteps=4096, num_steps=256, num_minibatches=4,
                                                        update_epochs=2, **QUIET)),
        "dqn": lambda d: dqn.train(dqn.DQNConfig(run_dir=d, seed=7, total_timesteps=3000, learning_starts=500,
                                                 train_frequency=64, gradient_steps=8, log_every=250, buffer_size=2000,
                                                 **QUIET)),
        "reinforce": lambda d: reinforce.train(reinforce.ReinforceConfig(run_dir=d, seed=7, total_timesteps=4096,
                                                                         num_envs=4, num_steps=128, **QUIET)),
        "sac": lambda d: sac.train(sac.SACConfig(run_dir=d, seed=7, total_timesteps=1500, learning_starts=500, **QUIET)),
        "td3": lambda d: td3.train(td3.TD3Config(run_dir=d, seed=7, total_timesteps=1500, learning_starts=500, **QUIET)),
        "sft": lambda d: sft.train(sft.SFTConfig(run_dir=d, steps=20, eval_size=50, batch_size=8, eval_every=10,
                                                 **QUIET)),
        "rm": lambda d: rm.train(rm.RMConfig(run_dir=d, data=str(pairs), eval_size=50, steps=20, batch_size=16,
                                             eval_every=10, learning_rate=1e-3, **QUIET)),
        "dpo-sigmoid": lambda d: dpo.train(dpo.DPOConfig(run_dir=d, data=str(pairs), eval_size=40, steps=4,
                                                         batch_size=8, eval_every=2, **QUIET)),
        "dpo-ipo": lambda d: dpo.train(dpo.DPOConfig(run_dir=d, data=str(pairs), eval_size=40, steps=4, batch_size=8,
                                                     eval_every=2, loss="ipo", **QUIET)),
        "dpo-simpo": lambda d: dpo.train(dpo.DPOConfig(run_dir=d, data=str(pairs), eval_size=40, steps=4,
                                                       batch_size=8, eval_every=2, loss="simpo", beta=2.0, **QUIET)),
        "grpo": lambda d: grpo.train(grpo.GRPOConfig(run_dir=d, **grpo_small, **QUIET)),
        "grpo-epochs2-dr": lambda d: grpo.train(grpo.GRPOConfig(run_dir=d, **grpo_small, ppo_epochs=2,
                                                                advantage="dr_grpo", beta=0.0,
                                                                loss_aggregation="token-mean", **QUIET)),
        "grpo-tools": lambda d: grpo.train(grpo.GRPOConfig(run_dir=d, **{**grpo_small, "sft_steps": 10}, env="tools",
                                                           max_new_tokens=32, **QUIET)),
        "grpo-every-group": lambda d: grpo.train(grpo.GRPOConfig(run_dir=d, **grpo_small, skip_equal_groups=False,
                                                                 ppo_epochs=2, **QUIET)),
        "grpo-rm": lambda d: grpo.train(grpo.GRPOConfig(run_dir=d, rewards=f"rm:{reward_model()}:1.0", sft_steps=0,
                                                        steps=2, prompts_per_step=2, group_size=4, eval_size=10,
                                                        eval_every=1, **QUIET)),
        "rlhf": lambda d: rlhf.train(rlhf.RLHFConfig(run_dir=d, reward_model=str(reward_model()), target_kl=0.5,
                                                     **rlhf_small, **QUIET)),
        "rlhf-policy-init": lambda d: rlhf.train(rlhf.RLHFConfig(run_dir=d, reward_model=str(reward_model()),
                                                                 value_init="policy", whiten_rewards=True,
                                                                 **rlhf_small, **QUIET)),
        "text_reinforce": lambda d: text_reinforce.train(text_reinforce.TextReinforceConfig(
            run_dir=d, keywords="z", steps=5, **QUIET)),
    }


def collect(out: Path, only: list[str] | None) -> None:
    root = Path(tempfile.mkdtemp(prefix="same_metrics_"))
    jobs = workloads(root)
    unknown = sorted(set(only or []) - set(jobs))
    if unknown:  # refused: the scratch folder (the pairs file) goes too
        shutil.rmtree(root, ignore_errors=True)
        sys.exit(f"same_metrics.py: error: unknown workload(s) {', '.join(unknown)}; choose from {', '.join(jobs)}")
    results = {}
    for name, job in jobs.items():
        if only and name not in only:
            continue
        run_dir = root / name
        job(str(run_dir))
        # a reward named by its run directory (rm:/tmp/...): the same name in every collection
        results[name] = [{k.replace(str(root), "ROOT"): v for k, v in row.items()} for row in read_rows(run_dir)]
        print(f"{name}: {len(results[name])} rows", flush=True)
    out.write_text(json.dumps(results))
    print(f"wrote {out}")


def difference(a, b) -> float:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if math.isnan(a) and math.isnan(b):
            return 0.0
        return abs(a - b)
    return 0.0 if a == b else math.inf


def compare(before: Path, after: Path) -> bool:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    same = True
    print(f"{'workload':<18} {'rows':>9} {'values':>7} {'max |diff|':>11}  metrics in one file only")
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"{name:<18} only in {'before' if name in a else 'after'}")
            same = False
            continue
        rows_a, rows_b = a[name], b[name]
        largest, values, only_one = 0.0, 0, set()
        for ra, rb in zip(rows_a, rows_b):
            only_one |= set(ra) ^ set(rb)
            for key in set(ra) & set(rb):
                values += 1
                largest = max(largest, difference(ra[key], rb[key]))
        rows = f"{len(rows_a)}/{len(rows_b)}"
        same &= largest == 0 and not only_one and len(rows_a) == len(rows_b)
        print(f"{name:<18} {rows:>9} {values:>7} {largest:>11.3g}  {', '.join(sorted(only_one)) or '-'}")
    print("identical" if same else "DIFFERENT")
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write every workload's metrics here")
    parser.add_argument("--only", nargs="+", help="workload names (default: all)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if bool(args.out) == bool(args.compare):
        parser.error("give --out FILE (collect) or --compare BEFORE AFTER")
    if args.compare:
        for path in args.compare:
            if not path.is_file():
                parser.error(f"--compare: {path} is not a file")
        sys.exit(0 if compare(*args.compare) else 1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    collect(args.out, args.only)


if __name__ == "__main__":
    main()
