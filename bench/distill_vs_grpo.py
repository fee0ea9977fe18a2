"""The distillation demo against GRPO on the same student: the figures in docs/distillation.md.

For each seed: ``omnigym train distill --seed N`` with no other flag but ``--steps`` and
``--eval-every`` (the offline demo: the GRPO demo's model as the teacher, the "tiny-small"
student warmed up as GRPO's demo model is), then ``omnigym train grpo`` on the *same* warmed-up
student (``--model RUN/stages/warmup/model --sft-steps 0 --system-prompt ''``: the demo's own
prompt, no system message) with GRPO's defaults.

Compute is counted from each run's first step on, held-out evaluations left out (both runs
evaluate the same 500 problems on the same schedule): this process's CPU seconds, wall seconds,
and the tokens the student sampled (the teacher's forward pass over them is in distillation's
seconds). Prints each run's accuracy curve with that compute, then the compute each run took
to first reach the teacher's accuracy and the accuracy distillation ended with (or "not reached").

    python bench/distill_vs_grpo.py [--seeds 1 2] [--steps 200] [--grpo-steps 200] [--eval-every 25]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


class Meter:
    """CPU and wall seconds since a run's loop began (``Run.begin``) less the time in held-out
    evaluation (the trainers' ``accuracy``), at every logged row."""

    def __init__(self):
        self.start = (0.0, 0.0)
        self.evaluating = [0.0, 0.0]

    @staticmethod
    def now() -> tuple[float, float]:
        return time.process_time(), time.perf_counter()

    def begin(self) -> None:
        self.start, self.evaluating = self.now(), [0.0, 0.0]

    def timed(self, accuracy):
        def wrapped(*args, **kwargs):
            before = self.now()
            try:
                return accuracy(*args, **kwargs)
            finally:
                after = self.now()
                self.evaluating = [self.evaluating[i] + after[i] - before[i] for i in (0, 1)]
        return wrapped

    def elapsed(self) -> dict:
        now = self.now()
        return {"bench/cpu_seconds": now[0] - self.start[0] - self.evaluating[0],
                "bench/wall_seconds": now[1] - self.start[1] - self.evaluating[1]}


def install(meter: Meter) -> None:
    """The meter around every run of this process: its start at ``Run.begin``, its seconds in each
    ``Run.log`` row (a teacher trained as a stage begins and logs before the student's run does)."""
    from omnigym.algos.lm import distill, grpo
    from omnigym.track.run import Run

    begin, log = Run.begin, Run.log

    def metered_begin(self, *args, **kwargs):
        out = begin(self, *args, **kwargs)
        meter.begin()
        return out

    def metered_log(self, step, values):
        return log(self, step, {**values, **meter.elapsed()})

    Run.begin, Run.log = metered_begin, metered_log
    distill.accuracy, grpo.accuracy = meter.timed(distill.accuracy), meter.timed(grpo.accuracy)


def curve(run_dir: Path, replies_per_step: int) -> list[dict]:
    """Each evaluation: its step, accuracy, and the seconds and sampled tokens up to it."""
    from omnigym.track.files import read_metrics

    points, tokens = [], 0.0
    for row in read_metrics(run_dir):
        tokens += row.get("completion/length", 0.0) * replies_per_step
        if "eval/accuracy" in row:
            points.append({"step": row["global_step"], "accuracy": row["eval/accuracy"], "tokens": tokens,
                           "cpu": row.get("bench/cpu_seconds", 0.0), "wall": row.get("bench/wall_seconds", 0.0)})
    return points


def reach(points: list[dict], target: float) -> str:
    hit = next((p for p in points if p["accuracy"] >= target), None)
    if hit is None:
        return f"not reached in {points[-1]['step']} steps ({points[-1]['cpu']:.0f} s CPU)"
    return (f"step {hit['step']}: {hit['cpu']:.0f} s CPU, {hit['wall']:.0f} s wall, "
            f"{hit['tokens'] / 1e3:.0f}k sampled tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=200, help="distillation steps")
    parser.add_argument("--grpo-steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--root", default=None, help="where the runs go (default: a temporary folder); a finished "
                                                     "run there is read, not trained again")
    args = parser.parse_args()

    from omnigym.algos.lm import distill, grpo

    meter = Meter()
    install(meter)
    root = Path(args.root or tempfile.mkdtemp(prefix="omnigym-distill-demo-"))
    quiet = dict(progress=False, plot=False, tensorboard=False)
    for seed in args.seeds:
        student_dir, grpo_dir = root / f"distill-{seed}", root / f"grpo-{seed}"
        if not (student_dir / "model").is_dir():
            # an unfinished run there starts again, keeping the stages it finished (--overwrite)
            distill.train(distill.DistillConfig(seed=seed, run_dir=str(student_dir), steps=args.steps,
                                                eval_every=args.eval_every, overwrite=student_dir.exists(), **quiet))
        if not (grpo_dir / "model").is_dir():
            grpo.train(grpo.GRPOConfig(model=str(student_dir / "stages" / "warmup" / "model"), sft_steps=0,
                                       system_prompt="", seed=seed, run_dir=str(grpo_dir), steps=args.grpo_steps,
                                       eval_every=args.eval_every, overwrite=grpo_dir.exists(), **quiet))
        d_cfg, g_cfg = distill.DistillConfig(), grpo.GRPOConfig()
        ours = curve(student_dir, d_cfg.prompts_per_step * d_cfg.samples_per_prompt)
        theirs = curve(grpo_dir, g_cfg.prompts_per_step * g_cfg.group_size)
        teacher = curve(student_dir / "stages" / "teacher", g_cfg.prompts_per_step * g_cfg.group_size)
        print(f"seed {seed}: teacher (GRPO demo) held-out accuracy {teacher[0]['accuracy']:.3f} -> "
              f"{teacher[-1]['accuracy']:.3f}")
        for name, points in (("distill", ours), ("GRPO", theirs)):
            print(f"  {name}: " + ", ".join(f"{p['step']}: {p['accuracy']:.3f} ({p['cpu']:.0f} s)" for p in points))
        for target, what in ((teacher[-1]["accuracy"], "the teacher's"), (ours[-1]["accuracy"], "distillation's last")):
            print(f"  to {target:.3f} ({what}): distill {reach(ours, target)}; GRPO {reach(theirs, target)}")


if __name__ == "__main__":
    main()
