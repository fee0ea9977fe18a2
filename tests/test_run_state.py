"""A run's state is its own: two runs on two threads of one process do not see or undo each
other's run, and the config a caller passes to ``train()`` comes back as it went in."""

import copy
import dataclasses
import json
import threading

import pytest

from omnigym.algos import ppo, reinforce
from omnigym.process import run_scope
from omnigym.track.run import Run, TrainCall, current_call


def small(run_dir=None, **extra):
    flags = dict(total_timesteps=1024, num_envs=2, num_steps=64, checkpoint_every=0, progress=False, plot=False,
                 tensorboard=False)
    return reinforce.ReinforceConfig(run_dir=None if run_dir is None else str(run_dir), **{**flags, **extra})


def test_two_runs_on_two_threads_see_and_undo_only_their_own(tmp_path, monkeypatch):
    """Run a begins, then run b begins on another thread, then a fails before its first
    checkpoint: a's directory is undone and b finishes untouched. With one run per process
    (the run begun last), a's failure undid b instead."""
    original_log = Run.log
    a_logged, b_logged = threading.Event(), threading.Event()
    own_run_seen = {"a": set(), "b": set()}

    def log(self, step, metrics):
        name = self.dir.name
        own_run_seen[name].add(current_call().run is self)
        if name == "b":
            b_logged.set()
        elif not a_logged.is_set():
            a_logged.set()
            assert b_logged.wait(120), "run b never logged"
            raise RuntimeError("run a fails before its first checkpoint")
        original_log(self, step, metrics)

    monkeypatch.setattr(Run, "log", log)
    errors = {}

    def train(name):
        try:
            reinforce.train(small(tmp_path / name))
        except BaseException as exc:  # reported by the main thread
            errors[name] = exc

    with run_scope(0):  # both threads reseed the process's RNGs: the suite gets them back
        a = threading.Thread(target=train, args=("a",))
        a.start()
        assert a_logged.wait(120), "run a never logged"
        b = threading.Thread(target=train, args=("b",))
        b.start()
        a.join(300)
        b.join(300)
    assert not a.is_alive() and not b.is_alive()
    assert isinstance(errors.get("a"), RuntimeError) and "b" not in errors, errors
    assert not (tmp_path / "a").exists()  # a's run undone ...
    assert (tmp_path / "b" / "checkpoint.pt").is_file()  # ... b's run whole
    assert json.loads((tmp_path / "b" / "config.json").read_text())["run_dir"] == str(tmp_path / "b")
    assert own_run_seen == {"a": {True}, "b": {True}}  # each thread's call held its own run
    assert current_call().run is None  # and nothing stays behind for this thread


def test_train_from_python_leaves_the_config_as_it_was(tmp_path, monkeypatch):
    """No attribute is set on the caller's config: not the directory the run decided (it is in
    config.json and the summary), not a preset line, not the flags given."""
    monkeypatch.chdir(tmp_path)
    for cfg in (small(preset="none"), small()):  # with --preset none the run once trained on the caller's object
        before = copy.deepcopy(cfg)
        summary = reinforce.train(cfg)
        assert vars(cfg) == vars(before)
        assert summary["run_dir"].startswith("runs/reinforce__CartPole-v1__1__")
        assert json.loads((tmp_path / summary["run_dir"] / "config.json").read_text())["run_dir"] == summary["run_dir"]


def test_the_preset_line_travels_in_the_call_not_on_the_config():
    cfg = ppo.PPOConfig(env_id="InvertedPendulum-v5")
    resolved, line = cfg.apply_preset()
    assert line.startswith("preset mujoco (") and resolved.preset == "mujoco" and cfg.preset == "auto"
    assert set(vars(resolved)) == {f.name for f in dataclasses.fields(resolved)}  # nothing stuck on it
    given = {"num_steps"}  # a flag the user gave keeps its value
    assert cfg.apply_preset(given)[0].num_steps == cfg.num_steps != resolved.num_steps
    assert ppo.PPOConfig(preset="none").apply_preset() == (ppo.PPOConfig(preset="none"), None)


def test_a_caller_learns_the_run_decided_and_the_preset_from_its_call(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    call = TrainCall(given_flags=set())
    summary = reinforce.train(small(), call=call)
    assert call.run_dir == summary["run_dir"] and call.run is None  # the run closed: nothing to undo
    assert call.preset_line is None  # CartPole has no preset


def test_capture_video_names_the_run_directory_start_run_then_uses(tmp_path, monkeypatch):
    """--capture-video needs the folder before the run starts; the directory it decides is kept
    by the call, and the caller's config still names none."""
    pytest.importorskip("moviepy")
    monkeypatch.chdir(tmp_path)
    cfg = small(capture_video=True)
    summary = reinforce.train(cfg)
    assert cfg.run_dir is None and not hasattr(cfg, "given_flags")
    assert sorted((tmp_path / summary["run_dir"] / "videos").glob("*.mp4"))
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [summary["run_dir"].split("/")[-1]]
