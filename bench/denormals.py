"""Denormal floats: what flushing them (``omnigym.optim.flush_denormals``, set for every run by
``process.run_scope``) saves, against torch.optim.Adam as CleanRL and Stable-Baselines3 run it.

Adam's second moment of a parameter whose gradient went to zero (a dead ReLU unit) decays by
beta2 = 0.999 a step and spends about 16,000 steps below float32's normal range (1.2e-38), where
the CPU's arithmetic is many times slower. Two measurements, alternated ``--repeats`` times,
median reported, one torch thread:

step  one optimizer step on a 4-256-256-2 ReLU network (omnigym DQN's on CartPole) whose Adam
      state sits in that range, as a dead unit's does: torch.optim.Adam (fused, as the anchors
      may pick it; their default is foreach) and omnigym's optim.Adam, each with denormals
      kept and flushed;
dqn   ``omnigym train dqn`` on CartPole-v1 (``--steps``, seed 1) with the flush on (omnigym as it
      ships) and off (``flush_denormals`` replaced by a no-op), and whether the two runs'
      metrics are identical.

    OMP_NUM_THREADS=1 python bench/denormals.py [--steps 20000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import omnigym.process
from omnigym.algos.control import dqn
from omnigym.optim import Adam, flush_denormals


def network() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 2))


def step_time(make_optimizer, flush: bool, steps: int = 300) -> float:
    """Microseconds per step with every Adam moment at a dead unit's denormal value."""
    net = network()
    optimizer = make_optimizer(net.parameters())
    net(torch.randn(32, 4)).sum().backward()
    optimizer.step()
    for p in net.parameters():  # a dead unit: no gradient, the moments decayed into the denormal range
        p.grad.zero_()
        optimizer.state[p]["exp_avg"].fill_(1e-41)
        optimizer.state[p]["exp_avg_sq"].fill_(1e-40)
    flush_denormals(flush)
    try:
        start = time.perf_counter()
        for _ in range(steps):
            optimizer.step()
        return (time.perf_counter() - start) / steps * 1e6
    finally:
        flush_denormals(False)


def dqn_run(steps: int, flush: bool, out: Path) -> tuple[float, list[dict]]:
    real = omnigym.process.flush_denormals
    if not flush:
        omnigym.process.flush_denormals = lambda on=True: None
    try:
        start = time.perf_counter()
        dqn.train(dqn.DQNConfig(total_timesteps=steps, run_dir=str(out), overwrite=True, progress=False, plot=False,
                                tensorboard=False, seed=1))
        seconds = time.perf_counter() - start
    finally:
        omnigym.process.flush_denormals = real
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    return seconds, [{k: v for k, v in r.items() if not k.startswith(("perf", "time"))} for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20_000, help="DQN env steps per run")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.steps < 1000 or args.repeats < 1:
        parser.error("--steps must be at least 1000 (DQN's learning starts) and --repeats at least 1")
    torch.set_num_threads(1)
    optimizers = {"torch.optim.Adam (fused)": lambda p: torch.optim.Adam(p, 1e-3, fused=True),
                  "torch.optim.Adam (foreach)": lambda p: torch.optim.Adam(p, 1e-3, foreach=True),
                  "omnigym optim.Adam": lambda p: Adam(p, 1e-3)}
    times: dict[tuple[str, bool], list[float]] = {}
    runs: dict[bool, list[float]] = {True: [], False: []}
    metrics: dict[bool, list[dict]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            for name, make in optimizers.items():
                for flush in (False, True):
                    times.setdefault((name, flush), []).append(step_time(make, flush))
            for flush in (False, True):
                seconds, metrics[flush] = dqn_run(args.steps, flush, Path(scratch) / f"dqn-{flush}")
                runs[flush].append(seconds)
            print(f"repeat {repeat + 1}: dqn off {runs[False][-1]:.1f} s, on {runs[True][-1]:.1f} s  "
                  f"(load {' '.join(f'{x:.1f}' for x in os.getloadavg())})", flush=True)
    print("\nAdam step with a dead unit's state (median us):")
    for name in optimizers:
        kept, flushed = statistics.median(times[(name, False)]), statistics.median(times[(name, True)])
        print(f"  {name:28s} denormals kept {kept:8.0f}   flushed {flushed:6.0f}   ratio {kept / flushed:5.1f}x")
    off, on = statistics.median(runs[False]), statistics.median(runs[True])
    print(f"\nomnigym train dqn, CartPole-v1, {args.steps} steps (median s): flush off {off:.1f}, on {on:.1f}: "
          f"{off / on:.2f}x; metrics identical: {metrics[False] == metrics[True]}")


if __name__ == "__main__":
    main()
