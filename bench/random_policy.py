"""The return of a uniformly random policy: the floor a learning figure is read against
(docs/pixels.md). Actions are held for ``--action-repeat`` frames as a pixel run acts
(envs/pixels.py's ActionRepeat); the policy ignores its observations, so the state env is
stepped and nothing is rendered.

    python bench/random_policy.py dm_control/cartpole-swingup-v0 --action-repeat 8 --episodes 20
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("env_id")
    parser.add_argument("--action-repeat", type=int, default=None, help="default: the --pixels default for the id")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import gymnasium as gym

    from omnigym.envs.pixels import DM_CONTROL_PREFIX, ActionRepeat, default_action_repeat, register_dm_control

    if args.env_id.startswith(DM_CONTROL_PREFIX):
        register_dm_control()
    repeat = args.action_repeat or default_action_repeat(args.env_id)
    env = ActionRepeat(gym.make(args.env_id), repeat)
    env.action_space.seed(args.seed)
    returns = []
    for episode in range(args.episodes):
        env.reset(seed=args.seed + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total, done = total + reward, terminated or truncated
        returns.append(total)
    env.close()
    print(f"{args.env_id}, uniform random actions held {repeat} frames, {args.episodes} episodes: "
          f"return {np.mean(returns):.1f} +- {np.std(returns):.1f} (min {min(returns):.1f}, max {max(returns):.1f})")


if __name__ == "__main__":
    main()
