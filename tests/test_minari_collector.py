"""A dataset made the way Minari's own docs make one — ``minari.DataCollector`` around a
gymnasium env, then ``create_dataset`` — is one omnigym's offline algorithms train on. The
collector needs jax (Minari's ``[create]`` extra), which omnigym's ``[offline]`` extra holds."""

import warnings

import numpy as np
import pytest

minari = pytest.importorskip("minari", reason="minari is not installed (the [offline] extra; in [dev])")
pytest.importorskip("jax", reason="jax is not installed: Minari's DataCollector needs it (the [offline] extra)")

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402

from omnigym.algos import iql  # noqa: E402
from omnigym.track.checkpoint import load_checkpoint  # noqa: E402
from test_reproducibility import metrics  # noqa: E402


def collected(dataset_id: str, episodes: int):
    env = minari.DataCollector(gym.make("Pendulum-v1"), record_infos=False)
    env.action_space.seed(0)
    for episode in range(episodes):
        env.reset(seed=episode)
        while True:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                break
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Minari's advice to give a description
        return env.create_dataset(dataset_id=dataset_id, algorithm_name="random", eval_env="Pendulum-v1")


def test_iql_trains_on_a_dataset_minaris_data_collector_made(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    dataset = collected("pendulum/collector-v0", episodes=3)
    assert (dataset.total_episodes, dataset.total_steps) == (3, 600)
    small = dict(dataset="pendulum/collector-v0", seed=5, hidden=(32, 32), batch_size=32, log_every=10,
                 eval_episodes=2, checkpoint_every=1000, progress=False, plot=False, tensorboard=False)
    iql.train(iql.CONFIG(**small, run_dir=str(tmp_path / "start"), total_timesteps=1, eval_every=1))
    iql.train(iql.CONFIG(**small, run_dir=str(tmp_path / "run"), total_timesteps=200, eval_every=200))
    start = load_checkpoint(tmp_path / "start")["components"]["actor"]
    end = load_checkpoint(tmp_path / "run")["components"]["actor"]
    assert all(not torch.allclose(start[k], end[k]) for k in start if k.endswith("weight"))
    rows = metrics(tmp_path / "run")
    values = [r["losses/value_loss"] for r in rows if "losses/value_loss" in r]
    print("MEASURE iql value loss", values[0], values[-1])
    assert len(values) >= 10 and values[-1] < values[0]  # the expectile regression fits the dataset's Q
    final = [r for r in rows if "eval/episodic_return" in r][-1]
    assert final["global_step"] == 200 and np.isfinite(final["eval/episodic_return"])
