import os
import tempfile

# torch picks its CPU kernels by the instruction set (AVX-512 where there is one, else AVX2), and
# the two round differently: the learning tests' trajectories (the GRPO tool-env tests pass by a few
# hundredths) were measured on AVX2 kernels and moved on an AVX-512 machine. Same seed, same numbers
# on any x86 machine: the tests use the AVX2 kernels (read when torch is imported, so first here).
os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
# Inductor's compiled kernels are cached on disk keyed by their source, not by the kernels torch
# loaded beside them: a cache written by a process on the AVX-512 kernels (any `omnigym --compile`
# run outside the tests) segfaults a test process on the AVX2 ones. The tests keep their own cache.
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR",
    os.path.join(tempfile.gettempdir(), f"omnigym-tests-inductor-{os.environ['ATEN_CPU_CAPABILITY']}"),
)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# What omnigym.cli sets for its own process, set before transformers is first imported here,
# so that main() called in this process prints what the command prints.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# A test process imports mujoco once for many tests, and mujoco and PyOpenGL fix their GL backend
# then: headless (EGL), as the entry point sets it (test_video checks the unset case in a fresh process).
from omnigym.cli import headless_by_default  # noqa: E402

headless_by_default(os.environ)

import time

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture
def fast(tmp_path):
    """Flags that keep a test run quiet and small."""
    return {"run_dir": str(tmp_path / "run"), "progress": False, "plot": False, "tensorboard": False}


@pytest.fixture
def untimed_start(monkeypatch):
    """Ray actors start without the --sync-timeout clock (on a loaded 2-core machine an actor took
    over 30 s to start, so a test about a hung job failed with "did not start" instead); the
    jobs after the start are timed as always. Yields a list that gets the time each start ended."""
    from omnigym.runtime.ray_actors import RaySchedule

    real, started = RaySchedule._wait_started, []

    def wait_started(self):
        timeout, self.timeout = self.timeout, 900.0
        try:
            real(self)
        finally:
            self.timeout = timeout
        started.append(time.monotonic())

    monkeypatch.setattr(RaySchedule, "_wait_started", wait_started)
    yield started


@pytest.fixture(scope="session")
def rlhf_demo_run(tmp_path_factory):
    """A run of the offline RLHF demo (seed 1) with its finished stages: the SFT policy, the 2000
    gold-labelled pairs and the reward model (about 90 s of CPU). The PPO-RLHF and online DPO demo
    tests made the same stages each; now they copy this run and train with --overwrite, which
    reuses them as a user's second start of the demo does and logs what making them would have
    (tests/test_stage_reuse.py). Made once per test session: pytest-xdist's workers share the
    session's folder and take turns under a file lock."""
    from filelock import FileLock

    from omnigym.algos import online_dpo
    from omnigym.pipelines.rlhf_demo import finished

    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root  # the workers' common folder
    run_dir = root / "rlhf-demo-run"
    with FileLock(str(root / "rlhf-demo-run.lock")):
        if not finished(run_dir / "stages" / "rm", 1):  # the last stage: the others are finished before it
            online_dpo.train(online_dpo.OnlineDPOConfig(run_dir=str(run_dir), progress=False, plot=False,
                                                        tensorboard=False, seed=1, steps=1, eval_prompts=8,
                                                        overwrite=run_dir.exists()))
    return run_dir


def pytest_collection_modifyitems(config, items):
    """The slow learning tests first: a test of minutes that starts near the end of the suite
    keeps one core busy after the other has run out of work. The Makefile's pytest-xdist hands
    tests out one at a time from the front of this list, so both workers start on these. Stable,
    so the order is otherwise the files' own."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
