"""``omnigym export`` of the offline algorithms (BC, TD3+BC, IQL, CQL: their deterministic actor on
the dataset's standardized observations) and of goal-env runs (SAC, TD3, DQN with ``--her``, and an
offline run on a goal dataset: the file takes the Dict observation flattened as its metadata's
``input.layout`` says); and ``load_policy(run_dir)``, the one-line way to act with a run's policy
in Python, giving the exported file's actions. Before, export refused all of these runs in one
line, and there was no ``load_policy`` to import."""

import json

import gymnasium as gym
import numpy as np
import pytest

minari = pytest.importorskip("minari")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: pip install 'omnigym[export]'")
pytest.importorskip("onnxscript", reason="onnxscript is not installed: pip install 'omnigym[export]'")

import test_bad_input  # noqa: E402
from omnigym.algos import bc, cql, dqn, iql, sac, td3, td3_bc  # noqa: E402
from omnigym.cli import main  # noqa: E402
from omnigym.export import FORMATS, export_run, load_exported, probe_observations, read_metadata  # noqa: E402
from omnigym.runs import collect, load_policy  # noqa: E402
from omnigym.track.checkpoint import load_checkpoint  # noqa: E402

OFFLINE = {"bc": bc, "td3_bc": td3_bc, "iql": iql, "cql": cql}
SMALL = {"hidden": (32, 32), "batch_size": 32, "eval_every": 60, "log_every": 30, "eval_episodes": 1,
         "checkpoint_every": 60, "progress": False, "plot": False, "tensorboard": False, "seed": 5}
QUIET = dict(progress=False, plot=False, tensorboard=False, seed=3)
GOAL_RUNS = {  # tiny: the networks move off their initialization, which is all export needs
    "sac": (sac, dict(env_id="omnigym/PointReach-v0", num_envs=1, total_timesteps=300, learning_starts=100,
                      batch_size=32, hidden=(32, 32), buffer_size=1000, her=True)),
    "td3": (td3, dict(env_id="omnigym/PointReach-v0", num_envs=1, total_timesteps=300, learning_starts=100,
                      batch_size=32, hidden=(32, 32), buffer_size=1000, her=True)),
    "dqn": (dqn, dict(env_id="omnigym/BitFlip-v0", num_envs=1, total_timesteps=300, learning_starts=100,
                      batch_size=32, hidden=(32, 32), buffer_size=1000, her=True)),
}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """Pendulum from a random policy (observations around no particular origin: standardization
    matters) and PointReach's goal dataset (Dict observations)."""
    root = tmp_path_factory.mktemp("minari-export")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINARI_DATASETS_PATH", str(root))
        collect(["random"], 3, "pendulum/random-v0", env_id="Pendulum-v1", seed=3)
        collect(["random"], 4, "pointreach/random-v0", env_id="omnigym/PointReach-v0", seed=4)
    return root


@pytest.fixture(autouse=True)
def datasets_path(datasets, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(datasets))


def flattened(obs: dict, meta: dict) -> np.ndarray:
    """The file's input, built from its metadata alone: the keys it names, in its order."""
    layout = meta["input"]["layout"]
    assert sum(part["size"] for part in layout) == meta["input"]["shape"][1]
    return np.concatenate([np.asarray(obs[part["key"]], np.float32) for part in layout], -1)


@pytest.mark.parametrize("name", list(OFFLINE))
def test_an_offline_runs_exported_files_act_as_its_checkpoint_policy(tmp_path, name):
    module = OFFLINE[name]
    run = str(tmp_path / name)
    module.train(module.CONFIG(dataset="pendulum/random-v0", total_timesteps=60, run_dir=run, normalize_obs=True,
                               **SMALL))
    stats = load_checkpoint(run)["components"]["obs_stats"]
    assert not np.allclose(stats["mean"].numpy(), 0)  # the standardization is there to fold in
    policy = load_policy(run)
    space = gym.make("Pendulum-v1").observation_space
    observations = probe_observations(space, None, n=300, seed=11)
    want = policy(observations)
    for fmt in FORMATS:
        done = export_run(run, fmt, out=tmp_path / f"{name}.{fmt}")
        got = load_exported(done["path"], fmt)(observations)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5, err_msg=fmt)
        meta = read_metadata(done["path"], fmt)
        assert meta["algorithm"] == name and meta["observation_normalization"] is True
        assert meta["input"]["shape"] == ["batch", 3] and "layout" not in meta["input"]
    # the file really does the standardization: without it the actor's actions are others
    from omnigym.export import build_policy

    exported = build_policy(name, policy.cfg, policy.components, space, policy.action_space)
    import torch

    with torch.no_grad():
        raw = exported.actor(torch.as_tensor(observations)).numpy()
    assert np.abs(raw - want).max() > 1e-3


@pytest.mark.parametrize("name", list(GOAL_RUNS))
def test_a_her_runs_file_takes_the_flattened_goal_observation_its_metadata_describes(tmp_path, name):
    module, flags = GOAL_RUNS[name]
    run = module.train(module.CONFIG(run_dir=str(tmp_path / name), **QUIET, **flags))["run_dir"]
    env = gym.make(flags["env_id"])
    dicts = [env.reset(seed=s)[0] for s in range(40)]  # the env's own observations, goals included
    batch = {key: np.stack([d[key] for d in dicts]) for key in dicts[0]}
    policy = load_policy(run)
    want = policy(batch)
    for fmt in FORMATS:
        done = export_run(run, fmt, out=tmp_path / f"{name}.{fmt}")
        meta = read_metadata(done["path"], fmt)
        assert [part["key"] for part in meta["input"]["layout"]] == ["observation", "desired_goal"]
        assert meta["observation_space"]["type"] == "Dict"
        assert set(meta["observation_space"]["spaces"]) == {"observation", "achieved_goal", "desired_goal"}
        exported = load_exported(done["path"], fmt)
        got = exported(flattened(batch, meta))
        if name == "dqn":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5, err_msg=fmt)
        # one observation, as env.reset() gives it: the one-line loader and the file agree
        one = exported(flattened({k: v[None] for k, v in dicts[0].items()}, meta))[0]
        np.testing.assert_allclose(policy(dicts[0]), one, rtol=0, atol=1e-5)


def test_an_offline_run_on_a_goal_dataset_exports_with_its_standardization(tmp_path):
    run = str(tmp_path / "iql")
    iql.train(iql.CONFIG(dataset="pointreach/random-v0", total_timesteps=60, run_dir=run, normalize_obs=True,
                         **SMALL))
    done = export_run(run, "onnx")
    meta = read_metadata(done["path"], "onnx")
    assert meta["input"]["layout"] == [{"key": "observation", "size": 2}, {"key": "desired_goal", "size": 2}]
    env = gym.make("omnigym/PointReach-v0")
    dicts = [env.reset(seed=s)[0] for s in range(30)]
    batch = {key: np.stack([d[key] for d in dicts]) for key in dicts[0]}
    np.testing.assert_allclose(load_exported(done["path"], "onnx")(flattened(batch, meta)), load_policy(run)(batch),
                               rtol=0, atol=1e-5)


def test_load_policy_acts_on_one_env_observation_as_the_exported_file_does(tmp_path):
    """The documented one-liner: ``policy = load_policy(run); action = policy(obs)`` on what
    ``env.reset()`` returns, the same action as the file (and as a batch of one)."""
    run = str(tmp_path / "bc")
    bc.train(bc.CONFIG(dataset="pendulum/random-v0", total_timesteps=60, run_dir=run, **SMALL))
    policy = load_policy(run)
    assert main(["export", run, "--format", "onnx"]) == 0
    exported = load_exported(f"{run}/policy.onnx", "onnx")
    env = gym.make("Pendulum-v1")
    obs, _ = env.reset(seed=0)
    for _ in range(20):
        action = policy(obs)
        assert action.shape == env.action_space.shape
        np.testing.assert_allclose(action, exported(obs[None].astype(np.float32))[0], rtol=0, atol=1e-5)
        obs, *_ = env.step(action)


def test_load_policy_refuses_a_language_run_and_a_missing_run_in_one_line(tmp_path):
    from omnigym.errors import OmnigymError

    (tmp_path / "lm").mkdir()
    (tmp_path / "lm" / "config.json").write_text(json.dumps({"algo": "grpo", "task": "arithmetic"}))
    before = test_bad_input.snapshot(tmp_path)
    with pytest.raises(OmnigymError, match="load_policy does not support grpo runs"):
        load_policy(tmp_path / "lm")
    with pytest.raises(OmnigymError, match="is not a run directory"):
        load_policy(tmp_path / "nothing")
    assert test_bad_input.snapshot(tmp_path) == before


def test_a_drq_runs_file_acts_as_its_checkpoint_policy_on_rendered_frames(tmp_path):
    """DrQ (pixels of a DeepMind Control task): the critic's encoder and the actor's squashed mean."""
    import importlib.util

    if importlib.util.find_spec("shimmy") is None or importlib.util.find_spec("dm_control") is None:
        pytest.skip("needs shimmy and dm_control: pip install 'omnigym[pixels]'")
    from omnigym.algos.control import drq

    run = str(tmp_path / "drq")
    drq.train(drq.DrQConfig(env_id="dm_control/cartpole-swingup-v0", total_timesteps=300, learning_starts=100,
                            image_size=16, frame_stack=2, batch_size=16, hidden=(32, 32), features=8,
                            buffer_size=1000, checkpoint_every=300, action_repeat=2, run_dir=run, **QUIET))
    policy = load_policy(run)
    frames = probe_observations(policy.observation_space, None, n=32, seed=11)
    assert frames.dtype == np.uint8 and frames.shape[1:] == (6, 16, 16)
    done = export_run(run, "onnx")
    np.testing.assert_allclose(load_exported(done["path"], "onnx")(frames), policy(frames), rtol=0, atol=1e-5)
