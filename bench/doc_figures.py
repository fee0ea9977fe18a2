"""Re-derive the docs' cheap figures: run each figure's documented command and compare.

A figure in README.md or docs/ names the command, seed and commit that produced it (issue 40).
This script holds the figures that are cheap to make again (a few minutes at most on one core)
in ``ROWS``: the doc, a regex that reads the doc's figure from the page as it stands, the
command as the doc gives it, and where the run's ``metrics.jsonl`` holds the number (the first
or last row with a key). It runs each command into ``--out DIR/NAME`` (``--run-dir``, plus
``--no-progress --no-plot --no-tensorboard``, which change no figure) with one thread, and
prints per figure the doc's value, the measured one and OK or DIFF (outside the row's
tolerance). Exit 1 when a figure differs: the doc, or the code, needs a look.

    python bench/doc_figures.py --list                 # the rows and the doc's figures, nothing run
    python bench/doc_figures.py --only sft_builtin     # one row (repeat --only for more)
    python bench/doc_figures.py                        # every row (about 15 minutes on one core)

The figures are CPU runs: same seed, same metrics on one machine, but another CPU's kernels
(AVX2 against AVX-512) round differently and a long RL run then follows another path, so a DIFF
on another machine says "not this machine's number", not "wrong". ``tests/test_doc_figures.py``
checks, without training, that each regex still finds its figure and each command parses.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["--no-progress", "--no-plot", "--no-tensorboard"]


@dataclass(frozen=True)
class Figure:
    label: str
    pattern: str
    """a regex whose one group is the doc's number (it must match the page exactly once)"""
    metric: str
    """the key in the run's metrics.jsonl"""
    which: str
    """"first" or "last": the first or the last row that has the key"""
    tolerance: float
    """largest absolute difference still OK (the doc rounds; the rest is the machine)"""


@dataclass(frozen=True)
class Row:
    name: str
    doc: str
    command: str
    """as the doc gives it (seed written out), starting with ``omnigym train``"""
    figures: tuple[Figure, ...]
    minutes: float
    """about how long it ran here, one thread on the shared 2-core machine"""


ROWS = (
    Row("sft_builtin", "docs/sft.md", "omnigym train sft --steps 100 --seed 1", (
        Figure("held-out loss at the start", r"held-out loss\s+([\d.]+) →", "eval/loss", "first", 0.005),
        Figure("held-out loss after 100 steps", r"held-out loss\s+[\d.]+ → ([\d.]+)", "eval/loss", "last", 0.005),
    ), 1.0),
    Row("reinforce_cartpole", "docs/reinforce.md", "omnigym train reinforce --total-timesteps 100000 --seed 1", (
        Figure("last-20 mean return", r"seed 1 ends with a last-20 mean return of ([\d.]+)", "charts/return_last_20",
               "last", 0.05),
    ), 1.5),
    Row("dqn_cartpole", "docs/dqn.md", "omnigym train dqn --total-timesteps 50000 --seed 1", (
        Figure("last-20 mean return", r"seed 1 ends with a last-20 mean return of ([\d.]+)", "charts/return_last_20",
               "last", 0.05),
    ), 3.0),
    Row("ppo_inverted_pendulum", "docs/mujoco.md",
        "omnigym train ppo --env-id InvertedPendulum-v5 --total-timesteps 30000 --seed 1", (
            Figure("last-20 mean return", r"the last 20: ([\d.]+), rising", "charts/return_last_20", "last", 0.05),
        ), 2.0),
    Row("online_dpo_demo", "docs/online_dpo.md", "omnigym train online_dpo --seed 1", (
        Figure("gold reward before", r"seed 1, gold ([\d.]+) ->", "eval/gold_reward", "first", 0.0005),
        Figure("gold reward after 100 steps", r"seed 1, gold [\d.]+ -> \*\*([\d.]+)\*\*", "eval/gold_reward", "last",
               0.0005),
        Figure("KL to the SFT policy (nats)", r"seed 1, gold [\d.]+ -> \*\*[\d.]+\*\* at KL ([\d.]+)", "eval/kl",
               "last", 0.005),
    ), 4.0),
    Row("alphazero_tic_tac_toe", "docs/alphazero.md",
        "omnigym train alphazero --env-id openspiel/tic_tac_toe --iterations 40 --eval-games 40 --seed 1", (
            Figure("score vs OpenSpiel's MCTS before training", r"\| 1 \| ([\d.]+) \|", "eval/vs_mcts/score", "first",
                   0.01),
            Figure("score vs OpenSpiel's MCTS after 640 games", r"\| 1 \| (?:[\d.]+ \| ){4}([\d.]+) \|",
                   "eval/vs_mcts/score", "last", 0.01),
    ), 2.0),
)


def doc_value(figure: Figure, text: str) -> float:
    """The doc's number for ``figure``; ValueError unless the regex matches exactly once."""
    found = re.findall(figure.pattern, text)
    if len(found) != 1:
        raise ValueError(f"{figure.label}: /{figure.pattern}/ matches {len(found)} times, not once")
    return float(found[0])


def metric(run_dir: Path, figure: Figure) -> float:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    values = [row[figure.metric] for row in rows if figure.metric in row]
    if not values:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} has no {figure.metric}")
    return float(values[0] if figure.which == "first" else values[-1])


def argv(row: Row, run_dir: Path) -> list[str]:
    """The doc's command, with the venv's omnigym and this script's run directory and quiet flags."""
    words = shlex.split(row.command)
    return [str(Path(sys.executable).with_name("omnigym")), *words[1:], "--run-dir", str(run_dir), *QUIET]


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "src"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return out.stdout.strip() + (" (src/ has uncommitted changes)" if dirty else "")


def run_row(row: Row, out: Path) -> list[tuple[Figure, float, float | None, str]]:
    """Train the row's command once; each figure with its doc value, measured value and verdict."""
    text = (ROOT / row.doc).read_text()
    run_dir = out / row.name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    done = subprocess.run(argv(row, run_dir), cwd=out, env=env, capture_output=True, text=True)
    print(f"{row.name}: {row.command}  ({time.perf_counter() - started:.0f} s, exit {done.returncode})", flush=True)
    results = []
    for figure in row.figures:
        expected = doc_value(figure, text)
        if done.returncode != 0:
            results.append((figure, expected, None, "FAILED"))
            continue
        measured = metric(run_dir, figure)
        verdict = "OK" if abs(measured - expected) <= figure.tolerance else "DIFF"
        results.append((figure, expected, measured, verdict))
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
    return results


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print the rows and the docs' figures; run nothing")
    parser.add_argument("--only", action="append", metavar="NAME", help="run this row (repeat for more)")
    parser.add_argument("--out", help="keep the runs in this folder (default: a temporary one, removed)")
    opts = parser.parse_args(args)
    names = {row.name for row in ROWS}
    unknown = sorted(set(opts.only or ()) - names)
    if unknown:
        parser.error(f"no row {', '.join(unknown)}; the rows: {', '.join(sorted(names))}")
    rows = [row for row in ROWS if not opts.only or row.name in opts.only]
    if opts.list:
        for row in rows:
            text = (ROOT / row.doc).read_text()
            print(f"{row.name} ({row.doc}, about {row.minutes:g} min): {row.command}")
            for figure in row.figures:
                print(f"    {figure.label}: doc {doc_value(figure, text):g} <- {figure.which} {figure.metric} "
                      f"(± {figure.tolerance:g})")
        return 0
    print(f"commit {commit()}")
    with tempfile.TemporaryDirectory(prefix="doc_figures_") as scratch:
        out = Path(opts.out).resolve() if opts.out else Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        differ = False
        for row in rows:
            for figure, expected, measured, verdict in run_row(row, out):
                shown = "-" if measured is None else f"{measured:.4g}"
                print(f"  {verdict:6} {row.name} / {figure.label}: doc {expected:g}, measured {shown}")
                differ |= verdict != "OK"
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
