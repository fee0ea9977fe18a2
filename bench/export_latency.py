"""Per-step latency of an exported policy: onnxruntime vs TorchScript vs eager torch.

A robot's controller runs the policy once per control step on one observation (batch 1), so
the figure that matters is the time of one call. Two policies, each the ``ExportedPolicy``
that ``omnigym export`` writes (observation normalization in float64, the network, the
action clip), written with the same functions as the command:

- locomotion-sized: 48 -> 512 -> 256 -> 128 -> 12, ELU (rsl_rl's / Isaac Lab's velocity-task actor);
- MuJoCo-sized: PPO's ``ActorCritic`` for HalfCheetah (17 -> 64 -> 64 -> 6, tanh), as trained here.

All on one thread (``torch.set_num_threads(1)``, onnxruntime ``intra_op_num_threads=1``);
each figure is the median over repeats of the mean of ``--calls`` calls.

    python bench/export_latency.py [--calls 2000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from omnigym.export import Deterministic, ExportedPolicy, write_onnx, write_torchscript
from omnigym.models.control import ActorCritic


def locomotion_policy() -> ExportedPolicy:
    widths, layers = [48, 512, 256, 128], []
    for n_in, n_out in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(n_in, n_out), nn.ELU()]
    actor = nn.Sequential(*layers, nn.Linear(widths[-1], 12))
    stats = {"mean": np.random.default_rng(0).normal(size=48), "var": np.full(48, 2.0)}
    return ExportedPolicy(actor, stats, gym.spaces.Box(-100.0, 100.0, (12,), np.float32)).eval()


def mujoco_policy() -> ExportedPolicy:
    obs_space = gym.spaces.Box(-np.inf, np.inf, (17,), np.float64)
    action_space = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
    stats = {"mean": np.zeros(17), "var": np.ones(17)}
    return ExportedPolicy(Deterministic(ActorCritic(obs_space, action_space, (64, 64)), "greedy"), stats, action_space).eval()


def per_call_us(call, obs, calls: int, repeats: int) -> float:
    for _ in range(200):  # warm-up: allocator, onnxruntime's first-run planning
        call(obs)
    means = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call(obs)
        means.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(means)


def measure(name: str, policy: ExportedPolicy, obs_dim: int, calls: int, repeats: int, folder: Path) -> dict:
    import onnxruntime

    example = torch.zeros(2, obs_dim)
    metadata = {"bench": name}
    with torch.no_grad():
        write_onnx(policy, example, dict(metadata), folder / f"{name}.onnx")
        write_torchscript(policy, example, dict(metadata), folder / f"{name}.pt")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(folder / f"{name}.onnx"), options, providers=["CPUExecutionProvider"])
    scripted = torch.jit.load(str(folder / f"{name}.pt"))
    obs = np.random.default_rng(1).normal(size=(1, obs_dim)).astype(np.float32)

    def eager(x):
        with torch.inference_mode():
            return policy(torch.from_numpy(x)).numpy()

    def torchscript(x):
        with torch.inference_mode():
            return scripted(torch.from_numpy(x)).numpy()

    def ort(x):
        return session.run(None, {"obs": x})[0]

    assert np.allclose(ort(obs), eager(obs), atol=1e-5) and np.allclose(torchscript(obs), eager(obs), atol=1e-5)
    return {"policy": name, **{label: per_call_us(fn, obs, calls, repeats)
                               for label, fn in (("onnxruntime", ort), ("torchscript", torchscript), ("eager", eager))}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, policy, obs_dim in (("locomotion 48-512-256-128-12 ELU", locomotion_policy(), 48),
                                      ("MuJoCo HalfCheetah 17-64-64-6 tanh", mujoco_policy(), 17)):
            rows.append(measure(name, policy, obs_dim, args.calls, args.repeats, Path(folder)))
    print(f"per-step latency, batch 1, one thread (us per call; median of {args.repeats} x {args.calls} calls)")
    print(f"{'policy':36s} {'onnxruntime':>12s} {'torchscript':>12s} {'eager torch':>12s} "
          f"{'eager/ort':>10s} {'ts/ort':>8s}")
    for row in rows:
        print(f"{row['policy']:36s} {row['onnxruntime']:12.1f} {row['torchscript']:12.1f} {row['eager']:12.1f} "
              f"{row['eager'] / row['onnxruntime']:9.2f}x {row['torchscript'] / row['onnxruntime']:7.2f}x")


if __name__ == "__main__":
    main()
