"""PPO's rollout workers on Ray (CPU): the learner's view of a worker's rollout, bounded
staleness, repeatable runs, a killed worker, a killed learner resumed exactly, a hung worker,
Atari and MuJoCo, eval of a run trained this way, and bad flags."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from child_process import as_from_a_terminal

ray = pytest.importorskip("ray", reason="ray is not installed (the [ray] extra; in [dev])")

from omnigym.algos.control import ppo  # noqa: E402
from omnigym.errors import OmnigymError  # noqa: E402
from omnigym.models.control import ActorCritic  # noqa: E402
from omnigym.rl.running_stats import RunningMeanStd  # noqa: E402
from omnigym.runtime.control_workers import RayControlRollouts, RolloutWorker, merged_obs_rms, relabel  # noqa: E402
from omnigym.runtime.ray_actors import THREAD_ENV  # noqa: E402

TESTS = Path(__file__).parent
VARYING = ("perf/", "async/generator_idle", "async/trainer_idle", "time")


@pytest.fixture(scope="module")
def local_ray():
    """One small local cluster for the module; the runs join it instead of starting their own."""
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": THREAD_ENV})
    yield
    ray.shutdown()


def config(tmp_path, name="run", **overrides):
    values = dict(env_id="CartPole-v1", num_envs=4, num_steps=32, total_timesteps=1280, runtime="ray",
                  max_staleness=1, num_generators=2, run_dir=str(tmp_path / name), progress=False, plot=False,
                  tensorboard=False, seed=3)
    return ppo.PPOConfig(**{**values, **overrides})


def metrics(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith(VARYING)} for row in rows]


def test_the_learner_relabels_a_worker_rollout_with_its_own_policy(tmp_path):
    """At the same weights, the learner's pi_old is the worker's log-prob (mu) and its values
    are the critic's; after the learner's weights move, pi_old moves and mu stays."""
    worker = RolloutWorker(config(tmp_path, num_envs=4, num_generators=2), "ppo", 1, 2, os.getcwd())
    torch.manual_seed(0)
    learner = ActorCritic(*spaces())
    worker.load_weights(dict(learner.named_parameters()), 7)
    batch, busy = worker.generate(seed=1)
    assert busy > 0 and batch["version"] == 7 and batch["obs"].shape[:2] == (33, 2)
    batch["versions"] = [7] * batch["steps"]
    rollout = relabel(learner, batch, "cpu")
    assert torch.allclose(rollout.logprobs, rollout.behaviour_logprobs, atol=1e-5)
    with torch.no_grad():
        values = learner.value(torch.from_numpy(batch["obs"]).flatten(0, 1)).reshape(33, 2)
    assert torch.allclose(rollout.values, values[:-1], atol=1e-6)
    assert torch.allclose(rollout.bootstrap_values, values[1:], atol=1e-6)
    with torch.no_grad():
        next(learner.parameters()).add_(0.5)
    moved = relabel(learner, batch, "cpu")
    assert (moved.logprobs - moved.behaviour_logprobs).abs().max() > 1e-3
    assert torch.equal(moved.behaviour_logprobs, rollout.behaviour_logprobs)


def test_merged_observation_statistics_are_those_of_all_observations():
    rng = np.random.default_rng(0)
    parts = [rng.normal(i, 1 + i, size=(50 + 10 * i, 3)) for i in range(3)]
    states = []
    for part in parts:
        rms = RunningMeanStd((3,), epsilon=1e-12)
        rms.update(part)
        states.append(rms.state_dict())
    whole = np.concatenate(parts)
    merged = merged_obs_rms(states)
    assert np.allclose(merged["mean"], whole.mean(0)) and np.allclose(merged["var"], whole.var(0))
    assert merged_obs_rms([None, None]) is None


def test_async_ppo_is_bounded_repeatable_and_trains(tmp_path, local_ray):
    first = ppo.train(config(tmp_path, "a"))
    ppo.train(config(tmp_path, "b"))
    rows = metrics(tmp_path / "a")
    assert rows == metrics(tmp_path / "b")
    assert len(rows) == 10 and all(r["async/staleness_max"] <= 1 for r in rows)
    assert rows[-1]["async/staleness_mean"] == 1.0 and rows[0]["async/staleness_0_fraction"] == 1.0
    assert first["global_step"] == rows[-1]["global_step"] > 1000  # the valid steps of 10 updates of 4 x 32
    # policy steps were taken against the recomputed pi_old, which moved away from the workers' mu
    assert max(r["losses/clip_fraction"] for r in rows) > 0 and min(r["losses/approx_kl"] for r in rows) > 0


def spaces():
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    return env.observation_space, env.action_space


def test_a_killed_rollout_worker_is_restarted_and_no_update_is_lost(tmp_path, local_ray, monkeypatch):
    pids = []
    real = RayControlRollouts.collect

    def collect(self, agent, update, global_step):
        if update in (4, 8):  # before it is killed; after it has stepped updates 5-7 restarted
            pids.append(ray.get(self.workers[0].pid.remote()))
        if update == 4:
            ray.kill(self.workers[0], no_restart=False)  # Ray restarts it; the job it holds is lost
        return real(self, agent, update, global_step)

    monkeypatch.setattr(RayControlRollouts, "collect", collect)
    ppo.train(config(tmp_path))
    rows = metrics(tmp_path / "run")
    assert pids[0] != pids[1]  # a new process
    assert len(rows) == 10 and all(r["async/staleness_max"] <= 1 for r in rows)
    steps = [r["global_step"] for r in rows]
    assert steps == sorted(set(steps))  # every update trained once, on a rollout of its own


def test_a_hung_rollout_worker_is_one_error_within_the_timeout(tmp_path, local_ray, monkeypatch, untimed_start):
    monkeypatch.chdir(TESTS)  # the workers import toy_envs from the trainer's folder
    # the worker's start is not timed (untimed_start): the hang is in its 100th env step, seen by
    # the job that holds it or by the weight update queued behind that job on the same actor
    with pytest.raises(OmnigymError, match=r"(rollout worker 0 gave no rollouts for step \d+|weight update to version "
                                           r"\d+ did not reach rollout worker 0) within --sync-timeout 10 s"):
        ppo.train(config(tmp_path, env_id="toy_envs:HangingEnv", num_envs=2, num_steps=16, num_generators=1,
                         total_timesteps=4000, sync_timeout=10.0))
    assert time.monotonic() - untimed_start[0] < 10 + 60  # the wait, the steps before the hang, closing


CLI = ["--num-envs", "4", "--num-steps", "32", "--total-timesteps", "2560", "--checkpoint-every", "512",
       "--runtime", "ray", "--max-staleness", "2", "--num-generators", "2", "--seed", "5", "--no-progress",
       "--no-plot", "--no-tensorboard"]


def test_a_killed_learner_resumes_to_the_same_metrics(tmp_path, local_ray, capsys):
    """The learner SIGKILLed after a checkpoint and resumed with --resume trains on the same
    rollouts (the checkpoint keeps those in flight and each worker's envs) and ends where a
    run that was never stopped ends. (The run never stopped is the same command run in this
    process, on the module's Ray: a process and a Ray start less than a third command.)"""
    from omnigym.cli import main

    omnigym = str(Path(sys.executable).parent / "omnigym")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    assert main(["train", "ppo", *CLI, "--run-dir", str(tmp_path / "whole")]) == 0, capsys.readouterr().err[-2000:]
    cut, log = tmp_path / "cut", tmp_path / "cut" / "metrics.jsonl"
    learner = subprocess.Popen([omnigym, "train", "ppo", *CLI, "--run-dir", str(cut)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (log.exists() and len(log.read_text().splitlines()) >= 11):  # past the checkpoint at 1024 steps
        assert learner.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
        time.sleep(0.02)
    learner.send_signal(signal.SIGKILL)
    learner.wait()
    rows = metrics(tmp_path / "whole")
    assert len(log.read_text().splitlines()) < len(rows)
    done = subprocess.run([omnigym, "train", "ppo", "--resume", str(cut)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert metrics(cut) == rows


@pytest.mark.parametrize("env_id, flags", [
    ("HalfCheetah-v5", dict(num_envs=2, num_steps=64, total_timesteps=384, num_minibatches=4, update_epochs=2)),
    ("ALE/Pong-v5", dict(num_envs=2, num_steps=16, total_timesteps=96, num_minibatches=2, update_epochs=1))])
def test_atari_and_mujoco_train_on_rollout_workers_and_evaluate(tmp_path, local_ray, env_id, flags):
    pytest.importorskip("mujoco" if env_id.startswith("Half") else "ale_py")
    from omnigym.runs import evaluate_run

    summary = ppo.train(config(tmp_path, env_id=env_id, **flags).with_preset())
    rows = metrics(tmp_path / "run")
    assert len(rows) == 3 and all(r["async/staleness_max"] <= 1 for r in rows)
    saved = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["components"]["collector"]
    if env_id.startswith("Half"):  # the workers' merged observation statistics, for eval
        assert saved["obs_rms"]["count"] > summary["global_step"] * 0.9
    assert np.isfinite(evaluate_run(str(tmp_path / "run"), episodes=1)).all()


@pytest.mark.parametrize("flags, message", [
    (["--runtime", "ray", "--num-envs", "3", "--num-generators", "2"],
     "--num-envs 3 does not split evenly between --num-generators 2 rollout workers"),
    (["--runtime", "ray", "--num-generators", "9"], "--num-generators 9 is more than the 8 envs of --num-envs"),
    (["--behaviour-cap", "2"], "--behaviour-cap corrects for rollouts stepped by an older policy: read by --runtime ray"),
    (["--runtime", "ray", "--behaviour-cap", "0"], "--behaviour-cap must be positive"),
    (["--num-generators", "2"], "--num-generators: read by --runtime ray only"),
    (["--runtime", "ray", "--max-staleness", "-1"], "--max-staleness must be 0 or more, got -1"),
    (["--ray-trainer"], "--ray-trainer: read by --runtime ray only"),
    (["--runtime", "ray", "--trainer-gpus", "1"], "--trainer-gpus is what the --ray-trainer task asks Ray for"),
    (["--runtime", "ray", "--ray-trainer", "--trainer-gpus", "-1"], "--trainer-gpus must be 0 or more")])
def test_bad_runtime_flags_get_one_line_and_no_run_dir(tmp_path, capsys, flags, message):
    from omnigym.cli import main

    assert main(["train", "ppo", "--run-dir", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("omnigym: error:") and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_the_trainer_as_a_ray_task_runs_the_same_run(tmp_path, local_ray):
    ppo.train(config(tmp_path, "task", ray_trainer=True))
    ppo.train(config(tmp_path, "here"))
    assert metrics(tmp_path / "task") == metrics(tmp_path / "here")


@pytest.mark.parametrize("where", [[], ["--ray-trainer"]], ids=["rollout worker", "rollout worker in trainer task"])
def test_an_error_raised_on_ray_is_one_line_and_no_run_dir(tmp_path, monkeypatch, capsys, where):
    from omnigym.cli import main

    monkeypatch.chdir(TESTS)  # the workers import toy_envs from here
    argv = ["train", "ppo", "--env-id", "toy_envs:NaNEnv", "--runtime", "ray", "--run-dir", str(tmp_path / "run")]
    assert main(argv + where) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the env returned a non-finite observation (nan) at env step" in err[0], err
    assert not (tmp_path / "run").exists()


def test_ctrl_c_stops_the_trainer_task_and_says_how_to_resume(tmp_path, local_ray, capsys):
    """Ctrl-C in the terminal of a --ray-trainer run: one line saying how to resume, and the
    resumed run goes on (resumed in this process, on the module's Ray: a process and a Ray start
    less than a second command)."""
    from omnigym.cli import main

    omnigym = str(Path(sys.executable).parent / "omnigym")
    run = tmp_path / "run"
    command = [omnigym, "train", "ppo", "--runtime", "ray", "--ray-trainer", "--total-timesteps", "400000",
               "--checkpoint-every", "2048", "--run-dir", str(run), "--no-progress", "--no-plot", "--no-tensorboard"]
    trainer = subprocess.Popen(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, preexec_fn=as_from_a_terminal)
    deadline = time.monotonic() + 300
    while not (run / "checkpoint.pt").exists():
        assert trainer.poll() is None and time.monotonic() < deadline, "the run ended before it could be stopped"
        time.sleep(0.1)
    trainer.send_signal(signal.SIGINT)
    _, err = trainer.communicate(timeout=300)
    assert trainer.returncode == 130, err[-2000:]
    assert f"omnigym: interrupted; continue with: omnigym train ppo --resume {run}" in err
    from omnigym.track.checkpoint import load_checkpoint

    saved_at = load_checkpoint(run)["counters"]["global_step"]  # one more checkpoint's worth: it goes on
    assert main(["train", "ppo", "--resume", str(run), "--total-timesteps", str(saved_at + 2048)]) == 0, \
        capsys.readouterr().err[-2000:]
    assert load_checkpoint(run)["counters"]["global_step"] > saved_at


@pytest.mark.slow
def test_async_ppo_solves_cartpole(tmp_path, local_ray):
    """Two rollout workers one update ahead (K=1), the correction on: CartPole at 50k steps."""
    summary = ppo.train(config(tmp_path, num_envs=8, total_timesteps=50_000, seed=1))
    assert summary["mean_return_last_20"] >= 300, summary
