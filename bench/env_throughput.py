"""Env throughput: each vector-env backend stepped raw, and omnigym's PPO rollout on it.

For CartPole-v1 x 8, HalfCheetah-v5 x 1 and x 8, the Go2 locomotion task
(omnigym/Go2-Velocity-Flat-v0) x 64 and ALE/Pong-v5 x 8 envs, on every backend available
here (Atari: ale, envpool when installed, async, sync; the rest: sync, async, native and
envpool where they have the env), three measurements, alternated (raw, stub, omnigym,
raw, stub, omnigym, ...) ``--repeats`` times, median reported:

raw      the backend itself (no episode statistics, no omnigym code) stepped with the
         actions omnigym's policy took, recorded from its rollouts during warm-up and
         replayed (clipped into the box as the collector clips them): what the simulator and
         the vector env cost on the policy's own actions;
stub     omnigym's ``RolloutCollector.collect`` with an agent that replays those actions with
         zero log-probs and values, through the collector's torch path (the one pixel
         policies take; MLP policies act in numpy, models/numpy_actor.py): the cursor, the
         buffers, observation normalization and reward scaling, episode statistics;
omnigym  the same collector with an ``ActorCritic`` forward per step: what PPO's rollout
         costs.

Why the policy's actions and not uniform random ones: what a step costs depends on the
action. The Go2 task steps ~28% slower on the untrained Gaussian policy's actions (std 1
inside a [-5, 5] box) than on uniform ones (std 2.9): the physics differ (contacts), not
omnigym. Raw on uniform actions is still printed, as ``raw (uniform)``, beside it.

The collector is built as ``ppo.train`` builds it: ``PPOConfig`` with the env family's
preset applied (Atari: CleanRL's PPO settings, 128 steps per rollout; MuJoCo: 2048 steps,
normalized observations, scaled rewards), ``make_run_envs`` (so the same Atari
preprocessing as the raw run: 30 no-ops, skip 4 with max-pooling, fire reset, 84x84 gray,
4 frames, the id's sticky actions), one torch thread as ``--torch-threads`` defaults to.
Steps are counted as vector-env calls x envs on every line (autoreset steps included), so
the three measure the same env work.

The last table divides omnigym's rollout on ``--backend auto`` by the fastest raw backend:
the documented target is >= 80%. ``--quick`` (about 2 minutes) measures the MLP cases
(CartPole, HalfCheetah x 1, Go2) on their ``auto`` backend only, with fewer steps. The
machine's load average is printed with every repeat and with the tables: other work on
the cores moves these figures more than anything measured here.

EnvPool is not in omnigym's venv by default; ``--envpool-python PYTHON`` adds a raw-only
``envpool*`` row stepped by another interpreter that has it (e.g. the venv that
bench/control_vs_cleanrl.py builds: EnvPool 0.8.4), with omnigym's EnvPool settings (the
id's sticky actions; HalfCheetah as EnvPool's -v4, it has no -v5), alternated with the rest.

    OMP_NUM_THREADS=1 python bench/env_throughput.py [--quick] [--steps 8192] [--repeats 3]
        [--envpool-python bench/.cache/cleanrl-control-venv/bin/python]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import os
import statistics
import subprocess
import time

import gymnasium as gym
import numpy as np
import torch

from omnigym.algos.control.ppo import PPOConfig
from omnigym.envs.atari import AtariOptions, is_atari, make_atari_vec
from omnigym.envs.vector import _make_registered, auto_backend, has_native, make_run_envs
from omnigym.models.control import ActorCritic
from omnigym.rl.rollout import RolloutCollector
from omnigym.rl.running_stats import RewardScaler
from omnigym.track.episodes import EpisodeStats

GO2 = "omnigym/Go2-Velocity-Flat-v0"
CASES = [("CartPole-v1", 8), ("HalfCheetah-v5", 1), ("HalfCheetah-v5", 8), (GO2, 64), ("ALE/Pong-v5", 8)]
QUICK = [("CartPole-v1", 8), ("HalfCheetah-v5", 1), (GO2, 64)]


def load() -> str:
    return "load " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def backends(env_id: str) -> list[str]:
    have_envpool = importlib.util.find_spec("envpool") is not None
    if is_atari(env_id):
        names = ["ale", "envpool", "async", "sync"]
        return [b for b in names if b != "envpool" or have_envpool]
    names = ["sync", "async"]
    if has_native(env_id):
        names.append("native")
    if have_envpool:
        import envpool

        if env_id in envpool.list_all_envs():
            names.append("envpool")
    return names


def run_config(env_id: str, num_envs: int, backend: str, seed: int, steps: int) -> PPOConfig:
    """PPO's config for this env as ``omnigym train ppo --env-id ENV --num-envs N --backend B``
    gets it, with fewer steps per rollout when ``steps`` is smaller than one rollout."""
    cfg = PPOConfig(env_id=env_id, num_envs=num_envs, backend=backend, seed=seed, progress=False)
    with contextlib.redirect_stdout(io.StringIO()):  # the preset's line, printed by train
        cfg = cfg.with_preset({"env_id", "num_envs", "backend", "seed", "progress"})
    cfg.check()
    return dataclasses.replace(cfg, num_steps=min(cfg.num_steps, max(steps // num_envs, 1)))


def raw_env(cfg: PPOConfig) -> gym.vector.VectorEnv:
    """The backend alone, with the run's Atari preprocessing and nothing of omnigym around it."""
    if is_atari(cfg.env_id):
        return make_atari_vec(cfg.env_id, cfg.num_envs, cfg.backend, cfg.seed, AtariOptions.from_config(cfg))
    return _make_registered(cfg.env_id, cfg.num_envs, cfg.backend, cfg.seed, {})


def random_actions(space: gym.Space, count: int, num_envs: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(0, int(space.n), size=(count, num_envs))
    return rng.uniform(space.low, space.high, size=(count, num_envs, *space.shape)).astype(space.dtype)


class ReplayAgent:
    """``agent.act`` / ``agent.value`` as the collector calls them, without a network: the
    recorded actions in turn."""

    def __init__(self, actions: np.ndarray, num_envs: int):
        self.actions, self.num_envs, self.t = actions, num_envs, 0

    def act(self, obs, mask=None):
        action = torch.from_numpy(self.actions[self.t % len(self.actions)])
        self.t += 1
        zeros = torch.zeros(self.num_envs)
        return action, zeros, zeros, zeros

    def value(self, obs):
        return torch.zeros(self.num_envs)


class Case:
    """One backend of one (env, envs) case: a raw env, and a collector on an env of its own."""

    def __init__(self, cfg: PPOConfig, steps: int):
        self.cfg = cfg
        self.raw = raw_env(cfg)
        self.raw.reset(seed=cfg.seed)
        self.calls = max(steps // cfg.num_envs, 1)
        self.uniform = random_actions(self.raw.single_action_space, self.calls, cfg.num_envs,
                                      np.random.default_rng(cfg.seed))
        envs, signal = make_run_envs(cfg, "ppo")
        scaler = RewardScaler(cfg.num_envs, cfg.gamma) if cfg.normalize_reward else None
        self.collector = RolloutCollector(envs, cfg.num_steps, EpisodeStats(False), cfg.device, cfg.seed,
                                          cfg.normalize_obs, scaler, signal)
        self.agent = ActorCritic(envs.single_observation_space, envs.single_action_space, cfg.hidden)
        self.rollouts = max(self.calls // cfg.num_steps, 1)
        self.actions = self.uniform
        self.stub = ReplayAgent(self.uniform, cfg.num_envs)

    def record_policy_actions(self) -> None:
        """Raw and stub step on the actions the policy takes (its warm-up rollouts, as the
        env saw them) from here on."""
        space, recorded = self.raw.single_action_space, []
        while sum(len(a) for a in recorded) < self.calls:
            rollout, _ = self.collector.collect(self.agent, 0)
            recorded.append(rollout.actions.numpy().copy())
        actions = np.concatenate(recorded)[:self.calls]
        if isinstance(space, gym.spaces.Box):
            actions = np.clip(actions, space.low, space.high)
        self.actions = actions.astype(space.dtype)
        self.stub = ReplayAgent(self.actions, self.cfg.num_envs)

    def measure_raw(self, uniform: bool = False) -> float:
        step, actions = self.raw.step, self.uniform if uniform else self.actions
        start = time.perf_counter()
        for t in range(self.calls):
            step(actions[t])
        return self.calls * self.cfg.num_envs / (time.perf_counter() - start)

    def measure_collector(self, agent) -> float:
        start = time.perf_counter()
        for _ in range(self.rollouts):
            self.collector.collect(agent, 0)
        return self.rollouts * self.cfg.num_steps * self.cfg.num_envs / (time.perf_counter() - start)

    def close(self) -> None:
        self.raw.close()
        if self.collector is not None:
            self.collector.envs.close()


ENVPOOL_RAW = """
import sys, time, numpy as np, envpool
task, n, steps, seed, sticky = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
atari = task.endswith("-v5")
kw = dict(episodic_life=False, reward_clip=False, stack_num=4, frame_skip=4, noop_max=30, use_fire_reset=True,
          repeat_action_probability=sticky, img_height=84, img_width=84, gray_scale=True) if atari else {}
env = envpool.make_gymnasium(task, num_envs=n, seed=seed, **kw)
env.reset()
space, rng = env.action_space, np.random.default_rng(seed)
calls = max(steps // n, 1)
actions = rng.integers(0, space.n, (calls, n)) if atari else \
    rng.uniform(space.low, space.high, (calls, n, *space.shape)).astype(space.dtype)
for t in range(min(calls, 50)):
    env.step(actions[t])
start = time.perf_counter()
for t in range(calls):
    env.step(actions[t])
print(calls * n / (time.perf_counter() - start))
"""


class EnvPoolElsewhere:
    """Raw EnvPool stepping in another interpreter (one that has EnvPool installed)."""

    def __init__(self, python: str, env_id: str, num_envs: int, seed: int, steps: int):
        if is_atari(env_id):
            spec = gym.spec(env_id)
            self.task = "".join(part.capitalize() for part in spec.kwargs["game"].split("_")) + "-v5"
            self.sticky = spec.kwargs.get("repeat_action_probability", 0.0)
        else:
            self.task, self.sticky = env_id.split("-v")[0] + "-v4", 0.0
        self.cmd = [python, "-c", ENVPOOL_RAW, self.task, str(num_envs), str(steps), str(seed), str(self.sticky)]
        self.measure_raw()  # fails here, before the timed part, when that python cannot run it

    def measure_raw(self) -> float:
        out = subprocess.run(self.cmd, capture_output=True, text=True, check=True)
        return float(out.stdout.strip().splitlines()[-1])

    def close(self) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, help="env steps per measurement (calls x envs; 8192, --quick 4096)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--torch-threads", type=int, default=1, help="as omnigym's --torch-threads (default 1)")
    parser.add_argument("--cases", nargs="+", help="ENV_IDxNUM_ENVS, e.g. ALE/Pong-v5x8 HalfCheetah-v5x1 "
                                                   "(default: all five; with --quick, the three MLP ones)")
    parser.add_argument("--quick", action="store_true",
                        help="the auto backend only, 4096 steps and 3 repeats unless given: about 2 minutes")
    parser.add_argument("--envpool-python", help="an interpreter with EnvPool installed, for a raw envpool* row")
    args = parser.parse_args()
    if args.cases is None:
        args.cases = [f"{e}x{n}" for e, n in (QUICK if args.quick else CASES)]
    if args.steps is None:
        args.steps = 4096 if args.quick else 8192
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)
    if importlib.util.find_spec("envpool") is None and not args.envpool_python:
        print("envpool is not installed here: its rows are left out (or give --envpool-python)")

    rows, summary = [], []
    for spec in args.cases:
        env_id, _, n = spec.rpartition("x")
        num_envs = int(n)
        names = [auto_backend(env_id)] if args.quick else backends(env_id)
        print(f"\n== {env_id} x {num_envs}: {', '.join(names)}; {args.repeats} repeats of {args.steps} steps",
              flush=True)
        cases = {}
        for backend in names:
            try:
                cases[backend] = Case(run_config(env_id, num_envs, backend, args.seed, args.steps), args.steps)
            except Exception as exc:  # a backend that cannot run this env here
                print(f"   {backend}: left out ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
        if args.envpool_python and "envpool" not in cases:
            try:
                other = EnvPoolElsewhere(args.envpool_python, env_id, num_envs, args.seed, args.steps)
                cases["envpool*"] = other
                print(f"   envpool*: raw only, EnvPool {other.task} in {args.envpool_python}")
            except (subprocess.CalledProcessError, OSError) as exc:
                detail = getattr(exc, "stderr", "") or str(exc)
                print(f"   envpool*: left out ({detail.strip().splitlines()[-1] if detail.strip() else exc})")
        for backend, case in cases.items():  # warm-up: first steps, first forward
            case.measure_raw()
            if not isinstance(case, Case):
                continue
            try:
                case.record_policy_actions()
                case.measure_collector(case.stub)
            except Exception as exc:  # omnigym's rollout fails on this backend: said, and its columns left empty
                print(f"   {backend}: omnigym's rollout failed: {type(exc).__name__}: {exc}")
                case.collector.envs.close()
                case.collector = None
        results = {b: {"raw": [], "uniform": [], "stub": [], "omnigym": []} for b in cases}
        nan = float("nan")
        for rep in range(args.repeats):
            for backend, case in cases.items():
                results[backend]["raw"].append(case.measure_raw())
                ours = isinstance(case, Case) and case.collector is not None
                results[backend]["uniform"].append(case.measure_raw(uniform=True) if ours else nan)
                results[backend]["stub"].append(case.measure_collector(case.stub) if ours else nan)
                results[backend]["omnigym"].append(case.measure_collector(case.agent) if ours else nan)
                print(f"   rep {rep} {backend:8s} raw {results[backend]['raw'][-1]:8.0f}  raw (uniform) "
                      f"{results[backend]['uniform'][-1]:8.0f}  stub "
                      f"{results[backend]['stub'][-1]:8.0f}  omnigym {results[backend]['omnigym'][-1]:8.0f} steps/s  "
                      f"({load()})",
                      flush=True)
        for case in cases.values():
            case.close()
        med = {b: {k: statistics.median(v) for k, v in r.items()} for b, r in results.items()}
        for backend, m in med.items():
            rows.append((f"{env_id} x {num_envs}", backend, m["raw"], m["uniform"], m["stub"], m["omnigym"]))
        if med:
            fastest = max(med, key=lambda b: med[b]["raw"])
            auto = auto_backend(env_id)
            ours = med[auto]["omnigym"] if auto in med else float("nan")
            summary.append((f"{env_id} x {num_envs}", auto, ours, fastest, med[fastest]["raw"]))

    print(f"\nmedian steps/s over {args.repeats} repeats of {args.steps} env steps, {args.torch_threads} torch thread(s), "
          f"{load()} at the end")
    print(f"{'case':20s} {'backend':8s} {'raw':>9s} {'(uniform)':>9s} {'stub':>9s} {'omnigym':>9s} {'stub/raw':>9s} "
          f"{'omnigym/raw':>12s}")
    for case, backend, raw, uniform, stub, ours in rows:
        print(f"{case:20s} {backend:8s} {raw:9.0f} {uniform:9.0f} {stub:9.0f} {ours:9.0f} {stub / raw:8.0%} "
              f"{ours / raw:11.0%}")
    print("\nomnigym's PPO rollout on --backend auto vs the fastest raw backend (target >= 80%)")
    print(f"{'case':20s} {'auto':8s} {'omnigym':>9s} {'fastest raw':>12s} {'':8s} {'ratio':>7s}")
    for case, auto, ours, fastest, raw in summary:
        print(f"{case:20s} {auto:8s} {ours:9.0f} {raw:12.0f} {fastest:8s} {ours / raw:6.0%}")


if __name__ == "__main__":
    main()
