"""Per-episode asynchronous vs batch-synchronous rollouts (``--rollouts async`` vs ``sync``) on an
env whose episode lengths are heavy-tailed: samples/s, held-out success, the ratio, and the
learning curves of both side by side in one PNG.

Why this is the regime where async matters. A batch-synchronous step plays all of its
episodes turn by turn together: each turn waits for the slowest env reply of the batch, and
the step waits for the episode with the most turns. When tool latency and the number of turns
are heavy-tailed (a search that sometimes hangs, a program that sometimes runs long, a task
that sometimes needs many calls), the slowest of 32 episodes is far slower than the typical
one, so the batch spends most of its time waiting for a few. Per-episode scheduling starts the
next episode as soon as one ends and trains on the first groups that complete, so the tail
costs only the episodes in it, and sampling goes on while the trainer trains. With light
tails (every reply equally fast, every episode as long) there is little to gain: the two
schedules then do the same work.

The env (``HeavyTailEnv``): each episode takes ``T`` turns, T = min(4, floor(Pareto(1.5))) (66%
of episodes end after their first reply, 12% take four; 1.65 turns on average), and every env
reply (the tool, or the final scoring) takes ``min(3 s, 50 ms x Pareto(1.3))`` seconds: median
84 ms (about what a bare sandboxed ``print(1)`` takes on this machine, 87 ms, docs/text_env.md),
mean 167 ms, one reply in 100 over 1.8 s; the slowest of 32 replies takes 1.3 s on average.
Both are drawn from one seeded stream, the n-th episode started getting the n-th draw, so the
two schedules see the same distribution of episodes. The task: a reply succeeds when it
contains the letter "e" (keyword reward, 0 or 1), which the untrained tiny model does about
one time in four when it samples and never greedily, so GRPO has signal from the first step
without a warm-up and held-out success (greedy) starts at 0.

Honest by construction: the same env, model (the built-in tiny Llama, untrained, seed
--seed), steps, prompts x group size, learning rate, torch threads and seed for both; the
batch-synchronous generator answers a turn's env replies concurrently (in threads), so its
turn waits for the slowest reply, not for their sum; ``--concurrency`` of the async run is the
sync batch (prompts x group size), so neither has more episodes in flight. Each mode runs in
its own process, one after the other. samples/s counts the episodes trained on per second of
the steps in between (the first two and the last steps are left out: the first and last
evaluate, and the async sampler fills its first batches while the first evaluation runs).
Held-out success: greedy, on --eval-size held-out prompts (never trained on), before the
first step and after the last, through the same env.

Anchors (GPU clusters, other models and tasks; beside it for scale only): verl's fully-async
trainer 2.35-2.67x and AReaL 2.77x over synchronous.

    python bench/async_rollouts.py [--steps 20] [--seed 0] [--max-staleness 4] [--png async_rollouts.png]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial

from omnigym.envs.text import TextEnv

RESULT = "RESULT "
ANCHORS = "verl fully-async 2.35-2.67x, AReaL 2.77x over synchronous (GPU clusters)"


def heavy_tail_env(seed: int = 0, n: int = 400, max_turns: int = 4):
    """The bench's env, registered as ``heavy-tail-v0`` in each run's process."""
    from omnigym.rewards import WeightedSum

    examples = [{"question": f"Say {i}.", "answer": "-", "keywords": ["e"]} for i in range(n)]
    return HeavyTailEnv(examples, WeightedSum({"keyword": 1.0}), max_turns=max_turns, seed=seed)


class HeavyTailEnv(TextEnv):
    TURN_ALPHA, LATENCY_ALPHA, LATENCY_SCALE, MAX_LATENCY = 1.5, 1.3, 0.05, 3.0

    def __init__(self, examples, reward, max_turns: int = 4, seed: int = 0):
        super().__init__(examples, reward, None)
        self.max_turns, self.seed = max_turns, seed
        self._draws = itertools.count()  # shared by the per-episode copies: the n-th episode, the n-th draw
        self.turn, self.length, self.latencies = 0, 1, [0.0]

    def reset(self, seed=None, options=None):
        out = super().reset(seed, options)
        rng = random.Random(self.seed * 1_000_003 + next(self._draws))
        self.turn = 0
        self.length = min(self.max_turns, int(rng.paretovariate(self.TURN_ALPHA)))
        self.latencies = [min(self.MAX_LATENCY, self.LATENCY_SCALE * rng.paretovariate(self.LATENCY_ALPHA))
                          for _ in range(self.length)]
        return out

    def respond(self, text):
        time.sleep(self.latencies[self.turn])  # the tool (or the final scoring) takes its time
        self.turn += 1
        self.messages.append({"role": "assistant", "content": text})
        if self.turn >= self.length:
            return list(self.messages), True, False, {"example": self.example}
        self.messages.append({"role": "tool", "content": "ok"})
        return list(self.messages), False, False, {"example": self.example, "tool_calls": 1}


def one_run(mode: str, args) -> dict:
    """One mode in this process; prints its figures as JSON."""
    from omnigym.algos import grpo
    from omnigym.envs.text import register_text_env
    from omnigym.track.run import Run

    register_text_env("heavy-tail-v0", partial(heavy_tail_env, seed=args.seed))
    stamps, original_log = [], Run.log

    def timed_log(self, step, metrics):
        original_log(self, step, metrics)
        stamps.append((time.perf_counter(), dict(metrics)))

    Run.log = timed_log
    extra = dict(rollouts="async", max_staleness=args.max_staleness) if mode == "async" else {}
    cfg = grpo.GRPOConfig(task="heavy-tail-v0", rewards="keyword:1.0", sft_steps=0, seed=args.seed, steps=args.steps,
                          prompts_per_step=args.prompts, group_size=args.group_size, max_turns=4, max_new_tokens=16,
                          learning_rate=args.learning_rate, eval_size=args.eval_size, eval_every=args.steps,
                          checkpoint_every=args.steps, run_dir=tempfile.mkdtemp(), progress=False, plot=False,
                          tensorboard=False, **extra)
    begin = time.perf_counter()
    grpo.train(cfg)
    wall = time.perf_counter() - begin
    rows = [m for _, m in stamps]
    intervals = [b[0] - a[0] for a, b in zip(stamps, stamps[1:])][1:-1]  # steps 3 .. n-1
    per_step = cfg.prompts_per_step * cfg.group_size
    accuracy = [m["eval/accuracy"] for m in rows if "eval/accuracy" in m]
    out = {"mode": mode, "samples_per_s": per_step * len(intervals) / sum(intervals), "wall_seconds": wall,
           "step_seconds": statistics.mean(intervals), "success_before": accuracy[0], "success_after": accuracy[-1],
           "reward": [m["reward/mean"] for m in rows], "time": [t - stamps[0][0] for t, _ in stamps],
           "turns": statistics.mean(m["episode/turns"] for m in rows),
           "length_p90": statistics.mean(m["episode/length_p90"] for m in rows)}
    if mode == "async":
        out.update(staleness_mean=statistics.mean(m["rollout/staleness_mean"] for m in rows),
                   dropped_stale=sum(m["rollout/dropped_stale"] for m in rows))
    print(RESULT + json.dumps(out), flush=True)
    return out


def draw(runs: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for r in runs:
        label = f"{r['mode']} ({r['samples_per_s']:.0f} samples/s)"
        by_step.plot(range(1, len(r["reward"]) + 1), r["reward"], label=label)
        by_time.plot(r["time"], r["reward"], label=label)
    by_step.set(xlabel="GRPO step", ylabel="mean sampled reward", title="per step")
    by_time.set(xlabel="seconds since the first step", ylabel="mean sampled reward", title="per second")
    for ax in (by_step, by_time):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--max-staleness", type=int, default=4, help="--max-staleness of the async run")
    parser.add_argument("--eval-size", type=int, default=64, help="held-out prompts")
    parser.add_argument("--png", default="async_rollouts.png", help="where the learning curves go")
    parser.add_argument("--one", choices=("sync", "async"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("steps", "prompts", "eval_size", "max_staleness"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.steps < 5:
        parser.error(f"--steps must be at least 5 (the first two and the last steps are not timed), got {args.steps}")
    if args.group_size < 2:
        parser.error(f"--group-size must be at least 2, got {args.group_size}")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.png))):
        parser.error(f"--png {args.png}: its folder does not exist")
    if args.one:
        one_run(args.one, args)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    runs = []
    for mode in ("sync", "async"):
        flags = ["--steps", str(args.steps), "--seed", str(args.seed), "--prompts", str(args.prompts),
                 "--group-size", str(args.group_size), "--learning-rate", str(args.learning_rate),
                 "--max-staleness", str(args.max_staleness), "--eval-size", str(args.eval_size)]
        done = subprocess.run([sys.executable, __file__, "--one", mode, *flags], env=env, capture_output=True,
                              text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
        if done.returncode != 0 or not lines:
            sys.exit(f"{mode} failed:\n{done.stderr[-3000:]}")
        runs.append(json.loads(lines[-1][len(RESULT):]))
        r = runs[-1]
        print(f"{mode:6} {r['samples_per_s']:7.1f} samples/s  {r['wall_seconds']:6.1f} s in all  held-out success "
              f"{r['success_before']:.3f} -> {r['success_after']:.3f}", flush=True)
    sync, asyn = runs
    ratio = asyn["samples_per_s"] / sync["samples_per_s"]
    e = HeavyTailEnv
    print(f"\n{args.steps} GRPO steps x {args.prompts} prompts x {args.group_size} episodes, tiny model, seed "
          f"{args.seed}, heavy-tailed env (turns ~ Pareto({e.TURN_ALPHA}) up to 4, reply latency ~ "
          f"{1000 * e.LATENCY_SCALE:.0f} ms x Pareto({e.LATENCY_ALPHA}) up to {e.MAX_LATENCY:.0f} s), async "
          f"--max-staleness {args.max_staleness}")
    print("| rollouts | samples/s | s/step | held-out success before -> after | turns/episode | mean staleness |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['mode']} | {r['samples_per_s']:.1f} | {r['step_seconds']:.2f} | {r['success_before']:.3f} -> "
              f"{r['success_after']:.3f} | {r['turns']:.2f} | {r.get('staleness_mean', 0.0):.2f} |")
    print(f"\nasync / sync samples/s: {ratio:.2f}x   (anchors: {ANCHORS})")
    if asyn.get("dropped_stale"):
        print(f"async dropped {asyn['dropped_stale']:.0f} groups older than --max-staleness {args.max_staleness}")
    draw(runs, args.png, f"async / sync = {ratio:.2f}x samples/s; held-out success sync {sync['success_after']:.2f}, "
                         f"async {asyn['success_after']:.2f} after {args.steps} steps")
    print(f"curves: {args.png}")


if __name__ == "__main__":
    main()
