"""Goal-conditioned offline datasets (Dict observations: observation, achieved_goal,
desired_goal): ``omnigym collect`` writes them as Minari stores Dict spaces, the offline
algorithms read them as the online goal envs are read (the networks see observation ++
desired_goal), evaluate in the goal env, and their runs replay through eval and collect."""

import gymnasium as gym
import numpy as np
import pytest
minari = pytest.importorskip("minari")

from omnigym.algos import iql, td3_bc  # noqa: E402
from omnigym.cli import main  # noqa: E402
from omnigym.offline.datasets import OfflineConfig, load_offline_data  # noqa: E402
from omnigym.runs import collect, evaluate_run  # noqa: E402
from omnigym.track.checkpoint import load_checkpoint  # noqa: E402
from test_reproducibility import metrics  # noqa: E402

ENV = "omnigym/PointReach-v0"
SMALL = {"hidden": (32, 32), "batch_size": 32, "eval_every": 50, "log_every": 25, "eval_episodes": 2,
         "checkpoint_every": 50, "progress": False, "plot": False, "tensorboard": False, "seed": 2}


@pytest.fixture(scope="module")
def goal_datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("minari-goal")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINARI_DATASETS_PATH", str(root))
        collect(["random"], 5, "pointreach/random-v0", env_id=ENV, seed=4, ref_max_score=-5.0, reference_episodes=4)
    return root


@pytest.fixture(autouse=True)
def datasets_path(goal_datasets, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(goal_datasets))


def test_a_goal_dataset_keeps_its_dict_observations_as_the_env_gave_them():
    dataset = minari.load_dataset("pointreach/random-v0")
    space = dataset.observation_space
    assert isinstance(space, gym.spaces.Dict) and set(space.spaces) == {"observation", "achieved_goal", "desired_goal"}
    episode = next(dataset.iterate_episodes())
    env = gym.make(ENV)
    obs, _ = env.reset(seed=4 + int(episode.id))  # collect resets episode i with --seed + i
    for key in space.spaces:
        assert episode.observations[key].shape == (len(episode.rewards) + 1, *space[key].shape)
        assert np.allclose(episode.observations[key][0], obs[key])
    # the recorded actions replayed in the env give the recorded observations and rewards
    for t, action in enumerate(episode.actions):
        obs, reward, *_ = env.step(action)
        assert np.allclose(episode.observations["desired_goal"][t + 1], obs["desired_goal"])
        assert np.allclose(episode.observations["observation"][t + 1], obs["observation"])
        assert reward == episode.rewards[t]


def test_the_networks_see_observation_and_desired_goal():
    data = load_offline_data(OfflineConfig(dataset="pointreach/random-v0", normalize_obs=False), "td3_bc")
    dataset = minari.load_dataset("pointreach/random-v0")
    seen = [np.concatenate([e.observations["observation"], e.observations["desired_goal"]], -1)
            for e in dataset.iterate_episodes()]
    buffer, rows = data.buffer, np.arange(data.transitions)
    assert data.observation_space.shape == (4,) and data.transitions == dataset.total_steps == 100
    assert np.allclose(buffer._observations(np.zeros_like(rows), buffer.obs_frame[0, rows]),
                       np.concatenate([s[:-1] for s in seen]))
    assert np.allclose(buffer._observations(np.zeros_like(rows), buffer.next_frame[0, rows]),
                       np.concatenate([s[1:] for s in seen]))
    assert data.env_id == ENV and isinstance(data.dataset_observation_space, gym.spaces.Dict)


@pytest.mark.parametrize("module", [td3_bc, iql], ids=["td3_bc", "iql"])
def test_offline_algorithms_train_on_a_goal_dataset_and_evaluate_in_the_goal_env(module, tmp_path):
    run = tmp_path / "run"
    module.train(module.CONFIG(dataset="pointreach/random-v0", total_timesteps=100, run_dir=str(run), **SMALL))
    rows = metrics(run)
    evals = [r for r in rows if "eval/normalized_score" in r]
    assert [r["global_step"] for r in evals] == [50, 100]
    assert all(-20 <= r["eval/episodic_return"] <= 0 for r in evals)  # 20 steps of -1 or 0
    actor = load_checkpoint(run)["components"]["actor"]
    first_weight = next(v for k, v in actor.items() if k.endswith("weight"))
    assert first_weight.shape[-1] == 4 or first_weight.shape[0] == 4  # observation (2) ++ desired goal (2)
    # the run replays on the goal env's Dict observations: omnigym eval, and collect from it
    returns = evaluate_run(str(run), episodes=2)
    assert len(returns) == 2 and all(-20 <= r <= 0 for r in returns)
    done = collect([str(run)], 2, "pointreach/replayed-v0", seed=1)
    assert done["episodes"] == 2 and done["env_id"] == ENV
    assert isinstance(minari.load_dataset("pointreach/replayed-v0").observation_space, gym.spaces.Dict)
    minari.delete_dataset("pointreach/replayed-v0")


def test_an_offline_run_on_a_goal_dataset_continues_online_in_the_goal_env(tmp_path):
    offline, online = tmp_path / "offline", tmp_path / "online"
    td3_bc.train(td3_bc.CONFIG(dataset="pointreach/random-v0", total_timesteps=50, run_dir=str(offline), **SMALL))
    td3_bc.train(td3_bc.CONFIG(resume_online=str(offline), online_steps=60, run_dir=str(online),
                               **{**SMALL, "eval_every": 30}))
    rows = metrics(online)
    assert [r["global_step"] for r in rows if "eval/normalized_score" in r] == [0, 30, 60]
    assert [r["global_step"] for r in rows if "charts/episodic_return" in r] == [20, 40, 60]  # 20-step episodes
    assert all(-20 <= r["charts/episodic_return"] <= 0 for r in rows if "charts/episodic_return" in r)


def test_a_goal_dataset_in_another_env_is_one_line(tmp_path, capsys):
    code = main(["train", "td3_bc", "--dataset", "pointreach/random-v0", "--env-id", "Pendulum-v1",
                 "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err == ("omnigym: error: --dataset pointreach/random-v0 was collected in omnigym/PointReach-v0, not "
                   "Pendulum-v1; give --env-id omnigym/PointReach-v0 (or leave it out), or a dataset of that env")
    assert not (tmp_path / "run").exists()
