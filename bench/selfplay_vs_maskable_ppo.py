"""Time to a 0.95 win rate against a random player at connect four: omnigym's self-play PPO
(league, PFSP) vs sb3-contrib's MaskablePPO in PettingZoo's own SB3 tutorial setting.

The tutorial (PettingZoo's ``tutorials/SB3/connect_four/sb3_connect_four_action_mask.py``)
wraps the AEC env so that one MaskablePPO model plays both seats in turn, with the library's
defaults (``MaskableActorCriticPolicy``, 2048 steps a rollout, minibatches of 64, 10 epochs,
learning rate 3e-4), and evaluates the model against a random agent. Here both sides are
evaluated the same way (``--eval-games`` games against uniform random moves, seats
alternating, greedy moves) and the clock counts training only (evaluations left out):
omnigym's from its own ``eval/train_seconds``; MaskablePPO's is trained in chunks of
``--sb3-chunk`` steps with an evaluation after each. One run each, one seed, one thread.

    python bench/selfplay_vs_maskable_ppo.py [--seed 1] [--budget-seconds 900] [--eval-games 100]
                                             [--sb3-chunk 8192] [--target 0.95]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time

import numpy as np


def omnigym_time(args) -> tuple[float | None, float, int]:
    """(train seconds to the target or None, the best win rate seen, env steps run)."""
    from omnigym.algos.control import ppo

    run_dir = tempfile.mkdtemp() + "/run"
    cfg = ppo.PPOConfig(env_id="pettingzoo/connect_four_v3", self_play=True, seed=args.seed, run_dir=run_dir,
                        progress=False, plot=False, tensorboard=False).with_preset()  # the connect_four preset
    # then the bench's own budget and evaluation, which the preset must not overwrite again
    cfg = dataclasses.replace(cfg, preset="none", total_timesteps=args.omnigym_steps, eval_games=args.eval_games)
    ppo.train(cfg)
    rows = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]
    evals = [r for r in rows if "eval/vs_random/win_rate" in r]
    hit = next((r for r in evals if r["eval/vs_random/win_rate"] >= args.target), None)
    best = max(r["eval/vs_random/win_rate"] for r in evals)
    return (hit["eval/train_seconds"] if hit else None), best, rows[-1]["global_step"]


def sb3_env(seed: int):
    """The tutorial's wrapper: the AEC env as a gymnasium env whose every step is the seat to
    move's, the observation without its mask, the mask through sb3-contrib's ActionMasker."""
    import gymnasium
    import pettingzoo.utils
    from pettingzoo.classic import connect_four_v3
    from sb3_contrib.common.wrappers import ActionMasker

    class SB3ActionMaskWrapper(pettingzoo.utils.BaseWrapper, gymnasium.Env):
        def reset(self, seed=None, options=None):
            super().reset(seed, options)
            self.observation_space = super().observation_space(self.possible_agents[0])["observation"]
            self.action_space = super().action_space(self.possible_agents[0])
            return self.observe(self.agent_selection), {}

        def step(self, action):
            current = self.agent_selection
            super().step(action)
            return (self.observe(self.agent_selection), self._cumulative_rewards[current],
                    self.terminations[current], self.truncations[current], self.infos[current])

        def observe(self, agent):
            return super().observe(agent)["observation"]

        def action_mask(self):
            return super().observe(self.agent_selection)["action_mask"]

    env = SB3ActionMaskWrapper(connect_four_v3.env())
    env.reset(seed=seed)
    return ActionMasker(env, lambda e: e.action_mask())


def sb3_win_rate(model, games: int, rng: np.random.Generator) -> float:
    from omnigym.envs.games import make_game
    from omnigym.envs.games.opponents import random_move

    game, wins = make_game("pettingzoo/connect_four_v3"), 0
    for i in range(games):
        seat = i % 2
        game.reset(seed=int(rng.integers(2**31)))
        while not game.done():
            if game.current() == seat:
                obs = game.raw.observe(game.agents[seat])
                action = int(model.predict(obs["observation"], action_masks=obs["action_mask"], deterministic=True)[0])
            else:
                action = random_move(game, rng)
            game.step(action)
        wins += game.returns()[seat] > 0
    return wins / games


def sb3_time(args) -> tuple[float | None, float, int]:
    import torch
    from sb3_contrib import MaskablePPO
    from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy

    torch.set_num_threads(1)
    model = MaskablePPO(MaskableActorCriticPolicy, sb3_env(args.seed), verbose=0, seed=args.seed)
    rng, trained, steps, best = np.random.default_rng(args.seed), 0.0, 0, 0.0
    while trained < args.budget_seconds:
        began = time.perf_counter()
        model.learn(total_timesteps=args.sb3_chunk, reset_num_timesteps=False)
        trained += time.perf_counter() - began
        steps += args.sb3_chunk
        rate = sb3_win_rate(model, args.eval_games, rng)
        best = max(best, rate)
        print(f"  MaskablePPO: {steps} steps, {trained:.0f} s: win rate vs random {rate:.2f}", flush=True)
        if rate >= args.target:
            return trained, best, steps
    return None, best, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--eval-games", type=int, default=100)
    parser.add_argument("--budget-seconds", type=float, default=900, help="MaskablePPO's training time cap")
    parser.add_argument("--sb3-chunk", type=int, default=8192, help="MaskablePPO steps between evaluations")
    parser.add_argument("--omnigym-steps", type=int, default=300_000, help="omnigym's --total-timesteps")
    args = parser.parse_args()

    ours, our_best, our_steps = omnigym_time(args)
    print(f"omnigym self-play PPO: {'%.0f s' % ours if ours else 'not reached'} to >= {args.target} vs random "
          f"(best {our_best:.2f}, {our_steps} steps)", flush=True)
    theirs, their_best, their_steps = sb3_time(args)
    print(f"MaskablePPO (PettingZoo's SB3 tutorial): {'%.0f s' % theirs if theirs else 'not reached'} to >= "
          f"{args.target} vs random (best {their_best:.2f}, {their_steps} steps)", flush=True)
    if ours and theirs:
        print(f"ratio MaskablePPO / omnigym: {theirs / ours:.2f}x")


if __name__ == "__main__":
    main()
