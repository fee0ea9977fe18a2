"""Locomotion rollout throughput: physics steps/s of the ways to step N Go2 worlds, side by side
with raw MuJoCo ``mj_step`` on the same model (docs/robots.md).

    python bench/locomotion_throughput.py [--num-envs 64] [--seconds 5] [--threads 2]

Rows: (raw) one MjData stepped by ``mujoco.mj_step`` in a loop under the same kind of random PD
targets, nothing else: the physics' own rate on one thread (a robot held still steps ~3x faster, so
raw is driven as the envs are); (a) the task's vector env on ``mujoco.rollout`` (persistent pool, ``--threads``
threads, ``nstep = decimation``); (b) the vector env on a Python loop of ``mj_step`` over N MjData;
(c) gymnasium's ``SyncVectorEnv`` of N single envs. (a)-(c) include the whole task (rewards,
observations, resets, randomization), stepped with random actions. The ratio column is physics
steps/s over raw's; (a) on 2 threads can pass 1.0 on 2 free cores.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

ENV_ID = "omnigym/Go2-Velocity-Flat-v0"


def timed(step, seconds: float) -> tuple[int, float]:
    step()  # warm up (first rollout allocates)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        calls += 1
    return calls, time.perf_counter() - start


def raw_mj_step(seconds: float) -> float:
    """The same model driven the same way (a new random PD target every 4 steps, the default pose
    plus 0.25 x N(0, 0.5) as the envs below get), with nothing else around ``mj_step``."""
    import mujoco

    from omnigym.envs.locomotion.robots import build_model

    robot = build_model("go2")
    data = mujoco.MjData(robot.model)
    data.qpos[:] = robot.default_qpos
    model, step = robot.model, mujoco.mj_step
    targets = robot.default_joint_pos + 0.25 * np.random.default_rng(0).normal(0.0, 0.5, size=(256, 12))
    i = [0]

    base_contact = robot.sensors["base"].start
    since_reset = [0]

    def hundred():
        for _ in range(25):
            data.ctrl[:] = targets[i[0] % 256]
            i[0] += 1
            for _ in range(4):
                step(model, data)
            since_reset[0] += 1
            w, x, y, _ = data.qpos[3:7]
            upright = 1 - 2 * (x * x + y * y)  # the base z axis' world z
            if data.sensordata[base_contact] > 0 or upright < np.cos(1.0) or since_reset[0] == 1000:
                # the task's episode ends (a fall: base contact or tilt; or 20 s): back to the start
                data.qpos[:], data.qvel[:] = robot.default_qpos, 0.0
                since_reset[0] = 0
    calls, elapsed = timed(hundred, seconds)
    return calls * 100 / elapsed


def vector_env(envs, num_envs: int, seconds: float, decimation: int = 4) -> float:
    rng = np.random.default_rng(0)
    envs.reset(seed=0)
    actions = rng.normal(0.0, 0.5, size=(256, num_envs, 12)).astype(np.float32)
    i = [0]

    def one():
        envs.step(actions[i[0] % 256])
        i[0] += 1
    calls, elapsed = timed(one, seconds)
    envs.close()
    return calls * num_envs * decimation / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import gymnasium as gym

    import omnigym.envs  # noqa: F401  (registers the task ids)
    from omnigym.envs.locomotion.env import LocomotionEnv

    n = args.num_envs
    raw = raw_mj_step(args.seconds)
    rows = [("raw mj_step, 1 MjData, 1 thread", raw)]
    for label, stepper, threads in ((f"(a) vector env, mujoco.rollout, {args.threads} threads", "rollout", args.threads),
                                    ("(a') vector env, mujoco.rollout, 1 thread", "rollout", 1),
                                    ("(b) vector env, loop of mj_step", "loop", 0)):
        envs = gym.make_vec(ENV_ID, n, vectorization_mode="vector_entry_point", stepper=stepper, threads=threads)
        rows.append((label, vector_env(envs, n, args.seconds)))
    sync = gym.vector.SyncVectorEnv([lambda: LocomotionEnv(robot="go2", terrain="flat")] * n)
    rows.append(("(c) gymnasium SyncVectorEnv of single envs", vector_env(sync, n, args.seconds)))
    print(f"Go2 flat, {n} envs, decimation 4 (physics steps = 4 x env steps), {args.seconds:.0f} s each")
    print(f"{'':48s} {'physics steps/s':>16s} {'env steps/s':>12s} {'x raw':>7s}")
    for label, rate in rows:
        print(f"{label:48s} {rate:16,.0f} {rate / 4:12,.0f} {rate / raw:7.2f}")


if __name__ == "__main__":
    main()
