"""Offline -> online against SAC from scratch, at equal online env steps, on Pendulum-v1 (or a dataset you have).

    python bench/offline_to_online.py [--seeds 1 2] [--offline-steps 10000] [--online-steps 5000] [--out runs/o2o]
    python bench/offline_to_online.py --report-only --out runs/o2o     # the table and figure of runs made already
    python bench/offline_to_online.py --dataset halfcheetah/medium-v0 --methods iql --hidden 256 256 \
        --offline-steps 20000 --online-steps 10000 --eval-every 2000 --eval-episodes 10 --sac-learning-starts 5000

``--dataset NAME`` uses a Minari dataset that exists already (found under MINARI_DATASETS_PATH; SAC
from scratch plays the env it names) instead of making ``pendulum/medium-v0`` in ``--out``.

Steps (``omnigym`` commands, one after another, each seed in turn):

1. the dataset, D4RL's "medium" recipe: a 3000-step SAC run (1000 random steps, seed 0), 20 sampled
   episodes of it collected into ``pendulum/medium-v0`` (``--ref-max-score -150``: a swung-up
   pendulum's return; the random reference measured over 20 episodes);
2. per seed: Cal-QL (``cql --calibrated``) and IQL offline for ``--offline-steps`` gradient steps,
   each continued with ``--resume-online ... --online-steps N`` (Cal-QL twice: with CORL's actor
   learning rate 3e-5 and with the Cal-QL paper's 1e-4); SAC from scratch for the same N env steps
   (``--learning-starts 1000``). All ``--hidden 64 64``, CORL's other defaults.

Out: a markdown table (offline score, the online run's greedy score at its start and end, the mean
normalized return of the training episodes in the last 1000 steps) and a figure of the training
episodes' normalized return per 1000 online steps (mean and min-max over seeds).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

BIN = 1000
PENDULUM = "pendulum/medium-v0"
METHODS = {  # name: (algorithm, offline flags, online flags, the offline run it continues)
    "calql": ("cql", ["--calibrated"], [], "calql"),
    "calqlfast": ("cql", None, ["--policy-lr", "1e-4"], "calql"),  # the Cal-QL paper's actor learning rate online
    "iql": ("iql", [], [], "iql"),
}
LABELS = {"calql": "Cal-QL offline -> online", "calqlfast": "Cal-QL, online actor lr 1e-4",
          "iql": "IQL offline -> online", "sac": "SAC from scratch"}


def omnigym(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "omnigym.cli", *args, "--no-progress", "--no-plot"], check=True,
                   stdout=subprocess.DEVNULL)


def make_runs(out: Path, args) -> None:
    seeds, offline_steps, online_steps = args.seeds, args.offline_steps, args.online_steps
    if args.dataset == PENDULUM:
        os.environ["MINARI_DATASETS_PATH"] = str(out / "datasets")
    if args.dataset == PENDULUM and not (out / "datasets" / "pendulum" / "medium-v0").is_dir():
        omnigym("train", "sac", "--env-id", "Pendulum-v1", "--total-timesteps", "3000", "--learning-starts", "1000",
                "--seed", "0", "--run-dir", str(out / "sac-medium"))
        subprocess.run([sys.executable, "-m", "omnigym.cli", "collect", str(out / "sac-medium"), "--episodes", "20",
                        "--dataset", "pendulum/medium-v0", "--ref-max-score", "-150", "--reference-episodes", "20"],
                       check=True)
    small = ["--hidden", *map(str, args.hidden)]
    evals = ["--eval-every", str(args.eval_every), "--eval-episodes", str(args.eval_episodes)]
    for seed in seeds:
        for name in args.methods:
            algo, offline_flags, online_flags, source = METHODS[name]
            offline = str(out / f"{source}-off-{seed}")
            if offline_flags is not None and not (Path(offline) / "model").exists() and \
                    not (Path(offline) / "checkpoint.pt").exists():
                omnigym("train", algo, *offline_flags, "--dataset", args.dataset, "--total-timesteps",
                        str(offline_steps), "--eval-every", str(offline_steps), "--log-every", "1000", "--seed",
                        str(seed), "--run-dir", offline, *small)
            omnigym("train", algo, "--resume-online", offline, "--online-steps", str(online_steps), *online_flags,
                    *evals, "--log-every", "250", "--seed", str(seed), "--run-dir", str(out / f"{name}-on-{seed}"))
        omnigym("train", "sac", "--env-id", dataset_env(args.dataset), "--total-timesteps", str(online_steps),
                "--learning-starts", str(args.sac_learning_starts), "--seed", str(seed), "--run-dir",
                str(out / f"sac-{seed}"), *small)


def dataset_env(name: str) -> str:
    from omnigym.offline.datasets import dataset_env_id, open_dataset

    return dataset_env_id(open_dataset(name))


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in open(run_dir / "metrics.jsonl")]


def normalized(returns, refs) -> np.ndarray:
    return 100.0 * (np.asarray(returns, dtype=float) - refs[0]) / (refs[1] - refs[0])


def episode_curve(run_dir: Path, steps: int, refs) -> list[float]:
    """Mean normalized return of the training episodes that ended in each ``BIN`` of steps."""
    episodes = [(r["global_step"], r["charts/episodic_return"]) for r in rows(run_dir) if "charts/episodic_return" in r]
    return [float(np.mean(normalized([ret for step, ret in episodes if start < step <= start + BIN], refs)))
            for start in range(0, steps, BIN)]


def report(out: Path, args) -> str:
    seeds, steps = args.seeds, args.online_steps
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if args.dataset == PENDULUM:
        os.environ["MINARI_DATASETS_PATH"] = str(out / "datasets")
    from omnigym.offline.datasets import open_dataset

    metadata = open_dataset(args.dataset).storage.metadata
    refs = metadata["ref_min_score"], metadata["ref_max_score"]
    lines = ["| method | seed | offline score | online start (step 0) | online end | training episodes, last "
             f"{BIN} steps |", "|---|---|---|---|---|---|"]
    x = np.arange(BIN, steps + 1, BIN)
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in [*args.methods, "sac"]:
        curves = []
        for seed in seeds:
            run = out / (f"sac-{seed}" if name == "sac" else f"{name}-on-{seed}")
            curves.append(episode_curve(run, steps, refs))
            if name == "sac":
                lines.append(f"| {LABELS[name]} | {seed} | — | — | — | {curves[-1][-1]:.1f} |")
                continue
            offline = [r for r in rows(out / f"{METHODS[name][3]}-off-{seed}") if "eval/normalized_score" in r][-1]
            evals = [r for r in rows(run) if "eval/normalized_score" in r]
            lines.append(f"| {LABELS[name]} | {seed} | {offline['eval/normalized_score']:.1f} | "
                         f"{evals[0]['eval/normalized_score']:.1f} | {evals[-1]['eval/normalized_score']:.1f} | "
                         f"{curves[-1][-1]:.1f} |")
        curves = np.array(curves)
        ax.plot(x, curves.mean(0), label=LABELS[name])
        ax.fill_between(x, curves.min(0), curves.max(0), alpha=0.2)
    ax.set_xlabel("online env steps")
    ax.set_ylabel("normalized return of training episodes")
    ax.set_title(f"{dataset_env(args.dataset)}, {args.dataset}, {len(seeds)} seeds (mean, min-max)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "offline_to_online.png", dpi=100)
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--offline-steps", type=int, default=10_000)
    parser.add_argument("--online-steps", type=int, default=5_000)
    parser.add_argument("--out", default="runs/o2o")
    parser.add_argument("--dataset", default=PENDULUM, help="a Minari dataset that exists (default: make "
                                                            f"{PENDULUM} in --out)")
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--eval-every", type=int, default=500, help="online steps between greedy evaluations")
    parser.add_argument("--eval-episodes", type=int, default=5)
    parser.add_argument("--sac-learning-starts", type=int, default=1000)
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    if not args.report_only:
        make_runs(out, args)
    print(report(out, args))
    print(f"figure: {out / 'offline_to_online.png'}")


if __name__ == "__main__":
    main()
