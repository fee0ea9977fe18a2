"""simple_spread's returns on two scales: random play's, and those of finished mappo runs
(docs/mappo.md).

omnigym reports the team return as mpe2 gives it: the sum over the 3 agents and 25 steps of
each agent's reward, ``(1 - local_ratio) * global + local_ratio * own collisions`` with
local_ratio 0.5. MAPPO's own MPE code (marlbenchmark/on-policy) gives every agent the sum of
the agents' rewards ``global + collisions``, where an agent also collides with itself (-1 per
agent and step: its ``is_collision`` loop includes the agent), and reports the episode sum of
that. With local_ratio 0.5 the second is ``2 * ours - 75`` (3 agents x 25 steps of the self
collision), which this script prints beside ours. Landmarks are drawn from [-1, 1]^2 in mpe2
and from 0.8 * [-1, 1]^2 there: no rescaling corrects for that.

    python bench/mappo_spread.py --episodes 200
    python bench/mappo_spread.py --runs runs/mappo__pettingzoo-simple_spread_v3__1__*
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def on_policy_scale(ours: float, agents: int = 3, steps: int = 25) -> float:
    """MAPPO's MPE episode reward for an omnigym team return at local_ratio 0.5."""
    return 2 * ours - agents * steps


def random_returns(episodes: int, seed: int) -> list[float]:
    from omnigym.envs.parallel_agents import TeamEnvs

    envs = TeamEnvs("pettingzoo/simple_spread_v3", 1, seed)
    envs.reset()
    rng = np.random.default_rng(seed)
    returns = []
    while len(returns) < episodes:
        *_, ended = envs.step(rng.integers(0, envs.n_actions, size=(1, envs.num_agents)))
        returns += [r for r, _ in ended]
    envs.close()
    return returns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=200, help="episodes of random play")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", nargs="*", default=[], help="finished mappo run directories to read")
    args = parser.parse_args()

    if args.episodes > 0:
        returns = random_returns(args.episodes, args.seed)
        mean, sem = float(np.mean(returns)), float(np.std(returns) / np.sqrt(len(returns)))
        print(f"random play, {len(returns)} episodes: {mean:.1f} +- {sem:.1f} (standard error); "
              f"MAPPO's scale: {on_policy_scale(mean):.1f}")
    for run in args.runs:
        rows = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
        last = [row for row in rows if "charts/return_last_20" in row][-1]
        print(f"{run}: {last['global_step']:,} env steps, last 20 episodes {last['charts/return_last_20']:.1f}; "
              f"MAPPO's scale: {on_policy_scale(last['charts/return_last_20']):.1f}")


if __name__ == "__main__":
    main()
