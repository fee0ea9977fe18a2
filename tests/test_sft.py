"""omnigym train sft: the data formats, what the loss sees, learning, exact resume, bad input."""

import json
import subprocess
import sys

import pytest

from omnigym.errors import OmnigymError
from omnigym.tasks.sft_data import pack, read_sft_rows, to_sequence, tokenize_rows


@pytest.fixture(scope="module")
def tokenizer():
    from omnigym.models.lm import load_policy_and_tokenizer

    return load_policy_and_tokenizer("tiny")[1]


def trained_text(tokenizer, ids, trained):
    return tokenizer.decode([t for t, m in zip(ids, trained) if m])


def test_each_format_trains_on_its_replies_only_as_text(tokenizer):
    # The trained tokens read as text; that they are the tokens TRL trains on, with the same
    # loss, is checked against TRL's own SFTTrainer in test_references.py.
    ids, trained = to_sequence("row", {"prompt": "2+2=", "completion": "4"}, tokenizer, True)
    assert tokenizer.decode(ids) == "2+2=4<|end|>" and trained_text(tokenizer, ids, trained) == "4<|end|>"
    ids, trained = to_sequence("row", {"prompt": "2+2=", "completion": "4"}, tokenizer, False)
    assert trained_text(tokenizer, ids, trained) == "2+2=4<|end|>"
    conversation = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": "hello"}, {"role": "user", "content": "2+2?"},
                                 {"role": "assistant", "content": "4"}]}
    ids, trained = to_sequence("row", conversation, tokenizer, True)
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(conversation["messages"], tokenize=False)
    assert trained_text(tokenizer, ids, trained) == "hello<|end|>4<|end|>"  # assistant turns only
    ids, trained = to_sequence("row", {"prompt": [{"role": "user", "content": "2+2?"}],
                                       "completion": [{"role": "assistant", "content": "4"}]}, tokenizer, True)
    assert tokenizer.decode(ids) == "<|user|>2+2?<|end|><|assistant|>4<|end|>"
    assert trained_text(tokenizer, ids, trained) == "4<|end|>"
    ids, trained = to_sequence("row", {"text": "plain words"}, tokenizer, True)
    assert trained_text(tokenizer, ids, trained) == "plain words<|end|>"


def test_truncation_is_counted_and_prompts_too_long_are_dropped(tokenizer):
    rows = [("a", {"prompt": "x" * 5, "completion": "y" * 20}), ("b", {"prompt": "x" * 30, "completion": "y"}),
            ("c", {"prompt": "x", "completion": "y"})]
    data = tokenize_rows(rows, tokenizer, max_length=12)
    assert (data.truncated, data.dropped, len(data.sequences)) == (2, 1, 2)
    assert all(len(ids) <= 12 for ids, _ in data.sequences)
    with pytest.raises(OmnigymError, match="no example has a token left to learn from within --max-length 12"):
        tokenize_rows(rows[1:2], tokenizer, max_length=12)
    blocks = pack(data.sequences, 8)
    assert [len(ids) for ids, _ in blocks] == [8, 7]  # 12 + 3 tokens in blocks of 8, the last one what is left
    assert blocks[0] == (data.sequences[0][0][:8], data.sequences[0][1][:8])


def test_bad_rows_name_their_file_and_line(tmp_path, tokenizer):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n" + json.dumps({"question": "q"}) + "\n")
    rows = read_sft_rows(str(path))
    with pytest.raises(OmnigymError, match=r"data.jsonl:2: an SFT row needs prompt and completion, messages, or "
                                           r"text; it has question"):
        tokenize_rows(rows, tokenizer, 64)
    with pytest.raises(OmnigymError, match="x.jsonl:7: the completion is empty"):
        to_sequence("x.jsonl:7", {"prompt": "a", "completion": " "}, tokenizer, True)
    with pytest.raises(OmnigymError, match="no assistant turn"):
        to_sequence("r", {"messages": [{"role": "user", "content": "hi"}]}, tokenizer, True)
    plain = type(tokenizer).__new__(type(tokenizer))
    plain.__dict__.update(tokenizer.__dict__)
    plain.chat_template = None
    with pytest.raises(OmnigymError, match="conversational data needs a chat template"):
        to_sequence("r", {"messages": [{"role": "assistant", "content": "hi"}]}, plain, True)


def test_a_dataset_folder_loads_through_datasets(tmp_path):
    pytest.importorskip("datasets")
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(5)))
    rows = read_sft_rows(str(folder))
    assert [row["text"] for _, row in rows] == [f"line {i}" for i in range(5)] and rows[0][0].endswith("[train][0]")


def sft(tmp_path, name, **kwargs):
    from omnigym.algos.lm.sft import SFTConfig, train

    where = {"resume": str(tmp_path / name)} if kwargs.pop("resume", False) else {"run_dir": str(tmp_path / name)}
    cfg = SFTConfig(**where, progress=False, plot=False, tensorboard=False, eval_size=50,
                    batch_size=8, eval_every=10, checkpoint_every=10, **kwargs)
    return train(cfg)


def metrics(run_dir):
    return [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]


def test_sft_learns_the_demonstrations_and_resumes_exactly(tmp_path):
    whole = sft(tmp_path, "whole", steps=40)
    assert whole["heldout_loss"] < 0.5 * whole["initial_heldout_loss"]
    first = sft(tmp_path, "resumed", steps=20)
    resumed = sft(tmp_path, "resumed", steps=40, resume=True)
    assert resumed["heldout_loss"] == pytest.approx(whole["heldout_loss"], abs=0)

    def drop_speed(rows):
        return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]

    assert drop_speed(metrics(first["run_dir"])) == drop_speed(metrics(whole["run_dir"]))


def test_sft_from_a_jsonl_file_with_packing_on_the_command_line(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "completion": str(i + 1)}) + "\n" for i in range(80)))
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "omnigym.cli", "train", "sft", "--data", str(path), "--eval-size", "10",
           "--steps", "10", "--packing", "--max-length", "32", "--run-dir", str(run_dir), "--no-progress", "--no-plot"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "held-out loss:" in done.stderr and "cut at --max-length 32: 0 of 80" in done.stderr
    bad = subprocess.run(cmd[:6] + [str(tmp_path / "missing.jsonl"), "--run-dir", str(tmp_path / "never")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [f"omnigym: error: no such file: {tmp_path / 'missing.jsonl'}"]
    assert not (tmp_path / "never").exists()


def test_sources_that_are_not_there_fail_at_once_and_json_arrays_load(tmp_path, tokenizer):
    import time

    start = time.monotonic()
    for missing in ("dsfoldr", "./nope", str(tmp_path / "nope.json")):
        with pytest.raises(OmnigymError, match=f"--data {missing}: no such file or folder"):
            read_sft_rows(missing)
    assert time.monotonic() - start < 5  # no trip to a hub
    pytest.importorskip("datasets")
    array = tmp_path / "pairs.json"
    array.write_text(json.dumps([{"prompt": "1+1=", "completion": "2"}, {"prompt": "2+2=", "completion": "4"}]))
    assert [row["completion"] for _, row in read_sft_rows(str(array))] == ["2", "4"]


def test_packing_keeps_whole_examples_and_held_out_trouble_says_so(tokenizer):
    rows = [(f"r{i}", {"text": "word " * 40}) for i in range(3)]
    whole = tokenize_rows(rows, tokenizer, None)
    assert whole.truncated == 0 and len(whole.sequences[0][0]) == 201
    blocks = pack(whole.sequences, 64)
    assert sum(len(ids) for ids, _ in blocks) == 3 * 201  # every token of every example, in blocks of 64
    with pytest.raises(OmnigymError, match="no held-out example has a token left"):
        tokenize_rows([("p", {"prompt": "x" * 30, "completion": "y"})], tokenizer, 10, which="held-out ")


def test_a_resumed_run_stopped_early_does_not_pass_its_old_model_off_as_finished(tmp_path, monkeypatch, capsys):
    """A finished run resumed for more steps kept its old model/ while it trained: stopped early, it looked
    finished, and eval and --model RUN used the model of its earlier end in silence. Finishing writes
    model/ anew."""
    from omnigym.backends.local import LocalBackend
    from omnigym.cli import main

    sft(tmp_path, "run", steps=10)
    original, count = LocalBackend.optim_step, {"n": 0}

    def stopping_step(self):
        count["n"] += 1
        if count["n"] == 5:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(LocalBackend, "optim_step", stopping_step)
    with pytest.raises(KeyboardInterrupt):
        sft(tmp_path, "run", steps=30, resume=True)
    monkeypatch.setattr(LocalBackend, "optim_step", original)
    run = tmp_path / "run"
    for argv in (["eval", str(run)], ["train", "sft", "--model", str(run), "--run-dir", str(tmp_path / "next")]):
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "the run was resumed and has not finished: its model/ is from its earlier end" in \
            err[0] and f"finish it with: omnigym train sft --resume {run}" in err[0], err
    sft(tmp_path, "run", steps=30, resume=True)
    assert not (run / "model" / "omnigym_resumed.txt").exists()
