"""``omnigym collect RUN --from-replay`` (D4RL's medium-replay): the replay buffer a run saved comes
back as its episodes, cut where the run's episodes ended, in a dataset ``minari`` itself loads;
runs without a saved buffer and mixed sources are one line."""

import json

import numpy as np
import pytest

minari = pytest.importorskip("minari")

import test_bad_input  # noqa: E402
from omnigym.cli import main  # noqa: E402
from omnigym.runs import collect  # noqa: E402
from omnigym.rl.replay import ReplayBuffer  # noqa: E402

ENV = "InvertedPendulum-v5"  # random play terminates within a few dozen steps
STEPS = 300


def sac(run_dir, *extra):
    assert main(["train", "sac", "--env-id", ENV, "--total-timesteps", str(STEPS), "--learning-starts", "250",
                 "--batch-size", "16", "--hidden", "16", "16", "--log-every", "50", "--seed", "3",
                 "--run-dir", str(run_dir), "--no-progress", "--no-tensorboard", "--no-plot", *extra]) == 0
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    assert main(["train", "ppo", "--env-id", "Pendulum-v1", "--total-timesteps", "64", "--num-steps", "32",
                 "--run-dir", str(root / "ppo"), "--no-progress", "--no-tensorboard", "--no-plot"]) == 0
    return {"saved": sac(root / "saved", "--save-buffer"), "unsaved": sac(root / "unsaved"), "ppo": root / "ppo"}


@pytest.fixture(autouse=True)
def datasets_path(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))


def test_episodes_come_back_as_added_step_by_step():
    rng = np.random.default_rng(0)
    lengths, ends = [4, 3, 5], ["terminated", "truncated", "running"]
    buffer = ReplayBuffer(100, (2,), (1,), action_dtype=np.float32)
    added = []
    for length, end in zip(lengths, ends):
        observations = rng.normal(size=(length + 1, 2))  # float64, as MuJoCo gives them
        actions, rewards = rng.normal(size=(length, 1)), rng.normal(size=length)
        for t in range(length):
            terminated = end == "terminated" and t == length - 1
            buffer.add(observations[t:t + 1], actions[t:t + 1], rewards[t:t + 1], observations[t + 1:t + 2],
                       np.array([terminated]))
        added.append((observations, actions, rewards))
    assert buffer.frames_pushed[0] == sum(lengths) + len(lengths)  # each observation stored once
    episodes = list(buffer.episodes())
    assert [len(e[2]) for e in episodes] == lengths
    for (observations, actions, rewards), (obs, act, rew, terminated, ended), end in zip(added, episodes, ends):
        np.testing.assert_array_equal(obs, observations.astype(np.float32))
        np.testing.assert_array_equal(act, actions.astype(np.float32))
        np.testing.assert_array_equal(rew, rewards.astype(np.float32))
        assert list(terminated) == [False] * (len(rewards) - 1) + [end == "terminated"]
        assert ended == (end != "running")


def test_the_replay_buffer_round_trips_through_minari_cut_where_the_runs_episodes_ended(runs):
    done = collect([str(runs["saved"])], None, "pendulum/replay-v0", from_replay=True, ref_max_score=1000.0,
                   reference_episodes=3)
    dataset = minari.load_dataset("pendulum/replay-v0")
    assert dataset.total_steps == STEPS == done["steps"]
    assert dataset.storage.metadata["algorithm_name"] == "omnigym/sac replay buffer"
    assert dataset.storage.metadata["ref_max_score"] == 1000.0
    finished = sum(json.loads(line).get("charts/episodes", 0) for line in open(runs["saved"] / "metrics.jsonl"))
    episodes = list(dataset.iterate_episodes())
    assert len(episodes) == finished + 1  # the episodes the run finished, and the one it was playing
    for i, episode in enumerate(episodes):
        last = i == len(episodes) - 1
        assert episode.terminations[-1] != last and episode.truncations[-1] == last
        assert not episode.terminations[:-1].any() and not episode.truncations[:-1].any()
        assert np.abs(episode.observations[0]).max() <= 0.01  # a reset state: InvertedPendulum starts within 0.01
        assert len(episode.observations) == len(episode.actions) + 1
    assert done["returns"][str(runs["saved"])] == pytest.approx(np.mean([e.rewards.sum() for e in episodes]))


BAD = [
    (["collect", "{unsaved}", "--from-replay", "--dataset", "pendulum/bad-v0"], "saved no replay buffer (train it with "
                                                                       "--save-buffer"),
    (["collect", "{ppo}", "--from-replay", "--dataset", "pendulum/bad-v0"], "is a ppo run, which keeps no replay buffer"),
    (["collect", "{saved}", "--from-replay", "--episodes", "3", "--dataset", "pendulum/bad-v0"], "leave out --episodes"),
    (["collect", "random", "--from-replay", "--dataset", "pendulum/bad-v0"], "--from-replay reads one run's directory"),
    (["collect", "{saved}", "{saved}", "--from-replay", "--dataset", "pendulum/bad-v0"], "reads one run's directory"),
    (["collect", "{saved}", "--dataset", "pendulum/bad-v0"], "--episodes is required"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_gets_one_line_and_writes_nothing(runs, tmp_path, monkeypatch, capsys, argv, message):
    argv = [arg.format(**runs) for arg in argv]
    before = test_bad_input.snapshot(runs["saved"])
    test_bad_input.test_bad_input_gets_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, argv, message)
    assert test_bad_input.snapshot(runs["saved"]) == before


def test_from_replay_of_an_offline_run_names_its_dataset(runs, tmp_path, monkeypatch, capsys):
    """An offline run keeps no replay buffer of its own: its transitions are its dataset, which
    the line names (not --save-buffer, which offline runs do not take)."""
    assert main(["collect", str(runs["saved"]), "--from-replay", "--dataset", "pendulum/replay-v0"]) == 0
    assert main(["train", "bc", "--dataset", "pendulum/replay-v0", "--total-timesteps", "5", "--eval-episodes", "1",
                 "--run-dir", str(tmp_path / "bc"), "--no-progress", "--no-tensorboard", "--no-plot"]) == 0
    capsys.readouterr()
    (tmp_path / "cwd").mkdir()
    argv = ["collect", str(tmp_path / "bc"), "--from-replay", "--dataset", "pendulum/bad-v0"]
    test_bad_input.test_bad_input_gets_one_line_and_writes_nothing(
        tmp_path / "cwd", monkeypatch, capsys, argv, f"{tmp_path / 'bc'} is an offline run: its transitions are the "
                                                    "dataset pendulum/replay-v0 itself")
