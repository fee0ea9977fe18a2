"""DrQ from pixels on cartpole swingup beside the published DrQ curve (docs/pixels.md).

Reads the episodes of a ``bench/long_runs.py drq-cartpole`` log and draws them (each episode,
and a 10-episode mean) against frames, with DrQ's own evaluation returns at the same frames
(mean +- std over its 10 seeds, from the authors' data file ``data/dmc_planet_bench.csv`` in
github.com/denisyarats/drq, the runs behind Table 1 of Kostrikov, Yarats & Fergus 2020) and a
uniformly random policy's return (``bench/random_policy.py``).

    python bench/pixels_vs_drq.py bench/.cache/long_runs/drq-cartpole-seed1.log --random 141.1 70.5
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np

EPISODE = re.compile(r"global_step=(\d+), episodic_return=([-\d.e+]+)")
DRQ_CARTPOLE = {  # frames: (mean, std) of DrQ's evaluation return over 10 seeds, batch 512, 84 x 84
    0: (17.8, 7.6), 16_000: (182.0, 45.7), 32_000: (274.4, 24.0), 48_000: (359.9, 53.5), 64_000: (450.4, 57.3),
    80_000: (660.5, 133.9), 96_000: (759.4, 87.8), 112_000: (831.3, 34.0),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path)
    parser.add_argument("--random", type=float, nargs=2, metavar=("MEAN", "STD"), required=True)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "img" /
                        "drq_cartpole_pixels.png")
    args = parser.parse_args()
    episodes = [(int(s), float(r)) for s, r in EPISODE.findall(args.log.read_text())]
    if not episodes:
        parser.error(f"{args.log} holds no episodes (global_step=..., episodic_return=...)")
    frames, returns = (np.array(x) for x in zip(*episodes))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    last = frames[-1]
    ax.axhspan(args.random[0] - args.random[1], args.random[0] + args.random[1], color="grey", alpha=0.2,
               label=f"random policy {args.random[0]:.0f} +- {args.random[1]:.0f}")
    ax.plot(frames, returns, color="tab:blue", alpha=0.25, linewidth=0.7)
    if len(returns) >= 10:
        mean = np.convolve(returns, np.ones(10) / 10, mode="valid")
        ax.plot(frames[9:], mean, color="tab:blue", linewidth=1.8, label="omnigym drq, training episodes (10-ep. mean)")
    drq = [(f, m, s) for f, (m, s) in DRQ_CARTPOLE.items() if f <= max(last, 16_000) + 16_000]
    f, m, s = (np.array(x) for x in zip(*drq))
    ax.errorbar(f, m, yerr=s, color="tab:orange", marker="o", capsize=3,
                label="DrQ (paper's runs, 10 seeds, eval returns)")
    ax.set_xlabel("frames (agent steps x action repeat 8)")
    ax.set_ylabel("episode return")
    ax.set_title("cartpole swingup from 64 x 64 pixels, one CPU thread", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
