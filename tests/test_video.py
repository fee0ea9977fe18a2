"""Videos: ``--capture-video`` while training, ``omnigym eval --video`` afterwards, MuJoCo rendered
headless, and the refusals (one line, exit 2, nothing written)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omnigym.cli import main
from test_bad_input import prepare, snapshot

pytest.importorskip("moviepy", reason="videos need moviepy: pip install 'omnigym[video]'")


def frames(path: Path):
    """The decoded frames of an .mp4 (an ISO media file: 'ftyp' at byte 4)."""
    import imageio.v3 as iio

    assert path.stat().st_size > 0 and path.read_bytes()[4:8] == b"ftyp", path
    return iio.imread(path)


@pytest.fixture(scope="module")
def video_run(tmp_path_factory):
    """A short PPO run on CartPole-v1 with --capture-video (auto backend: falls back to sync)."""
    pytest.importorskip("pygame", reason="classic-control envs draw with pygame: pip install 'omnigym[video]'")
    run_dir = tmp_path_factory.mktemp("video") / "run"
    assert main(["train", "ppo", "--total-timesteps", "1024", "--capture-video", "--run-dir", str(run_dir),
                 "--no-progress", "--no-plot", "--no-tensorboard"]) == 0
    return run_dir


def test_capture_video_writes_episodes_of_env_0(video_run, capsys):
    videos = sorted((video_run / "videos").glob("*.mp4"))
    # Env 0 plays about 128 steps: episodes 0 and 1 (and 8, if it got there) of the cubic schedule.
    names = [p.name for p in videos]
    assert "rl-video-episode-0.mp4" in names and "rl-video-episode-1.mp4" in names, names
    first = frames(video_run / "videos" / "rl-video-episode-0.mp4")
    assert first.ndim == 4 and first.shape[1:] == (400, 600, 3) and len(first) >= 8, first.shape
    assert first.std() > 0  # a drawing, not a blank
    assert json.loads((video_run / "config.json").read_text())["capture_video"] is True


def test_capture_video_falls_back_from_the_native_backend_in_one_line(tmp_path, capsys):
    assert main(["train", "ppo", "--total-timesteps", "256", "--capture-video", "--run-dir", str(tmp_path / "run"),
                 "--no-progress", "--no-plot", "--no-tensorboard"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "--capture-video" in line]
    assert lines == ["--capture-video: the native backend cannot render one env for video; CartPole-v1 runs on "
                     "--backend sync"], err


def test_eval_video_writes_the_episodes_and_the_same_returns(video_run, capsys):
    assert main(["eval", str(video_run), "--episodes", "3", "--seed", "7"]) == 0
    plain = capsys.readouterr().out.splitlines()[0]
    assert main(["eval", str(video_run), "--episodes", "3", "--seed", "7", "--video"]) == 0
    out = capsys.readouterr().out.splitlines()
    eval_dir = video_run / "videos" / "eval"
    assert out[0] == plain, (out, plain)
    assert out[1].startswith(f"videos: 3 in {eval_dir}"), out
    videos = sorted(eval_dir.glob("*.mp4"))
    assert [p.name for p in videos] == [f"rl-video-episode-{i}.mp4" for i in range(3)]
    lengths = [len(frames(p)) for p in videos]
    # Each episode's video has one frame per step plus its reset: the return of CartPole.
    shortest = float(plain.split("(min ")[1].split(",")[0])
    assert min(lengths) == shortest + 1, (lengths, plain)
    # A second eval keeps the first one's videos; --video-dir puts them elsewhere.
    other = video_run.parent / "elsewhere"
    assert main(["eval", str(video_run), "--episodes", "1", "--video-dir", str(other)]) == 0
    assert [p.name for p in other.glob("*.mp4")] == ["rl-video-episode-0.mp4"]
    assert main(["eval", str(video_run), "--episodes", "1", "--video"]) == 0
    assert len(list(eval_dir.glob("*.mp4"))) == 4 and (eval_dir / "rl-video-2-episode-0.mp4").exists()


def test_capture_video_does_not_change_training(tmp_path):
    """Same seed and backend, with and without video: the same metrics."""
    pytest.importorskip("pygame")
    logs = []
    for flags in ([], ["--capture-video"]):
        run_dir = tmp_path / f"run{len(logs)}"
        assert main(["train", "ppo", "--total-timesteps", "512", "--backend", "sync", "--run-dir", str(run_dir),
                     "--no-progress", "--no-plot", "--no-tensorboard", *flags]) == 0
        logs.append([{k: v for k, v in json.loads(line).items() if k != "perf/sps"}
                     for line in (run_dir / "metrics.jsonl").read_text().splitlines()])
    assert logs[0] == logs[1]
    assert list((tmp_path / "run1" / "videos").glob("*.mp4")) and not (tmp_path / "run0" / "videos").exists()


def test_mujoco_renders_headless(tmp_path):
    """A fresh process with no MUJOCO_GL and no display, as on a server: EGL is chosen."""
    pytest.importorskip("mujoco", reason="MuJoCo is not installed: pip install 'omnigym[mujoco]'")
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM", "DISPLAY")}
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "omnigym.cli", "train", "ppo", "--env-id", "InvertedPendulum-v5",
                           "--total-timesteps", "256", "--capture-video", "--run-dir", str(run_dir), "--no-progress",
                           "--no-plot", "--no-tensorboard"], env={**env, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=300)
    if done.returncode == 2 and "could not render headless" in done.stderr:
        pytest.skip(done.stderr.strip())  # a machine without EGL: the one line says what to install
    assert done.returncode == 0, done.stderr[-2000:]
    video = frames(run_dir / "videos" / "rl-video-episode-0.mp4")
    assert video.shape[1:] == (480, 480, 3) and video.std() > 0, video.shape


def test_a_renderer_that_cannot_start_is_one_line_naming_the_fix(tmp_path):
    pytest.importorskip("mujoco")
    env = {k: v for k, v in os.environ.items() if k not in ("PYOPENGL_PLATFORM", "DISPLAY")}
    done = subprocess.run([sys.executable, "-m", "omnigym.cli", "train", "ppo", "--env-id", "InvertedPendulum-v5",
                           "--capture-video", "--run-dir", str(tmp_path / "run")],
                          env={**env, "MUJOCO_GL": "osmesa", "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=300)
    if done.returncode == 0:
        pytest.skip("OSMesa is installed here, so this renderer starts")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "MuJoCo could not render headless (MUJOCO_GL=osmesa" in lines[0] and "apt-get install libosmesa6" in lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, message", [
    (["train", "ppo", "--capture-video", "--backend", "native"],
     "--backend native cannot record video (gymnasium's RecordVideo wraps one env of a sync or async vector env); "
     "use --backend sync, async or auto with --capture-video"),
    (["train", "dqn", "--capture-video", "--backend", "native", "--run-dir", "fresh"], "--backend native cannot record"),
    (["eval", "NOT_A_RUN", "--video", "--episodes", "0"], "--episodes must be positive, got 0"),
    # a game draws nothing: gymnasium warned, then OpenSpiel refused a render_mode parameter nobody typed
    (["train", "ppo", "--self-play", "--env-id", "openspiel/tic_tac_toe", "--capture-video"],
     "openspiel/tic_tac_toe draws no frames (render modes: none), so there is no video to record"),
    (["eval", "no-such-run", "--video"], "no-such-run is not a run directory (no config.json)"),
    (["eval", "NOT_A_RUN", "--video-dir", "out"], "not-a-run is not a run directory (no config.json)"),
])
def test_bad_video_input_gets_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    argv = prepare(tmp_path, argv)
    before = snapshot(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("omnigym: error: ") and message in err[0], err
    assert snapshot(tmp_path) == before


def test_without_moviepy_video_is_refused_naming_the_extra(tmp_path, monkeypatch, capsys, video_run):
    monkeypatch.setitem(sys.modules, "moviepy", None)  # importlib finds no moviepy
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    for argv in (["train", "ppo", "--capture-video"], ["eval", str(video_run), "--video-dir", "out"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == ["omnigym: error: moviepy is not installed; install it with: pip install 'omnigym[video]'"]
    assert snapshot(tmp_path) == before


def test_videos_are_not_written_into_another_run(tmp_path, monkeypatch, capsys, video_run):
    """--video-dir OTHER_RUN/videos put this run's episodes among another run's files (plot and export refuse it)."""
    other = tmp_path / "other-run"
    other.mkdir()
    (other / "config.json").write_text('{"algo": "sac"}')
    before = snapshot(tmp_path)
    assert main(["eval", str(video_run), "--episodes", "1", "--video-dir", str(other / "videos")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"omnigym: error: --video-dir {other / 'videos'} is inside the run {other}, which this evaluation is "
                   "not of (a run's folder holds its own files); write the videos elsewhere, e.g. videos/eval"], err
    assert snapshot(tmp_path) == before
