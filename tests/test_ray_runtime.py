"""The asynchronous runtime on Ray (CPU): bounded staleness, repeatable and resumable runs,
generators that die or hang, and bad flags."""

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (the [ray] extra; in [dev])")
pytest.importorskip("transformers")

from omnigym.errors import OmnigymError  # noqa: E402
from omnigym.generators.base import Trajectories, Trajectory  # noqa: E402
from omnigym.runtime.ray_actors import THREAD_ENV, RayRollouts  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One small local cluster for the module; RayRollouts joins it instead of starting its own."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the toy generators below
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": THREAD_ENV})
    yield
    ray.shutdown()


class ToyGenerator:
    """One trajectory per prompt and sample; its reward is the weight it saw, so a test can
    tell which policy made it. ``delay`` seconds per call stand in for sampling."""

    def __init__(self, delay=0.0):
        self.weights, self.version, self.delay = {}, 0, delay

    def update_weights(self, named_tensors, version):
        self.weights.update(named_tensors)  # none: the same weights under a new version
        self.version = version

    def generate(self, examples, group_size):
        time.sleep(self.delay)
        w = float(self.weights["w"])
        return Trajectories([Trajectory([1], [2], [1], [0.0], w, g, self.version, e)
                             for g, e in enumerate(examples) for _ in range(group_size)])


class ToyModel:
    def __init__(self):
        import torch

        self.w = torch.nn.Parameter(torch.tensor(0.0))

    def named_parameters(self):
        return [("w", self.w)]


def toy_rollouts(steps=6, delay=0.0, **options):
    examples_for = lambda step: [{"step": step, "i": i} for i in range(4)]  # noqa: E731
    return RayRollouts(lambda: ToyGenerator(delay), examples_for, 2, steps, **options)


def train_toy(rollouts, model, steps, kill_at=None):
    """A trainer that sets w to the step number after each step; returns each step's rollouts."""
    seen = []
    rollouts.update_weights(model.named_parameters(), 0)
    for step in range(steps):
        if step == kill_at:
            ray.kill(rollouts.workers[0], no_restart=False)  # Ray restarts it
        out = rollouts.trajectories(step)
        seen.append(out)
        model.w.data.fill_(step + 1)
        rollouts.update_weights(model.named_parameters(), step + 1)
    return seen


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
def test_staleness_is_bounded_and_every_step_gets_its_own_prompts(max_staleness):
    rollouts = toy_rollouts(num_generators=2, max_staleness=max_staleness)
    try:
        seen = train_toy(rollouts, ToyModel(), 6)
    finally:
        rollouts.close()
    for step, out in enumerate(seen):
        assert [t.example for t in out.items] == [{"step": step, "i": i} for i in range(4) for _ in range(2)]
        assert [t.group_id for t in out.items] == [i for i in range(4) for _ in range(2)]  # chunks joined in order
        ages = {step - t.policy_version for t in out.items}
        # the schedule makes every sample exactly min(step, K) versions old, and its reward shows
        # it came from that version's weights
        assert ages == {min(step, max_staleness)}
        assert {t.reward for t in out.items} == {float(step - min(step, max_staleness))}


def test_a_killed_generator_is_restarted_and_no_step_is_lost_or_repeated():
    rollouts = toy_rollouts(steps=8, max_staleness=2)
    try:
        pid = ray.get(rollouts.workers[0].pid.remote())
        seen = train_toy(rollouts, ToyModel(), 8, kill_at=4)
        assert ray.get(rollouts.workers[0].pid.remote()) != pid  # a new process
    finally:
        rollouts.close()
    assert [out.items[0].example["step"] for out in seen] == list(range(8))
    assert all(len(out) == 8 for out in seen)
    for step, out in enumerate(seen):
        assert all(0 <= step - t.policy_version <= 2 for t in out.items)
        # each sample's weights are those of the version it says it came from: the restarted
        # actor got the current weights before its lost jobs were sent again
        assert all(t.reward == float(t.policy_version) for t in out.items)


def test_a_killed_generators_lost_jobs_are_sampled_as_they_were_sent():
    """The restarted actor gets each lost job after the weights the job was sent with, not the
    current ones: the run's rollouts (versions and what each version's weights made) equal those
    of a run whose generator never died. (Before: they came from the current weights, fresher
    than the schedule's, and a kill changed the run.)"""
    runs = []
    for kill_at in (None, 4):
        rollouts = toy_rollouts(steps=8, max_staleness=2)
        try:
            runs.append(train_toy(rollouts, ToyModel(), 8, kill_at=kill_at))
        finally:
            rollouts.close()
    whole, killed = ([[(t.policy_version, t.reward) for t in out.items] for out in run] for run in runs)
    assert killed == whole


def test_a_generator_killed_while_its_step_is_collected_sends_that_step_again():
    """The actor dies while the trainer waits for the step it is sampling. (Before: that step was
    no longer listed as in flight, so it was never sent again and the wait retried until Python's
    recursion limit.) The kill comes 1 s into a 3 s job; on a slow start it may land earlier,
    where the weight update's wait catches it instead, and the test still holds."""
    import threading

    rollouts = toy_rollouts(steps=2, delay=3.0, max_staleness=0)
    try:
        rollouts.update_weights(ToyModel().named_parameters(), 0)
        threading.Timer(1.0, lambda: ray.kill(rollouts.workers[0], no_restart=False)).start()
        out = rollouts.trajectories(0)
    finally:
        rollouts.close()
    assert [t.example for t in out.items] == [{"step": 0, "i": i} for i in range(4) for _ in range(2)]
    assert {t.policy_version for t in out.items} == {0}


def test_generator_resources_that_no_node_has_are_one_error():
    with pytest.raises(OmnigymError, match=r"no node of the Ray cluster has --generator-resources "
                                           r"\{\"omnigym_generator\": 1\}; start one with them: ray start --address"):
        toy_rollouts(resources={"omnigym_generator": 1})


def test_a_hung_generator_is_one_error_within_the_timeout(untimed_start):
    rollouts = toy_rollouts(delay=600.0, timeout=10.0, max_staleness=0)  # started without the clock
    try:
        with pytest.raises(OmnigymError, match=r"generator 0 gave no rollouts for step 0 within --sync-timeout 10 s"):
            train_toy(rollouts, ToyModel(), 1)
        assert time.monotonic() - untimed_start[0] < 10 + 30
    finally:
        rollouts.close()


# -- GRPO on Ray, end to end ---------------------------------------------------------------

from omnigym.algos import grpo  # noqa: E402


def small(run_dir, **extra):
    flags = dict(sft_steps=60, sft_target_accuracy=1.1, sft_eval_every=30, steps=5, prompts_per_step=2,
                 group_size=4, eval_size=20, eval_every=3, checkpoint_every=2, progress=False, plot=False,
                 tensorboard=False, runtime="ray", max_staleness=1, num_generators=2, rewards="format:1.0")
    return grpo.GRPOConfig(run_dir=str(run_dir), **{**flags, **extra})


def metrics(run_dir):
    rows = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]
    return [{k: v for k, v in row.items() if not k.startswith(("perf/", "async/generator_idle",
                                                              "async/trainer_idle"))} for row in rows]


@pytest.fixture(scope="session")
def one_node_grpo_run(tmp_path_factory):
    """The folder of one run of ``small()`` on a local Ray (about a minute of CPU): the run the
    killed-trainer test resumes to and test_ray_cluster's two-node runs must equal, made once per
    test session (pytest-xdist's workers share the session's folder and take turns under a file
    lock), and the warm-up stage those tests' other runs reuse."""
    import os

    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root  # the workers' common folder
    run_dir, done = root / "one-node-grpo-run", root / "one-node-grpo-run.done"
    with FileLock(str(root / "one-node-grpo-run.lock")):
        if not done.exists():
            shutil.rmtree(run_dir, ignore_errors=True)  # a run stopped half-way by an earlier test process
            owns_ray = not ray.is_initialized()  # else it joins the Ray of test_ray_runtime's fixture
            grpo.train(small(run_dir))
            assert ray.is_initialized() is not owns_ray  # a local Ray of its own is shut down with the run
            done.touch()
    return run_dir


def with_warm_up_of(made, run_dir):
    """``run_dir`` holding the finished warm-up stage of the run in ``made``, as a copy of that run
    would (its config too, so that ``--overwrite`` takes it for a run; not its log, which the
    tests below watch): a run there with ``--overwrite`` reuses the stage instead of training it."""
    shutil.copytree(Path(made) / "stages", Path(run_dir) / "stages")
    shutil.copy(Path(made) / "config.json", Path(run_dir) / "config.json")
    return Path(run_dir)


CLI_FLAGS = ["--sft-steps", "60", "--sft-target-accuracy", "1.1", "--sft-eval-every", "30", "--steps", "5",
             "--prompts-per-step", "2", "--group-size", "4", "--eval-size", "20", "--eval-every", "3",
             "--checkpoint-every", "2", "--no-progress", "--no-plot", "--no-tensorboard", "--runtime", "ray",
             "--max-staleness", "1", "--num-generators", "2", "--rewards", "format:1.0"]


def test_async_grpo_is_repeatable_bounded_and_a_killed_trainer_resumes_exactly(tmp_path, one_node_grpo_run, capsys):
    """Same seed, same metrics. The trainer's process killed (SIGKILL) after a checkpoint and
    resumed with --resume trains on the same rollouts and ends with the same metrics as a run
    that was never stopped. (The killed run is a second run of the same seed in another process:
    its steps before the kill equal the first run's, so it is the repeatability check too. It
    reuses the first run's warm-up stage: what repeats is the asynchronous GRPO, not the warm-up
    in the trainer's process, which test_stage_reuse.py shows logs the same reused or made.)"""
    import os
    import signal
    import subprocess

    from omnigym.cli import main

    whole = metrics(one_node_grpo_run)
    steps = [r for r in whole if "reward/mean" in r]
    assert len(steps) == 5 and all(r["async/staleness_max"] <= 1 for r in steps)
    assert steps[-1]["async/staleness_mean"] == 1.0 and "losses/policy_loss" in steps[-1]

    omnigym = str(Path(sys.executable).parent / "omnigym")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cut = with_warm_up_of(one_node_grpo_run, tmp_path / "cut")
    log = cut / "metrics.jsonl"
    trainer = subprocess.Popen([omnigym, "train", "grpo", *CLI_FLAGS, "--run-dir", str(cut), "--overwrite"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (log.exists() and len(log.read_text().splitlines()) >= 3):  # GRPO's third step: after a checkpoint
        assert trainer.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
        time.sleep(0.05)
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    assert len(log.read_text().splitlines()) < len(whole)  # killed before the end
    # resumed in this process, on the module's Ray: a process and a Ray start less than a command
    assert main(["train", "grpo", "--resume", str(cut)]) == 0, capsys.readouterr().err[-2000:]
    assert metrics(cut) == whole


@pytest.mark.parametrize("flags, message", [
    (["--runtime", "rey"], "unknown --runtime 'rey'; choose sync or ray"),
    (["--runtime", "ray", "--max-staleness", "-1"], "--max-staleness must be 0 or more, got -1"),
    (["--runtime", "ray", "--num-generators", "0"], "--num-generators must be positive, got 0"),
    (["--runtime", "ray", "--sync-timeout", "0"], "--sync-timeout must be positive, got 0.0"),
    (["--runtime", "ray", "--num-generators", "17"], "--num-generators 17 is more than the 16 prompts"),
    (["--num-generators", "2", "--max-staleness", "3"], "--max-staleness, --num-generators: read by --runtime ray only"),
    (["--ray-address", "127.0.0.1:6379"], "--ray-address: read by --runtime ray only"),
    (["--runtime", "ray", "--ray-address", "127.0.0.1:1"],
     "--ray-address 127.0.0.1:1: no Ray cluster answers there (Connection refused); start it with `ray start --head`"),
    (["--runtime", "ray", "--ray-address", "head-node"], "--ray-address head-node: not a Ray cluster address"),
    (["--runtime", "ray", "--generator-resources", "omnigym_generator"],
     "--generator-resources must be a JSON object of Ray resource names and positive amounts")])
def test_bad_runtime_flags_get_one_line_and_no_run_dir(tmp_path, capsys, flags, message):
    from omnigym.cli import main

    assert main(["train", "grpo", "--run-dir", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("omnigym: error:") and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_a_ray_address_in_the_environment_that_does_not_answer_is_one_line(tmp_path, capsys, monkeypatch):
    from omnigym.cli import main

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    assert main(["train", "grpo", "--run-dir", str(tmp_path / "run"), "--runtime", "ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("omnigym: error: RAY_ADDRESS=127.0.0.1:1: no Ray cluster answers there (Connection refused); "
                   "start it with `ray start --head`, or give the address it printed")
    assert not (tmp_path / "run").exists()


def test_ray_runtime_without_ray_names_the_extra(tmp_path, capsys, monkeypatch):
    import importlib.util

    from omnigym.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert main(["train", "grpo", "--run-dir", str(tmp_path / "run"), "--runtime", "ray"]) == 2
    assert "pip install 'omnigym[ray]'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
