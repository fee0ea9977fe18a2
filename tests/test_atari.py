"""Atari through ale-py: the preprocessing on every backend, episodic life and reward clipping
as learning signals only, the presets, DQN's frame-stacked replay on real frames."""

import importlib.util
import json

import numpy as np
import pytest

pytest.importorskip("ale_py", reason="ale-py is not installed (pip install 'omnigym[atari]')")

from omnigym.cli import main  # noqa: E402
from omnigym.envs.atari import AtariOptions  # noqa: E402
from omnigym.envs.cursor import EnvCursor, LearningSignal  # noqa: E402
from omnigym.envs.vector import make_vec  # noqa: E402


@pytest.mark.parametrize("backend", ["ale", "sync", "async"])
def test_every_backend_gives_stacked_84x84_grayscale_frames_and_lives(backend):
    envs = make_vec("ALE/Breakout-v5", 2, backend=backend, seed=0, atari=AtariOptions(frame_stack=3))
    obs, info = envs.reset(seed=0)
    assert obs.shape == (2, 3, 84, 84) and obs.dtype == np.uint8 and obs.max() > 0
    assert list(info["lives"]) == [5, 5]
    obs, rewards, terminated, truncated, info = envs.step(np.array([1, 1]))
    assert obs.shape == (2, 3, 84, 84) and rewards.shape == (2,)
    envs.close()


@pytest.mark.parametrize("env_id, sticky", [("ALE/Pong-v5", 0.25), ("PongNoFrameskip-v4", 0.0)])
def test_sticky_actions_default_to_the_ids_own_and_can_be_set(env_id, sticky):
    for options, expected in ((AtariOptions(), sticky), (AtariOptions(sticky_actions=0.1), 0.1)):
        envs = make_vec(env_id, 1, backend="sync", seed=0, atari=options)
        ale = envs.unwrapped.envs[0].unwrapped.ale
        assert ale.getFloat("repeat_action_probability") == pytest.approx(expected)
        envs.close()


def test_a_lost_life_ends_the_episode_for_learning_only():
    envs = make_vec("ALE/Breakout-v5", 1, backend="ale", seed=3)
    cursor = EnvCursor(envs, seed=3, signal=LearningSignal(clip_rewards=True, life_loss_ends=True))
    rng = np.random.default_rng(0)
    life_lost_at = None
    for step in range(3000):
        lives_before = cursor.lives.copy()
        _, rewards, terminated, truncated, info, valid = cursor.step(rng.integers(0, 4, size=1))
        assert set(np.unique(rewards)) <= {-1.0, 0.0, 1.0}
        if life_lost_at is not None:
            assert valid[0]  # the game went on: the step after a lost life is a real transition
            break
        if terminated[0] and cursor.lives[0] < lives_before[0] and cursor.lives[0] > 0:
            life_lost_at = step
            assert "episode" not in info or not info["_episode"][0]  # no episode was recorded
            assert not cursor.autoreset[0]  # and the env does not reset
    assert life_lost_at is not None
    envs.close()


def config(run_dir):
    return json.loads(open(f"{run_dir}/config.json").read())


def test_atari_preset_applies_to_the_flags_not_given_and_resume_keeps_them(tmp_path, capsys):
    run = tmp_path / "pong"
    assert main(["train", "ppo", "--env-id", "ALE/Pong-v5", "--total-timesteps", "256", "--num-steps", "16",
                 "--learning-rate", "1e-3", "--run-dir", str(run), "--no-progress", "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert "preset atari (CleanRL ppo_atari.py" in out and "--clip-coef 0.1" in out and "--num-steps" not in out
    saved = config(run)
    assert saved["preset"] == "atari" and saved["num_envs"] == 8 and saved["clip_coef"] == 0.1
    assert saved["num_steps"] == 16 and saved["learning_rate"] == 1e-3  # given flags win
    assert main(["train", "ppo", "--resume", str(run), "--total-timesteps", "512", "--no-progress"]) == 0
    assert "preset" not in capsys.readouterr().out and config(run)["learning_rate"] == 1e-3

    plain = tmp_path / "plain"
    assert main(["train", "ppo", "--env-id", "ALE/Pong-v5", "--preset", "none", "--total-timesteps", "64",
                 "--num-envs", "2", "--run-dir", str(plain), "--no-progress", "--no-plot"]) == 0
    assert config(plain)["learning_rate"] == 2e-3 and config(plain)["preset"] == "none"


def test_dqn_on_atari_keeps_each_frame_once_and_a_small_checkpoint(tmp_path, capsys):
    run = tmp_path / "dqn"
    assert main(["train", "dqn", "--env-id", "ALE/Breakout-v5", "--total-timesteps", "400", "--learning-starts", "100",
                 "--buffer-size", "300", "--batch-size", "8", "--run-dir", str(run), "--no-progress",
                 "--no-plot"]) == 0
    saved = config(run)
    assert saved["preset"] == "atari" and saved["train_frequency"] == 4 and saved["save_buffer"] is False
    from omnigym.track.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(run)
    assert checkpoint["components"]["replay"]["buffer"] is None


def test_an_atari_id_without_ale_py_is_one_line(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ale_py" else real(name, *a))
    monkeypatch.chdir(tmp_path)
    assert main(["train", "dqn", "--env-id", "ALE/Pong-v5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "omnigym[atari]" in err[0], err
    assert not (tmp_path / "runs").exists()


def test_a_refused_run_says_one_line_and_no_preset(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "ppo", "--env-id", "ALE/Pong-v5", "--frame-skip", "0"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip() == "omnigym: error: --frame-skip must be positive, got 0"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kwargs", [["foo=1"], ["frameskip=5"], ["repeat_action_probability=0.5"]])
def test_env_kwargs_on_an_atari_id_are_one_line(tmp_path, monkeypatch, capsys, kwargs):
    """They were dropped in silence (the run trained on the flags' preprocessing, whatever was asked)."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "ppo", "--env-id", "ALE/Pong-v5", "--env-kwargs", *kwargs, "--total-timesteps", "100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["omnigym: error: --env-kwargs does not apply to Atari ids (ALE/Pong-v5): its options are flags of "
                   "their own, --frame-skip, --frame-stack, --noop-max, --sticky-actions, --episodic-life, --fire-reset, "
                   "--clip-rewards (docs/atari.md)"], err
    assert list(tmp_path.iterdir()) == []
