"""Env steps/s of mjlab's velocity task: mjlab's own step (GPU tensors in and out, its in-step
autoreset) vs the same task through omnigym's adapter (numpy batches, NEXT_STEP autoreset:
envs/mjlab_backend.py), side by side, with the ratio. Needs the [gpu-sim] extra and an NVIDIA
GPU; without them it says so in one line. Run on an H100: 161,291 vs 102,583 env steps/s at 4096
envs, 0.64x (docs/gpu_sim.md).

    python bench/mjlab_throughput.py [--task Mjlab-Velocity-Flat-Unitree-Go1] [--num-envs 4096] [--steps 500]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from omnigym.envs.mjlab_backend import MjlabVectorEnv, check_available
from omnigym.errors import OmnigymError


def make(task: str, num_envs: int, auto_reset: bool):
    import mjlab.tasks  # noqa: F401  (registers mjlab's tasks)
    from mjlab.envs import ManagerBasedRlEnv
    from mjlab.tasks.registry import load_env_cfg

    cfg = load_env_cfg(task)
    cfg.scene.num_envs, cfg.auto_reset, cfg.seed = num_envs, auto_reset, 0
    return ManagerBasedRlEnv(cfg=cfg, device="cuda:0")


def steps_per_second(step, actions, steps: int) -> float:
    for _ in range(20):  # warm-up: Warp's kernels compile and CUDA graphs are captured on first use
        step(actions)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step(actions)
    torch.cuda.synchronize()
    return steps * len(actions) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="Mjlab-Velocity-Flat-Unitree-Go1")
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=500)
    args = parser.parse_args()
    try:
        check_available()
    except OmnigymError as exc:
        sys.exit(f"bench/mjlab_throughput.py: {exc}")
    raw = make(args.task, args.num_envs, auto_reset=True)
    raw.reset(seed=0)
    gpu_actions = torch.zeros(args.num_envs, raw.single_action_space.shape[0], device="cuda:0")
    raw_sps = steps_per_second(raw.step, gpu_actions, args.steps)
    raw.close()
    adapter = MjlabVectorEnv(make(args.task, args.num_envs, auto_reset=False))
    adapter.reset(seed=0)
    adapted_sps = steps_per_second(adapter.step, np.zeros(adapter.action_space.shape, np.float32), args.steps)
    adapter.close()
    print(f"{args.task}, {args.num_envs} envs, {args.steps} steps, {torch.cuda.get_device_name(0)}")
    print(f"{'mjlab step (GPU tensors, in-step reset)':44s} {raw_sps:14,.0f} env steps/s")
    print(f"{'omnigym adapter (numpy, NEXT_STEP reset)':44s} {adapted_sps:14,.0f} env steps/s "
          f"({adapted_sps / raw_sps:.2f}x mjlab's)")


if __name__ == "__main__":
    main()
