"""DeepSpeed ZeRO-3 under torchrun on CPU (gloo): the weights are partitioned at rest, and
2 processes with half the batch each still take the steps of 1 process with all of it;
checkpoints move between process counts and backends; a config omnigym cannot use is one line.

Tolerance: the DDP/FSDP2 tests' (tests/test_data_parallel.py: the same parameters and Adam
moments to 1e-4 after the same steps; measured 3.6e-6 for SFT under ZeRO-3). The DeepSpeed
tests skip without it: it is the [deepspeed] extra, not in [dev] (an sdist that builds against
the installed torch: pip install --no-build-isolation 'omnigym[deepspeed]')."""

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from test_data_parallel import FLAGS, assert_same_state, needs_deepspeed, omnigym, trained  # noqa: E402

CONFIGS = Path(__file__).parent.parent / "configs" / "deepspeed"
ZERO3, ZERO3_OFFLOAD = str(CONFIGS / "zero3.json"), str(CONFIGS / "zero3-offload.json")


@pytest.fixture(scope="module")
def single_sft(tmp_path_factory):
    """SFT for 4 steps of batch 8 in one process: what the ZeRO-3 runs must match."""
    run = tmp_path_factory.mktemp("sft") / "one"
    omnigym("train", "sft", *FLAGS, "--steps", "4", "--batch-size", "8", "--run-dir", str(run))
    return run


@needs_deepspeed
def test_zero3_two_processes_take_the_steps_of_one_with_the_whole_batch(tmp_path, single_sft):
    run = tmp_path / "zero3"
    omnigym("train", "sft", *FLAGS, "--steps", "4", "--batch-size", "8", "--run-dir", str(run),
            "--deepspeed-config", ZERO3, processes=2, backend="deepspeed")
    one, two = trained(single_sft), trained(run)
    assert_same_state(one, two)
    from omnigym.models.lm import load_policy_and_tokenizer  # it trained: not the first weights

    first, _ = load_policy_and_tokenizer("tiny", 1)
    assert not torch.equal(first.state_dict()["model.embed_tokens.weight"], two["model"]["model.embed_tokens.weight"])
    # the exported model is the whole trained one, gathered from the partitions (full_model)
    from safetensors.torch import load_file

    exported = load_file(run / "model" / "model.safetensors")
    assert torch.equal(exported["model.embed_tokens.weight"], two["model"]["model.embed_tokens.weight"])
    # the held-out samples come from the KV sampler on gathered weights: the same replies
    assert (run / "samples.jsonl").read_text() == (single_sft / "samples.jsonl").read_text()


@needs_deepspeed
def test_zero3_resumes_across_process_counts(tmp_path):
    """2 steps in one process, 2 more under ZeRO-3 with CPU offload on 2, 2 more in one again:
    the same as 6 steps in one process."""
    straight, run = tmp_path / "straight", tmp_path / "run"
    omnigym("train", "sft", *FLAGS, "--steps", "6", "--batch-size", "8", "--run-dir", str(straight))
    omnigym("train", "sft", *FLAGS, "--steps", "2", "--batch-size", "8", "--run-dir", str(run))
    omnigym("train", "sft", *FLAGS, "--steps", "4", "--resume", str(run), "--deepspeed-config", ZERO3_OFFLOAD,
            processes=2, backend="deepspeed")
    assert trained(run)["optimizer"]["state"][0]["step"].item() == 4
    omnigym("train", "sft", *FLAGS, "--steps", "6", "--resume", str(run))
    assert_same_state(trained(straight), trained(run))


@needs_deepspeed
@pytest.mark.slow
def test_the_other_language_trainers_match_one_process_under_zero3(tmp_path):
    """DPO (its reference and sampled evaluation), the reward model, GRPO (warm-up stage,
    sampling with the KV sampler) and PPO-RLHF (policy and critic, each partitioned): 2
    processes under ZeRO-3 match 1."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"Say {i}", "chosen": f"yes {i} " * (1 + i % 3),
                                         "rejected": f"no{i}"}) + "\n" for i in range(40)))
    for algo in ("dpo", "rm"):
        flags = ["train", algo, "--data", str(pairs), "--steps", "3", "--batch-size", "6", "--eval-size", "8",
                 "--eval-every", "100", "--checkpoint-every", "3", "--no-progress", "--no-plot", "--no-tensorboard"]
        omnigym(*flags, "--run-dir", str(tmp_path / f"{algo}1"))
        omnigym(*flags, "--run-dir", str(tmp_path / f"{algo}2"), "--deepspeed-config", ZERO3, processes=2,
                backend="deepspeed")
        assert_same_state(trained(tmp_path / f"{algo}1"), trained(tmp_path / f"{algo}2"))
    grpo = ["train", "grpo", "--sft-steps", "4", "--sft-batch-size", "8", "--sft-target-accuracy", "1.1",
            "--steps", "2", "--prompts-per-step", "2", "--group-size", "4", "--eval-size", "8", "--eval-every",
            "100", "--checkpoint-every", "2", "--rewards", "length:1.0,format:1.0", "--no-skip-equal-groups",
            "--no-progress", "--no-plot", "--no-tensorboard"]
    omnigym(*grpo, "--run-dir", str(tmp_path / "grpo1"))
    omnigym(*grpo, "--run-dir", str(tmp_path / "grpo2"), "--deepspeed-config", ZERO3, processes=2, backend="deepspeed")
    assert_same_state(trained(tmp_path / "grpo1"), trained(tmp_path / "grpo2"))
    rlhf = ["train", "rlhf", "--reward-model", str(tmp_path / "rm1"), "--steps", "2", "--prompts-per-step", "8",
            "--minibatches", "2", "--ppo-epochs", "1", "--max-new-tokens", "8", "--eval-prompts", "4",
            "--eval-every", "100", "--checkpoint-every", "2", "--no-progress", "--no-plot", "--no-tensorboard"]
    omnigym(*rlhf, "--run-dir", str(tmp_path / "rlhf1"))
    omnigym(*rlhf, "--run-dir", str(tmp_path / "rlhf2"), "--deepspeed-config", ZERO3, processes=2,
            backend="deepspeed")
    for component in ("trainer", "value_trainer"):
        assert_same_state(trained(tmp_path / "rlhf1", component), trained(tmp_path / "rlhf2", component))


def launched(monkeypatch):
    """This process as one torchrun started (the launcher check passes; nothing connects)."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)


def refused(tmp_path, capsys, *flags) -> str:
    from omnigym.cli import main

    assert main(["train", "sft", "--run-dir", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("omnigym: error:"), err
    assert not (tmp_path / "run").exists()
    return err[0]


@pytest.mark.parametrize("backend", ["ddp", "fsdp2"])
def test_a_zero3_config_with_another_backend_is_one_line(tmp_path, capsys, monkeypatch, backend):
    launched(monkeypatch)
    err = refused(tmp_path, capsys, "--training-backend", backend, "--deepspeed-config", ZERO3)
    assert "--deepspeed-config is read by --training-backend deepspeed only" in err


@needs_deepspeed
@pytest.mark.parametrize("zero, message", [
    ({"stage": 2, "offload_param": {"device": "cpu"}},
     "sets zero_optimization.offload_param with stage 2; only ZeRO-3 partitions the weights it moves"),
    ({"stage": 0, "offload_optimizer": {"device": "cpu"}},
     "offload_optimizer with stage 0; offload needs ZeRO stage 1, 2 or 3"),
    ({"stage": 4}, "asks for ZeRO stage 4; DeepSpeed has stages 0-3")])
def test_an_offload_key_without_zero3_is_one_line(tmp_path, capsys, monkeypatch, zero, message):
    launched(monkeypatch)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": zero}))
    assert message in refused(tmp_path, capsys, "--training-backend", "deepspeed", "--deepspeed-config", str(path))


@needs_deepspeed
@pytest.mark.parametrize("owned", ["optimizer", "gradient_clipping", "train_batch_size"])
def test_a_zero3_config_that_sets_what_omnigym_owns_is_one_line(tmp_path, capsys, monkeypatch, owned):
    launched(monkeypatch)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({**json.loads(Path(ZERO3_OFFLOAD).read_text()), owned: 1}))
    err = refused(tmp_path, capsys, "--training-backend", "deepspeed", "--deepspeed-config", str(path))
    assert f"sets {owned}; omnigym sets those itself" in err

