"""Learning tests: the agent learned, on fixed seeds, judged on where the run *ended*
(thresholds in docs/ppo.md, docs/dqn.md, docs/reinforce.md): the mean return of the last
20 training episodes at the end of the run, and the final checkpoint replayed by
``omnigym eval`` on fresh episodes. A run that peaks and then collapses fails."""

import json

import numpy as np
import pytest

from omnigym.algos import dqn, ppo, reinforce
from omnigym.runs import evaluate_run

pytestmark = pytest.mark.slow


def final_last_20(run_dir) -> float:
    rows = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]
    return [row["charts/return_last_20"] for row in rows if "charts/return_last_20" in row][-1]


def quiet(tmp_path, seed):
    return dict(seed=seed, run_dir=str(tmp_path / f"s{seed}"), progress=False, plot=False, tensorboard=False,
                checkpoint_every=0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_ppo_solves_cartpole_within_100k_steps(tmp_path, seed):
    ppo.train(ppo.PPOConfig(total_timesteps=100_000, **quiet(tmp_path, seed)))
    assert final_last_20(tmp_path / f"s{seed}") >= 475
    assert np.mean(evaluate_run(str(tmp_path / f"s{seed}"), episodes=10, greedy=True)) >= 475


# The DQN and REINFORCE bars sit about 10% under the lowest figure their seeds gave (the
# margin for seeds and library versions: one seed's figure moved by 10-15% between the stack
# the docs were measured on and torch 2.13 / gymnasium 1.4). Measured, last-20 return / eval:
# DQN seed 1 434.4 / 500.0, seed 2 250.2 / 500.0 (docs/dqn.md's stack: 392.2 / 500.0 and
# 294.6 / 340.2, hence the eval bar under 340); REINFORCE seed 1 177.7 / 196.9, seed 2
# 217.9 / 182.0 (docs/reinforce.md's: 196.4 / 178.9 and 210.3 / 221.2). Random play: ~22.
DQN_LAST_20, DQN_GREEDY_EVAL = 225, 300
REINFORCE_LAST_20, REINFORCE_EVAL = 160, 160


@pytest.mark.parametrize("seed", [1, 2])
def test_dqn_learns_cartpole(tmp_path, seed):
    dqn.train(dqn.DQNConfig(total_timesteps=50_000, **quiet(tmp_path, seed)))
    assert final_last_20(tmp_path / f"s{seed}") >= DQN_LAST_20
    assert np.mean(evaluate_run(str(tmp_path / f"s{seed}"), episodes=10, greedy=True)) >= DQN_GREEDY_EVAL


@pytest.mark.parametrize("seed", [1, 2])
def test_reinforce_learns_cartpole(tmp_path, seed):
    reinforce.train(reinforce.ReinforceConfig(total_timesteps=100_000, **quiet(tmp_path, seed)))
    assert final_last_20(tmp_path / f"s{seed}") >= REINFORCE_LAST_20
    assert np.mean(evaluate_run(str(tmp_path / f"s{seed}"), episodes=10)) >= REINFORCE_EVAL


def test_dqn_learns_from_pixels(tmp_path):
    # The Nature CNN from 84x84 frames (toy_envs.SidePixelEnv: best 20, guessing 10), with the
    # Atari preset's update schedule (one gradient step every 4 env steps) at a short horizon:
    # 2000 steps, the last 20 episodes 19.75 and 5 greedy ones 20.0 (19.25 at 1000 already).
    run = tmp_path / "pixels"
    dqn.train(dqn.DQNConfig(env_id="toy_envs:SidePixelEnv", total_timesteps=2000, learning_starts=500,
                            train_frequency=4, gradient_steps=1, batch_size=32, buffer_size=5000, learning_rate=2.5e-4,
                            target_network_frequency=250, exploration_fraction=0.4, end_e=0.02, log_every=500,
                            **quiet(tmp_path, 1) | {"run_dir": str(run)}))
    assert final_last_20(run) >= 18
    assert np.mean(evaluate_run(str(run), episodes=5, greedy=True)) >= 19
