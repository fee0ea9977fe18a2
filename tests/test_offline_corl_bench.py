"""bench/offline_corl.py's stand-ins for CORL's imports (bench/corl_standins.py): D4RL's
``qlearning_dataset`` dict from a tiny collected dataset (keys, shapes, each transition's next
observation, terminals and timeouts where the episodes ended), gym's old step API with D4RL's
normalized score through CORL's wrappers; and, where a CORL checkout is named by ``CORL_PATH``,
CORL's own IQL and TD3+BC training a few steps on them (skipped without one)."""

import importlib.util
import os
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

minari = pytest.importorskip("minari")

from omnigym.runs import collect  # noqa: E402

BENCH = Path(__file__).resolve().parents[1] / "bench"
REF_MAX = -150.0


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """Pendulum's random episodes end by time (truncated); InvertedPendulum's by falling (terminated)."""
    root = tmp_path_factory.mktemp("minari")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINARI_DATASETS_PATH", str(root))
        collect(["random"], 2, "pendulum/random-v0", env_id="Pendulum-v1", ref_max_score=REF_MAX, reference_episodes=2)
        collect(["random"], 3, "invertedpendulum/random-v0", env_id="InvertedPendulum-v5", ref_max_score=1000.0,
                reference_episodes=2)
    return root


@pytest.fixture
def standins(datasets, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(datasets))
    monkeypatch.syspath_prepend(str(BENCH))
    import corl_standins

    for name in ("gym", "gym.wrappers", "d4rl", "pyrallis", "wandb"):
        monkeypatch.setitem(sys.modules, name, None)  # put back as they were after the test
    corl_standins.install()
    return corl_standins


@pytest.mark.parametrize("name, ends_by", [("pendulum/random-v0", "timeouts"),
                                           ("invertedpendulum/random-v0", "terminals")])
def test_qlearning_dataset_holds_every_transition_with_its_end(standins, name, ends_by):
    import d4rl
    import gym as old_gym

    data = d4rl.qlearning_dataset(old_gym.make(name))
    dataset = minari.load_dataset(name)
    n, episodes = dataset.total_steps, list(dataset.iterate_episodes())
    obs_dim, action_dim = dataset.observation_space.shape[0], dataset.action_space.shape[0]
    assert set(data) == {"observations", "actions", "next_observations", "rewards", "terminals", "timeouts"}
    assert data["observations"].shape == data["next_observations"].shape == (n, obs_dim)
    assert data["actions"].shape == (n, action_dim) and data["rewards"].shape == data["terminals"].shape == (n,)
    ends = np.cumsum([len(e.rewards) for e in episodes]) - 1
    expected = np.zeros(n, dtype=bool)
    expected[ends] = True
    np.testing.assert_array_equal(data[ends_by], expected)
    assert not data["terminals" if ends_by == "timeouts" else "timeouts"].any()
    inside = np.setdiff1d(np.arange(n - 1), ends)  # within an episode, the next observation is the next one's
    np.testing.assert_array_equal(data["next_observations"][inside], data["observations"][inside + 1])
    np.testing.assert_allclose(data["rewards"], np.concatenate([e.rewards for e in episodes]), rtol=1e-6)


def test_old_step_api_env_is_seeded_and_scores_through_corls_wrappers(standins):
    import gym as old_gym

    env = old_gym.make("pendulum/random-v0")
    env.seed(4)
    expected, _ = gym.make("Pendulum-v1").reset(seed=4)
    np.testing.assert_array_equal(env.reset(), expected)
    obs, reward, done, info = env.step(env.action_space.sample())
    assert obs.shape == (3,) and isinstance(reward, float) and done is False
    wrapped = old_gym.wrappers.TransformObservation(env, lambda o: o * 0 + 1)
    assert (wrapped.reset() == 1).all()
    ref_min = minari.load_dataset("pendulum/random-v0").storage.metadata["ref_min_score"]
    assert wrapped.get_normalized_score(REF_MAX) == pytest.approx(1.0)
    assert wrapped.get_normalized_score(ref_min) == pytest.approx(0.0)


CORL = os.environ.get("CORL_PATH", "")


@pytest.mark.skipif(not (Path(CORL) / "algorithms" / "offline" / "iql.py").is_file(),
                    reason="no CORL checkout in CORL_PATH (git clone https://github.com/tinkoff-ai/CORL)")
@pytest.mark.parametrize("algo", ["iql", "td3_bc"])
def test_corls_own_training_runs_on_the_standins(standins, algo):
    import torch

    timing = standins.install()
    spec = importlib.util.spec_from_file_location(f"corl_{algo}", Path(CORL) / "algorithms" / "offline" / f"{algo}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    config = module.TrainConfig(env="pendulum/random-v0", seed=1, max_timesteps=20, eval_freq=20, n_episodes=1,
                                device="cpu", checkpoints_path=None)
    try:
        module.train(config)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(False)  # CORL's set_seed sets it process-wide
    assert timing.last_step == 20 and len(timing.scores) == 1 and np.isfinite(timing.scores[0])
    assert timing.seconds_per(100_000) > 0


def test_omnigym_worker_times_its_gradient_steps_as_corls_are_timed(datasets, tmp_path):
    """The bench's omnigym side: ``omnigym train`` in a fresh process, its ``update`` wrapped so the
    span from the 10th to the last gradient step is timed (wall clock and CPU) as CORL's ``wandb.log``
    is, and the first ten apart (warm-up); the score is the run's last evaluation. It takes omnigym's
    ``--precision``."""
    import json
    import subprocess

    env = {**os.environ, "MINARI_DATASETS_PATH": str(datasets), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(BENCH / "offline_corl.py"), "--worker", "omnigym", "--corl", str(tmp_path),
               "--datasets", "pendulum/random-v0", "--algos", "td3_bc", "--seeds", "0", "--steps", "20",
               "--eval-episodes", "1", "--precision", "bf16"]
    (tmp_path / "algorithms" / "offline").mkdir(parents=True)
    for algo in ("iql", "td3_bc"):  # check_corl asks for CORL's files even on omnigym's side
        (tmp_path / "algorithms" / "offline" / f"{algo}.py").write_text("")
    out = subprocess.run(command, check=True, env=env, capture_output=True, text=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert set(result) == {"score", "seconds_per_100k", "cpu_seconds_per_100k", "warm_up_s"}
    assert np.isfinite(result["score"]) and result["seconds_per_100k"] > 0 and result["cpu_seconds_per_100k"] > 0
    assert result["warm_up_s"] > 0


def test_the_table_shows_both_clocks_and_their_ratios():
    sys.path.insert(0, str(BENCH))
    import offline_corl

    side = {"score": 10.0, "seconds_per_100k": 1000.0, "cpu_seconds_per_100k": 500.0, "warm_up_s": 3.25}
    rows = [{"dataset": "d/x-v0", "algo": "iql", "seed": s, "omnigym": side, "corl": {**side, "score": 12.0},
             "ratio": 2.0, "cpu_ratio": 1.5, "load": (1.0, 2.0), "omnigym_flags": "--precision bf16 --compile"}
            for s in (0, 1)]
    text = offline_corl.table(rows)
    assert "omnigym's flags: --precision bf16 --compile" in text
    assert "| d/x-v0 | iql | 0 | 10.0 | 12.0 | 1000 | 1000 | 2.00x | 500 | 500 | 1.50x | 3.2 | 1.0/2.0 |" in text
    assert "| d/x-v0 | iql | 10.0 ± 0.0 | 12.0 ± 0.0 | 2.00x | 1.50x |" in text


def test_too_few_steps_to_time_are_refused_in_one_line(tmp_path):
    """The time is taken after Timing.WARM_UP steps: fewer steps than that would time nothing."""
    import subprocess

    done = subprocess.run([sys.executable, str(BENCH / "offline_corl.py"), "--corl", str(tmp_path), "--steps", "5"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines()[-1] == ("offline_corl.py: error: --steps must be above 10: the time is "
                                                   "taken after that many warm-up steps")
