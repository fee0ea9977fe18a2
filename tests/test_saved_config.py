"""A saved ``config.json`` is read back with the command line's checks: a hand-edited value of
the wrong type or out of range, a missing setting, or another algorithm's setting is refused
in one line naming the key and the file, by ``--resume`` and ``omnigym eval``, and nothing on
disk changes; settings a newer version wrote are kept when a resume rewrites the file."""

import json

import pytest

from omnigym.cli import main
from test_bad_input import snapshot


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert main(["train", "ppo", "--total-timesteps", "512", "--run-dir", str(run_dir), "--no-progress",
                 "--no-plot"]) == 0
    return run_dir


@pytest.fixture
def run_copy(finished_run, tmp_path):
    import shutil

    shutil.copytree(finished_run, tmp_path / "run")
    return tmp_path / "run"


def edit_config(run, drop=(), **changes):
    path = run / "config.json"
    values = {k: v for k, v in json.loads(path.read_text()).items() if k not in drop}
    path.write_text(json.dumps({**values, **changes}, indent=2))


COMMANDS = {
    "resume": lambda run: ["train", "ppo", "--resume", str(run), "--total-timesteps", "1024", "--no-progress"],
    "eval": lambda run: ["eval", str(run), "--episodes", "1"],
}

EDITS = [
    ({"num_envs": "four"}, (), "'num_envs' must be int, got 'four'"),
    ({"num_envs": True}, (), "'num_envs' must be int, got True"),
    ({"learning_rate": "fast"}, (), "'learning_rate' must be float, got 'fast'"),
    ({"hidden": [64, "x"]}, (), "'hidden' must be tuple[int, ...], got [64, 'x']"),
    ({"anneal_lr": "yes"}, (), "'anneal_lr' must be bool, got 'yes'"),
    ({"env_id": None}, (), "'env_id' must be str, got None"),
    ({"num_envs": -3}, (), "--num-envs must be positive, got -3"),
    ({"gamma": 1.5}, (), "--gamma must be between 0 and 1, got 1.5"),
    ({}, ("env_id",), "has no 'env_id'"),
    ({"buffer_size": 1000}, (), "'buffer_size' is a setting of dqn, sac, td3, drq, not of ppo"),
]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("changes, drop, message", EDITS, ids=[m for _, _, m in EDITS])
def test_a_hand_edited_config_is_refused_in_one_line_naming_key_and_file(run_copy, capsys, command, changes,
                                                                          drop, message):
    edit_config(run_copy, drop, **changes)
    before = snapshot(run_copy.parent)
    assert main(COMMANDS[command](run_copy)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert message in err[0] and str(run_copy / "config.json") in err[0], err[0]
    assert snapshot(run_copy.parent) == before


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "is not an omnigym run config"),
    ('{"algo": "ppo", "env_id": ', "cannot be read (JSONDecodeError)"),
])
def test_a_config_that_is_not_a_json_object_is_refused(run_copy, capsys, command, text, message):
    (run_copy / "config.json").write_text(text)
    before = snapshot(run_copy.parent)
    assert main(COMMANDS[command](run_copy)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert snapshot(run_copy.parent) == before


def test_settings_a_newer_version_wrote_are_kept_on_resume_and_mentioned(run_copy, capsys):
    edit_config(run_copy, future_flag={"depth": 3}, another_new_one=2)
    assert main(COMMANDS["resume"](run_copy)) == 0
    saved = json.loads((run_copy / "config.json").read_text())
    assert saved["future_flag"] == {"depth": 3} and saved["another_new_one"] == 2
    assert saved["total_timesteps"] == 1024
    mentions = [line for line in capsys.readouterr().err.splitlines() if "future_flag" in line]
    assert len(mentions) == 1 and "another_new_one" in mentions[0], mentions


def test_eval_reads_a_config_with_settings_a_newer_version_wrote(run_copy, capsys):
    edit_config(run_copy, future_flag=1)
    assert main(COMMANDS["eval"](run_copy)) == 0
    assert "1 episodes: mean return" in capsys.readouterr().out
