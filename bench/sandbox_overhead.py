"""Seconds per judged program: omnigym's ``code`` reward vs a bare subprocess, same programs.

Each HumanEval canonical solution (``../shared/data/humaneval``; without it, 60 small
generated tasks) is judged three ways, alternating, in one run:

- **omnigym**: ``get_reward("code")``, the judge in the sandbox (bubblewrap where installed);
- **bare**: prompt + solution + test + ``check(...)`` in ``python -I -S -c``, no isolation,
  no limits: the floor any harness that starts a process per program pays;
- **before** (with ``--before SRC``): another checkout's ``src`` (e.g. a worktree of an older
  commit) judging the same programs in a fresh process, to measure a change.

The trainer process has torch imported, as in training (spawning from a large process is
part of the cost). Run on a quiet machine; prints seconds per program and the ratios.

    python bench/sandbox_overhead.py [--reps 3] [--before /tmp/old/src] [--humaneval PATH]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HUMANEVAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "humaneval" / "HumanEval.jsonl.gz"

TIME_IN_PROCESS = """
import json, sys, time
import torch  # a trainer-sized process
from omnigym.rewards import get_reward
rows = json.load(sys.stdin)
code = get_reward("code")
start = time.perf_counter()
scores = code([r["prompt"] + r["canonical_solution"] for r in rows], rows)
print(json.dumps({"seconds": time.perf_counter() - start, "passed": float(scores.sum())}))
"""


def programs(data: Path = HUMANEVAL) -> tuple[str, list[dict]]:
    if data.exists():
        with gzip.open(data, "rt") as f:
            return "HumanEval (164 canonical solutions)", [json.loads(line) for line in f]
    rows = [{"prompt": f"def f{i}(x):\n", "canonical_solution": f"    return x * {i} + 1\n", "entry_point": f"f{i}",
             "test": f"def check(candidate):\n    assert candidate(2) == {2 * i + 1}\n    assert candidate(0) == 1\n"}
            for i in range(60)]
    return "60 generated tasks (../shared/data/humaneval not found)", rows


def time_judge(rows: list[dict], src: str) -> dict:
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", TIME_IN_PROCESS], input=json.dumps(rows), env=env,
                         capture_output=True, text=True, check=True, cwd="/")
    return json.loads(out.stdout.strip().splitlines()[-1])


def time_bare(rows: list[dict]) -> dict:
    import torch  # noqa: F401  the same process size as the judge's trainer

    start, passed = time.perf_counter(), 0
    for r in rows:
        program = f"{r['prompt']}{r['canonical_solution']}\n\n{r['test']}\n\ncheck({r['entry_point']})\n"
        result = subprocess.run([sys.executable, "-I", "-S", "-c", program], capture_output=True, timeout=10)
        passed += result.returncode == 0
    return {"seconds": time.perf_counter() - start, "passed": float(passed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--before", help="another checkout's src directory to compare with")
    parser.add_argument("--humaneval", type=Path, default=HUMANEVAL, help="HumanEval.jsonl.gz (from a worktree "
                        "the default ../shared is not beside it)")
    args = parser.parse_args()
    name, rows = programs(args.humaneval)
    here = str(Path(__file__).resolve().parents[1] / "src")
    from omnigym.rewards.sandbox import isolation

    print(f"work: {name}; {isolation().line()}")
    ways = {"omnigym": lambda: time_judge(rows, here), "bare": lambda: time_bare(rows)}
    if args.before:
        ways["before"] = lambda: time_judge(rows, args.before)
    per_program = {way: [] for way in ways}
    for rep in range(args.reps):
        for way, run in ways.items():
            result = run()
            per_program[way].append(result["seconds"] / len(rows))
            print(f"rep {rep} {way:8s} {per_program[way][-1] * 1000:6.1f} ms/program  "
                  f"passed {result['passed']:.0f}/{len(rows)}", flush=True)
    median = {way: statistics.median(times) for way, times in per_program.items()}
    print("median ms/program: " + ", ".join(f"{w} {t * 1000:.1f}" for w, t in median.items()))
    print(f"omnigym / bare subprocess: {median['omnigym'] / median['bare']:.2f}x")
    if args.before:
        print(f"omnigym / before: {median['omnigym'] / median['before']:.2f}x")


if __name__ == "__main__":
    main()
