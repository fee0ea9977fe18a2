"""Data-parallel training under torchrun on CPU (gloo): 2 processes with half the batch each
take the same steps as 1 process with the whole batch, checkpoints move between the two,
and a data-parallel flag without its launcher is one line.

Tolerance: the same parameters to 1e-4 after 4 steps (measured: 3.5e-6 for SFT under DDP
and FSDP2; the difference is float rounding of sums split across processes)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TOLERANCE = 1e-4
BIN = Path(sys.executable).parent
FLAGS = ["--eval-size", "20", "--eval-every", "100", "--checkpoint-every", "2", "--no-progress", "--no-plot",
         "--no-tensorboard"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def omnigym(*args, processes=1, backend=None):
    """``omnigym train ...`` in this process (what the CLI runs, without a second start-up's
    ~5 s of importing torch and transformers), or under torchrun in ``processes``."""
    if processes == 1:
        from omnigym.cli import main

        assert main(list(args)) == 0
        return
    command = [str(BIN / "torchrun"), "--nproc-per-node", str(processes), "--master-port", str(free_port()),
               "-m", "omnigym", *args, "--training-backend", backend]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trained(run_dir, component="trainer"):
    return torch.load(Path(run_dir) / "checkpoint.pt", weights_only=False)["components"][component]


def assert_same_state(a, b):
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        assert torch.allclose(a["model"][name].float(), b["model"][name].float(), atol=TOLERANCE, rtol=0), name
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    for i, state in a["optimizer"]["state"].items():
        assert torch.allclose(state["exp_avg"], b["optimizer"]["state"][i]["exp_avg"], atol=TOLERANCE, rtol=0)
    assert [g["params"] for g in a["optimizer"]["param_groups"]] == [g["params"] for g in b["optimizer"]["param_groups"]]


def assert_policy_steps_moved(state):
    """The GRPO steps compared had gradients (a reward graded within each group: the vowel share of
    a reply; with rewards all equal in a group the steps were zero, and two runs matched trivially)."""
    assert max(s["exp_avg"].abs().max().item() for s in state["optimizer"]["state"].values()) > 1e-6


@pytest.fixture(scope="module")
def single_sft(tmp_path_factory):
    """SFT for 4 steps of batch 8 in one process: what the data-parallel runs must match."""
    run = tmp_path_factory.mktemp("sft") / "one"
    omnigym("train", "sft", *FLAGS, "--steps", "4", "--batch-size", "8", "--run-dir", str(run))
    return run


@pytest.mark.parametrize("backend", ["ddp", "fsdp2"])
def test_two_processes_take_the_steps_of_one_with_the_whole_batch(tmp_path, single_sft, backend):
    run = tmp_path / backend
    omnigym("train", "sft", *FLAGS, "--steps", "4", "--batch-size", "8", "--run-dir", str(run), processes=2,
            backend=backend)
    one, two = trained(single_sft), trained(run)
    assert_same_state(one, two)
    assert not torch.equal(one["model"]["model.embed_tokens.weight"], trained_start(tmp_path))  # it trained
    assert (run / "model" / "model.safetensors").is_file()  # exported whole, from the first process


def trained_start(tmp_path):
    """The tiny model's weights before training (same seed)."""
    from omnigym.models.lm import load_policy_and_tokenizer

    model, _ = load_policy_and_tokenizer("tiny", 1)
    return model.state_dict()["model.embed_tokens.weight"]


@pytest.mark.parametrize("first, then", [("ddp", None), (None, "fsdp2")])
def test_checkpoints_move_between_one_process_and_two(tmp_path, single_sft, first, then):
    """2 steps on one side, resumed for 2 more on the other: the same as 4 in one process."""
    run = tmp_path / "run"
    start = ["train", "sft", *FLAGS, "--steps", "2", "--batch-size", "8", "--run-dir", str(run)]
    omnigym(*start, processes=2 if first else 1, backend=first)
    resume = ["train", "sft", *FLAGS, "--steps", "4", "--resume", str(run)]
    omnigym(*resume, processes=2 if then else 1, backend=then)
    assert_same_state(trained(single_sft), trained(run))


def test_the_other_language_trainers_match_one_process(tmp_path):
    """GRPO (warm-up, reference model and policy steps) and PPO-RLHF under FSDP2, DPO and the
    reward model under DDP: 2 processes match 1."""
    grpo = ["train", "grpo", "--sft-steps", "4", "--sft-batch-size", "8", "--sft-target-accuracy", "1.1",
            "--steps", "2", "--prompts-per-step", "2", "--group-size", "4", "--eval-size", "8", "--eval-every",
            "100", "--checkpoint-every", "2", "--rewards", "gold_vowels:1.0", "--no-skip-equal-groups",
            "--no-progress", "--no-plot", "--no-tensorboard"]
    omnigym(*grpo, "--run-dir", str(tmp_path / "grpo1"))
    omnigym(*grpo, "--run-dir", str(tmp_path / "grpo2"), processes=2, backend="fsdp2")
    assert_same_state(trained(tmp_path / "grpo1"), trained(tmp_path / "grpo2"))
    assert_policy_steps_moved(trained(tmp_path / "grpo1"))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"Say {i}", "chosen": f"yes {i} " * (1 + i % 3),
                                         "rejected": f"no{i}"}) + "\n" for i in range(40)))
    for algo in ("dpo", "rm"):
        flags = ["train", algo, "--data", str(pairs), "--steps", "3", "--batch-size", "6", "--eval-size", "8",
                 "--eval-every", "100", "--checkpoint-every", "3", "--no-progress", "--no-plot", "--no-tensorboard"]
        omnigym(*flags, "--run-dir", str(tmp_path / f"{algo}1"))
        omnigym(*flags, "--run-dir", str(tmp_path / f"{algo}2"), processes=2, backend="ddp")
        assert_same_state(trained(tmp_path / f"{algo}1"), trained(tmp_path / f"{algo}2"))
    # PPO-RLHF on that reward model: the policy and its critic, each data-parallel
    rlhf = ["train", "rlhf", "--reward-model", str(tmp_path / "rm1"), "--steps", "2", "--prompts-per-step", "8",
            "--minibatches", "2", "--ppo-epochs", "1", "--max-new-tokens", "8", "--eval-prompts", "4",
            "--eval-every", "100", "--checkpoint-every", "2", "--no-progress", "--no-plot", "--no-tensorboard"]
    omnigym(*rlhf, "--run-dir", str(tmp_path / "rlhf1"))
    omnigym(*rlhf, "--run-dir", str(tmp_path / "rlhf2"), processes=2, backend="fsdp2")
    for component in ("trainer", "value_trainer"):
        assert_same_state(trained(tmp_path / "rlhf1", component), trained(tmp_path / "rlhf2", component))


def test_grpo_micro_batches_on_two_processes_match_one_process_taking_the_whole_batch(tmp_path):
    """--micro-batch-size under DDP: 8 replies a step in two micro-batches of 4, each split over
    the 2 processes (2 rows a pass each), the gradients accumulated: the same steps as one process
    with the whole batch in one pass."""
    grpo = ["train", "grpo", "--sft-steps", "4", "--sft-batch-size", "8", "--sft-target-accuracy", "1.1",
            "--steps", "2", "--prompts-per-step", "2", "--group-size", "4", "--eval-size", "8", "--eval-every",
            "100", "--checkpoint-every", "2", "--rewards", "gold_vowels:1.0", "--no-skip-equal-groups",
            "--no-progress", "--no-plot", "--no-tensorboard"]
    omnigym(*grpo, "--run-dir", str(tmp_path / "one"))
    omnigym(*grpo, "--micro-batch-size", "2", "--run-dir", str(tmp_path / "two"), processes=2, backend="ddp")
    assert_same_state(trained(tmp_path / "one"), trained(tmp_path / "two"))
    assert_policy_steps_moved(trained(tmp_path / "one"))


@pytest.mark.parametrize("flags, message", [
    (["--training-backend", "ddp"], "--training-backend ddp trains on the processes its launcher starts: torchrun"),
    # the launcher the README shows for every backend (the message named deepspeed's alone, which the README does not use)
    (["--training-backend", "deepspeed"], "launcher starts: torchrun --nproc-per-node 2 -m omnigym train ... "
                                          "--training-backend deepspeed (or DeepSpeed's launcher"),
    (["--training-backend", "fsdp3"], "unknown --training-backend 'fsdp3'; choose local, ddp, fsdp2, deepspeed"),
    (["--deepspeed-config", "ds.json"], "--deepspeed-config is read by --training-backend deepspeed only")])
def test_data_parallel_flags_without_their_launcher_are_one_line(tmp_path, capsys, flags, message):
    from omnigym.cli import main

    assert main(["train", "sft", "--run-dir", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("omnigym: error:") and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_grpo_refuses_ray_with_a_data_parallel_backend(tmp_path, capsys, monkeypatch):
    from omnigym.cli import main

    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    assert main(["train", "grpo", "--run-dir", str(tmp_path / "run"), "--runtime", "ray", "--training-backend", "ddp"]) == 2
    assert "use --training-backend local with it" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_refused_data_parallel_run_leaves_nothing(tmp_path):
    """Under torchrun a bad flag (refused by every process) and a finished run's directory
    (refused by the first, which tells the others): one line from the first process, a
    non-zero exit, no omnigym traceback from any, nothing written."""
    finished = tmp_path / "finished"
    omnigym("train", "sft", *FLAGS, "--steps", "1", "--batch-size", "4", "--run-dir", str(finished))
    before = {p: p.read_bytes() for p in finished.rglob("*") if p.is_file()}
    for flags, message in ((["--steps", "0", "--run-dir", str(tmp_path / "run")], "--steps must be positive, got 0"),
                           (["--steps", "2", "--run-dir", str(finished)], "already holds a run")):
        command = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port()), "-m",
                   "omnigym", "train", "sft", "--training-backend", "ddp", *flags]
        done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)
        assert done.returncode != 0 and done.stderr.count("omnigym: error:") == 1, done.stderr[-3000:]
        assert message in done.stderr
        # torchrun reports a child's non-zero exit in its own words; omnigym's code raised nothing
        assert "omnigym/" not in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "run").exists()
    assert before == {p: p.read_bytes() for p in finished.rglob("*") if p.is_file()}
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_torchrun_with_the_local_backend_is_refused(tmp_path, capsys, monkeypatch):
    """Each process would train alone into its own run directory."""
    from omnigym.cli import main

    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    assert main(["train", "sft", "--run-dir", str(tmp_path / "run")]) == 2
    assert "torchrun started 2 processes but --training-backend is local" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv", [["dpo"], ["rm"], ["rlhf"], ["online_dpo"]])
def test_the_demo_under_torchrun_is_one_line(tmp_path, capsys, monkeypatch, argv):
    """The demo's SFT stage met the launcher with the local backend: "--training-backend is local" was said to a
    user who had given fsdp2 (docs/scale_out.md's own command)."""
    from omnigym.cli import main

    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    assert main(["train", *argv, "--training-backend", "fsdp2", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["omnigym: error: the demo's stages (no data of your own given) are made in one process, not under "
                   "--training-backend fsdp2: give your own data (--data PAIRS.jsonl; rlhf and online_dpo: "
                   "--reward-model or --rewards), or run the demo without torchrun"], err
    assert not (tmp_path / "run").exists()


# -- DeepSpeed ZeRO (the [deepspeed] extra; not in [dev]: it builds from source against torch) --

needs_deepspeed = pytest.mark.skipif(__import__("importlib").util.find_spec("deepspeed") is None,
                                     reason="deepspeed is not installed (the [deepspeed] extra, not in [dev])")
ZERO2 = str(Path(__file__).parent.parent / "configs" / "deepspeed" / "zero2.json")


@needs_deepspeed
def test_deepspeed_zero2_matches_one_process_and_its_checkpoints_move(tmp_path, single_sft):
    run = tmp_path / "ds"
    omnigym("train", "sft", *FLAGS, "--steps", "4", "--batch-size", "8", "--run-dir", str(run),
            "--deepspeed-config", ZERO2, processes=2, backend="deepspeed")
    assert_same_state(trained(single_sft), trained(run))
    half = tmp_path / "half"  # 2 steps in one process, 2 more under DeepSpeed
    omnigym("train", "sft", *FLAGS, "--steps", "2", "--batch-size", "8", "--run-dir", str(half))
    omnigym("train", "sft", *FLAGS, "--steps", "4", "--resume", str(half), "--deepspeed-config", ZERO2,
            processes=2, backend="deepspeed")
    assert_same_state(trained(single_sft), trained(half))


@needs_deepspeed
def test_grpo_with_its_warm_up_stage_matches_one_process_under_deepspeed(tmp_path):
    """The warm-up is a stage with its own model and backend, so it runs under DeepSpeed (it
    used to need --sft-steps 0 there); every group skipped before the first checkpoint leaves
    DeepSpeed without moments, which the checkpoint must take (it raised inside DeepSpeed)."""
    grpo = ["train", "grpo", "--sft-steps", "4", "--sft-batch-size", "8", "--sft-target-accuracy", "1.1",
            "--sft-eval-every", "2", "--steps", "2", "--prompts-per-step", "2", "--group-size", "2",
            "--eval-size", "4", "--checkpoint-every", "1", "--no-progress", "--no-plot", "--no-tensorboard"]
    omnigym(*grpo, "--run-dir", str(tmp_path / "one"))
    omnigym(*grpo, "--run-dir", str(tmp_path / "two"), "--deepspeed-config", ZERO2, processes=2, backend="deepspeed")
    for stage in ("stages/warmup", "."):
        rows = [[json.loads(line) for line in (tmp_path / run / stage / "metrics.jsonl").read_text().splitlines()]
                for run in ("one", "two")]
        assert len(rows[0]) == len(rows[1]) > 0
        for a, b in zip(*rows):
            assert a.keys() == b.keys()
            assert all(abs(a[k] - b[k]) <= 1e-3 for k in a if isinstance(a[k], float) and not k.startswith("perf/"))
    assert_same_state(trained(tmp_path / "one"), trained(tmp_path / "two"))


@needs_deepspeed
@pytest.mark.parametrize("config, message", [
    ({"zero_optimization": {"stage": 5}}, "asks for ZeRO stage 5; DeepSpeed has stages 0-3"),
    ({"optimizer": {"type": "Adam"}}, "sets optimizer; omnigym sets those itself"),
    (None, "cannot read --deepspeed-config"),
    ("{not json", "is not JSON")])
def test_a_deepspeed_config_omnigym_cannot_use_is_one_line(tmp_path, capsys, monkeypatch, config, message):
    from omnigym.cli import main

    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "ds.json"
    if config is not None:
        path.write_text(config if isinstance(config, str) else json.dumps(config))
    assert main(["train", "sft", "--run-dir", str(tmp_path / "run"), "--training-backend", "deepspeed",
                 "--deepspeed-config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "run").exists()


def test_distillation_on_two_processes_logs_the_whole_batch(tmp_path):
    """Distillation under DDP: each process trains on its share of the replies, and the logged
    figures (the reverse KL, the monitor's signal and its length correlation) are the whole batch's,
    as one process logs them; the states match too."""
    from omnigym.models.lm import build_tiny_model

    small = dict(hidden=32, layers=1, heads=2, max_positions=64)
    student = build_tiny_model(tmp_path / "student", seed=0, **small)
    teacher = build_tiny_model(tmp_path / "teacher", seed=1, **small)
    flags = ["train", "distill", "--model", str(student), "--teacher", str(teacher), "--steps", "3",
             "--prompts-per-step", "4", "--samples-per-prompt", "2", "--max-new-tokens", "6", "--eval-size", "8",
             "--eval-every", "2", "--checkpoint-every", "3", "--no-progress", "--no-plot", "--no-tensorboard"]
    omnigym(*flags, "--run-dir", str(tmp_path / "one"))
    omnigym(*flags, "--run-dir", str(tmp_path / "two"), processes=2, backend="ddp")
    assert_same_state(trained(tmp_path / "one"), trained(tmp_path / "two"))
    rows = [[json.loads(line) for line in open(tmp_path / run / "metrics.jsonl")] for run in ("one", "two")]
    keys = ("distill/reverse_kl", "distill/signal", "reward/mean", "completion/length", "hacking/length_reward_corr",
            "hacking/echo_rate")
    assert len(rows[0]) == len(rows[1]) == 3
    for one, two in zip(*rows):
        for key in keys:
            assert one[key] == pytest.approx(two[key], abs=1e-5), (one["global_step"], key, one[key], two[key])
