"""How fast could any implementation train each pair here? The networks' own arithmetic per env
step, timed alone, against 3x CleanRL's steps per second.

For the compute-bound pairs of bench/control_vs_cleanrl.py, at their hyperparameters (the
published ones, the same on both sides), this builds omnigym's networks of that pair
(CleanRL's have the same layers: the Nature CNN on 4x84x84 Pong frames, 256x256 ReLU MLPs
for SAC) and times only the tensor work one env step costs on average:

  PPO  the policy forward at rollout (1/num_envs of a forward on num_envs observations),
       plus update_epochs x num_minibatches forward+backward passes of the loss on a
       minibatch, divided by the rollout's num_envs x num_steps env steps;
  DQN  a greedy forward on one observation, plus every train_frequency steps a target
       forward and a forward+backward on a batch;
  SAC  an actor sample on one observation, plus each step a Q step (actor and target Q
       forward on next observations, twin Q forward+backward) and an actor step (actor and
       Q forward, backward into the actor) and the temperature's actor forward.

No env, no replay sampling, no optimizer step, no Python between the calls: ``1 / time``
is an upper bound on the steps per second of an eager-torch implementation with 1 and
with 2 threads. FLOPs per env step are counted with torch.utils.flop_counter on the same
calls; divided into the CPU's best matrix-product rate (measured here, 2 threads) they
give the bound for any code at all, and 3x CleanRL's SPS times the FLOPs gives the
arithmetic rate the target needs.

With ``--cleanrl DIR`` it also runs each pair's CleanRL script (as bench/control_vs_cleanrl.py
does, ``--seconds`` each, learning_starts 1024 for DQN and SAC so they train) and prints
the ceiling against 3x CleanRL's SPS: where the ceiling is lower, the ">= 3x CleanRL"
target cannot be met at these hyperparameters on this CPU by any code.

    python bench/compute_ceiling.py [--pairs ...] [--cleanrl bench/.cache/cleanrl --seconds 90]
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
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from control_vs_cleanrl import PAIRS, cleanrl_python, run_cleanrl
from omnigym.algos.control.ppo import PPOConfig, minibatch_objective
from omnigym.models.continuous import QNetwork as TwinQ
from omnigym.models.continuous import SquashedGaussianActor
from omnigym.models.control import ActorCritic, QNetwork
from omnigym.rl.losses import PolicyLossConfig

PONG_OBS = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
PONG_ACTIONS = gym.spaces.Discrete(6)
CHEETAH_OBS = gym.spaces.Box(-np.inf, np.inf, (17,), np.float32)
CHEETAH_ACTIONS = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)


def observations(space: gym.Space, n: int) -> torch.Tensor:
    if space.dtype == np.uint8:
        return torch.randint(0, 256, (n, *space.shape), dtype=torch.uint8)
    return torch.randn(n, *space.shape)


def ppo_work(h: dict, obs_space, action_space, hidden) -> list[tuple[float, callable]]:
    """(calls per env step, call) for PPO at hyperparameters ``h``."""
    agent = ActorCritic(obs_space, action_space, hidden)
    batch = h["num_envs"] * h["num_steps"]
    size = batch // h["num_minibatches"]
    rollout_obs, obs = observations(obs_space, h["num_envs"]), observations(obs_space, size)
    with torch.no_grad():
        actions, logprobs, _, values = agent.act(obs)
    advantages, returns = torch.randn(size), torch.randn(size)
    cfg = PPOConfig(**{k: v for k, v in h.items() if k in PPOConfig.__dataclass_fields__})
    loss_cfg = PolicyLossConfig(clip_low=cfg.clip_coef)

    def act():
        with torch.inference_mode():
            agent.act(rollout_obs)

    def minibatch():
        loss = minibatch_objective(agent, cfg, loss_cfg, obs, actions, None, logprobs, values, advantages, returns)[0]
        loss.backward()

    return [(1 / h["num_envs"], act), (h["update_epochs"] * h["num_minibatches"] / batch, minibatch)]


def dqn_work(h: dict) -> list[tuple[float, callable]]:
    q, target = QNetwork(PONG_OBS, PONG_ACTIONS.n), QNetwork(PONG_OBS, PONG_ACTIONS.n)
    one, obs, next_obs = observations(PONG_OBS, 1), observations(PONG_OBS, h["batch_size"]), \
        observations(PONG_OBS, h["batch_size"])
    actions, rewards = torch.randint(0, PONG_ACTIONS.n, (h["batch_size"],)), torch.randn(h["batch_size"])

    def act():
        with torch.inference_mode():
            q(one.float()).argmax(-1)

    def train():
        with torch.no_grad():
            td_target = rewards + h["gamma"] * target(next_obs.float()).max(-1).values
        F.mse_loss(q(obs.float()).gather(-1, actions.unsqueeze(-1)).squeeze(-1), td_target).backward()

    return [(1.0, act), (1 / h["train_frequency"], train)]


def sac_work(h: dict, hidden) -> list[tuple[float, callable]]:
    actor = SquashedGaussianActor(17, CHEETAH_ACTIONS, hidden)
    qf, qf_target = TwinQ(17, 6, hidden, n=2), TwinQ(17, 6, hidden, n=2)
    n = h["batch_size"]
    one, obs, next_obs = observations(CHEETAH_OBS, 1), observations(CHEETAH_OBS, n), observations(CHEETAH_OBS, n)
    actions, rewards = torch.rand(n, 6) * 2 - 1, torch.randn(n)
    actor_params = list(actor.parameters())

    def act():
        with torch.inference_mode():
            actor.sample(one)

    def q_step():
        with torch.no_grad():
            next_actions, next_log_pi = actor.sample(next_obs)
            target = rewards + h["gamma"] * (qf_target(next_obs, next_actions).min(0).values - 0.2 * next_log_pi)
        q = qf(obs, actions)
        (F.mse_loss(q[0], target) + F.mse_loss(q[1], target)).backward()

    def actor_step():
        pi, log_pi = actor.sample(obs)
        (0.2 * log_pi - qf(obs, pi).min(0).values).mean().backward(inputs=actor_params)
        with torch.no_grad():
            actor.sample(obs)  # the temperature's loss reads fresh log-probs

    return [(1.0, act), (1.0, q_step), (1.0, actor_step)]


COMPUTE_BOUND = {
    "ppo-pong": lambda h: ppo_work(h, PONG_OBS, PONG_ACTIONS, ()),
    "dqn-pong": dqn_work,
    "sac-halfcheetah": lambda h: sac_work(h, (256, 256)),
}
"""The pairs whose step is arithmetic. PPO on HalfCheetah is not among them: its 64x64
networks cost ~0.6 MFLOP per env step, microseconds of arithmetic; its bound is torch's
per-op dispatch, which bench/ppo_step_profile.py measures."""


def peak_rate(threads: int, size: int = 1024, repeats: int = 20) -> float:
    """FLOP/s of a square float32 matrix product, the best this CPU does with ``threads``."""
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(3):
        a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def flops_per_step(calls) -> float:
    total = 0.0
    for per_step, fn in calls:
        with FlopCounterMode(display=False) as counter:
            fn()
        total += per_step * counter.get_total_flops()
    return total


def seconds_per_step(calls, threads: int, repeats: int) -> float:
    torch.set_num_threads(threads)
    total = 0.0
    for per_step, fn in calls:
        for _ in range(3):
            fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        total += per_step * statistics.median(times)
    return total


def cleanrl_sps(name: str, seconds: float, cleanrl_dir: Path) -> float:
    pair = PAIRS[name]
    hparams = dict(pair.shared)
    if "learning_starts" in hparams:
        hparams["learning_starts"] = 1024
    with tempfile.TemporaryDirectory() as workdir:
        result = run_cleanrl(pair, hparams, pair.published_steps, 1, 0, seconds, Path(workdir),
                             cleanrl_python(torch.__version__.split("+")[0]), cleanrl_dir)
    return result.sps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", nargs="+", default=list(COMPUTE_BOUND), choices=list(COMPUTE_BOUND))
    parser.add_argument("--repeats", type=int, default=20, help="timed calls of each kind (median)")
    parser.add_argument("--cleanrl", type=Path, help="CleanRL checkout: also run its scripts for their SPS")
    parser.add_argument("--seconds", type=float, default=90, help="wall time of each CleanRL run")
    args = parser.parse_args()
    if args.repeats < 1 or args.seconds <= 0:
        parser.error(f"--repeats must be 1 or more and --seconds positive, got {args.repeats} and {args.seconds:g}")
    if args.cleanrl:
        missing = [PAIRS[p].cleanrl_script for p in args.pairs
                   if not (args.cleanrl / "cleanrl" / PAIRS[p].cleanrl_script).exists()]
        if missing:
            parser.error(f"{args.cleanrl}/cleanrl lacks {', '.join(missing)} (git clone "
                         "https://github.com/vwxyzjn/cleanrl DIR)")
    torch.manual_seed(0)

    rows = []
    for name in args.pairs:
        calls = COMPUTE_BOUND[name](PAIRS[name].shared)
        flops = flops_per_step(calls)
        one, two = (seconds_per_step(calls, threads, args.repeats) for threads in (1, 2))
        theirs = cleanrl_sps(name, args.seconds, args.cleanrl.resolve()) if args.cleanrl else float("nan")
        rows.append((name, flops, 1 / one, 1 / two, theirs))
        print(f"{name}: {flops / 1e6:.1f} MFLOP/step, networks alone {1 / one:.0f} steps/s (1 thread), "
              f"{1 / two:.0f} (2 threads); CleanRL {theirs:.0f} SPS", flush=True)
    peak = peak_rate(2)
    print(f"\nthis CPU's best: {peak_rate(1) / 1e9:.0f} GFLOP/s (1 thread), {peak / 1e9:.0f} GFLOP/s (2 threads), "
          "a 1024x1024 float32 matrix product")
    print(f"{'pair':16s} {'MFLOP/step':>10s} {'torch 1T':>9s} {'torch 2T':>9s} {'at peak':>8s} {'CleanRL':>8s} "
          f"{'3x CleanRL':>10s} {'needs GFLOP/s':>13s}")
    for name, flops, one, two, theirs in rows:
        print(f"{name:16s} {flops / 1e6:10.1f} {one:9.0f} {two:9.0f} {peak / flops:8.0f} {theirs:8.0f} "
              f"{3 * theirs:10.0f} {3 * theirs * flops / 1e9:13.0f}")
    print("torch 1T/2T: steps/s if the networks' passes were all a step cost (eager torch, these shapes); "
          "at peak: if they ran at the matrix-product peak")


if __name__ == "__main__":
    main()
