"""Learning tests: the agent learned, on fixed seeds (thresholds in docs/algorithms)."""

import json

import pytest

from omnigym.algos import dqn, ppo, reinforce

pytestmark = pytest.mark.slow


def best_last_20(run_dir) -> float:
    rows = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]
    return max(row.get("charts/return_last_20", 0.0) for row in rows)


def quiet(tmp_path, seed):
    return dict(seed=seed, run_dir=str(tmp_path / f"s{seed}"), progress=False, plot=False, tensorboard=False,
                checkpoint_every=0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_ppo_solves_cartpole_within_100k_steps(tmp_path, seed):
    ppo.train(ppo.PPOConfig(total_timesteps=100_000, **quiet(tmp_path, seed)))
    assert best_last_20(tmp_path / f"s{seed}") >= 475


@pytest.mark.parametrize("seed", [1, 2])
def test_dqn_learns_cartpole(tmp_path, seed):
    dqn.train(dqn.DQNConfig(total_timesteps=50_000, **quiet(tmp_path, seed)))
    assert best_last_20(tmp_path / f"s{seed}") >= 200


@pytest.mark.parametrize("seed", [1, 2])
def test_reinforce_learns_cartpole(tmp_path, seed):
    reinforce.train(reinforce.ReinforceConfig(total_timesteps=100_000, **quiet(tmp_path, seed)))
    assert best_last_20(tmp_path / f"s{seed}") >= 150
