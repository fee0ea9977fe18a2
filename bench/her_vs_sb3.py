"""SAC with hindsight replay on FetchReach-v4: Stable-Baselines3's ``HerReplayBuffer`` + SAC
beside omnigym's ``train sac --her``, same settings, in one run: steps/s of each, their
success-rate curves (the share of episodes ending on the goal, per 1000 steps) and the ratio.

    python bench/her_vs_sb3.py [--steps 25000] [--seed 1] [--out runs/her_vs_sb3]

Settings: RL-Zoo's FetchReach ones (hyperparams/her.yml: gamma 0.95, learning rate 1e-3, batch
256, buffer 1e6, learning_starts 1000, entropy coefficient auto, future goals, 4 relabels per
real transition, 64 x 64 networks), with twin critics in both (RL-Zoo's n_critics=1 is not an
omnigym setting) and neither its observation normalization nor its TimeFeatureWrapper (omnigym
has neither for SAC). Left different: SB3's networks see observation, achieved and desired goal
(its MultiInputPolicy flattens the whole Dict), omnigym's observation and desired goal; SB3
draws from finished episodes only, omnigym from running ones too. Both run on one torch thread.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ENV_ID = "FetchReach-v4"
BIN = 1000


def success_curve(episodes: list[tuple[int, float]], steps: int) -> list[float | None]:
    """Mean success of the episodes that ended in each ``BIN`` of steps (None: none ended)."""
    curve = []
    for start in range(0, steps, BIN):
        inside = [s for step, s in episodes if start < step <= start + BIN]
        curve.append(float(np.mean(inside)) if inside else None)
    return curve


def run_sb3(steps: int, seed: int) -> dict:
    import gymnasium as gym
    from stable_baselines3 import SAC, HerReplayBuffer
    from stable_baselines3.common.callbacks import BaseCallback

    from omnigym.envs.goal import register_robotics

    register_robotics()  # FetchReach-v4 registered, with the mujoco enum shim where needed
    episodes: list[tuple[int, float]] = []

    class Successes(BaseCallback):
        def _on_step(self) -> bool:
            for done, info in zip(self.locals["dones"], self.locals["infos"]):
                if done:
                    episodes.append((self.num_timesteps, float(info["is_success"])))
            return True

    model = SAC("MultiInputPolicy", gym.make(ENV_ID), replay_buffer_class=HerReplayBuffer,
                replay_buffer_kwargs=dict(n_sampled_goal=4, goal_selection_strategy="future"),
                buffer_size=1_000_000, batch_size=256, gamma=0.95, learning_rate=1e-3, learning_starts=1000,
                ent_coef="auto", policy_kwargs=dict(net_arch=[64, 64], n_critics=2), seed=seed, device="cpu",
                verbose=0)
    began = time.perf_counter()
    model.learn(total_timesteps=steps, callback=Successes())
    seconds = time.perf_counter() - began
    return {"steps_per_s": steps / seconds, "seconds": seconds, "curve": success_curve(episodes, steps)}


def run_omnigym(steps: int, seed: int, out: Path) -> dict:
    from omnigym.algos import sac

    cfg = sac.SACConfig(env_id=ENV_ID, num_envs=1, total_timesteps=steps, learning_starts=1000, batch_size=256,
                        buffer_size=1_000_000, gamma=0.95, policy_lr=1e-3, q_lr=1e-3, hidden=(64, 64),
                        policy_frequency=1, her=True, her_strategy="future", her_k=4, seed=seed, log_every=BIN,
                        checkpoint_every=0, run_dir=str(out / "omnigym"), overwrite=True, progress=False,
                        tensorboard=False)
    began = time.perf_counter()
    sac.train(cfg)
    seconds = time.perf_counter() - began
    rows = [json.loads(line) for line in open(out / "omnigym" / "metrics.jsonl")]
    by_step = {r["global_step"]: r.get("charts/success_rate") for r in rows}
    curve = [by_step.get(start + BIN) for start in range(0, steps, BIN)]
    return {"steps_per_s": steps / seconds, "seconds": seconds, "curve": curve}


def plot(results: dict, steps: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = np.arange(BIN, steps + 1, BIN)
    for name, result in results.items():
        y = np.array([np.nan if v is None else v for v in result["curve"]])
        ax.plot(x[:len(y)], y, marker="o", markersize=3, label=f"{name} ({result['steps_per_s']:.0f} steps/s)")
    ax.set(xlabel="env steps", ylabel="success rate (per 1000 steps)", title=f"SAC + HER, {ENV_ID}", ylim=(-0.02, 1.02))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="runs/her_vs_sb3")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    results = {"sb3": run_sb3(args.steps, args.seed), "omnigym": run_omnigym(args.steps, args.seed, out)}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, args.steps, out / "success.png")
    print(f"{'step':>6} " + " ".join(f"{name:>8}" for name in results))
    for i in range(args.steps // BIN):
        cells = [results[name]["curve"][i] for name in results]
        print(f"{(i + 1) * BIN:>6} " + " ".join(f"{'-' if c is None else f'{c:.2f}':>8}" for c in cells))
    sb3, ours = results["sb3"]["steps_per_s"], results["omnigym"]["steps_per_s"]
    print(f"steps/s: sb3 {sb3:.0f}, omnigym {ours:.0f}; omnigym / sb3 = {ours / sb3:.2f}")
    print(f"curves: {out / 'success.png'}")


if __name__ == "__main__":
    main()
