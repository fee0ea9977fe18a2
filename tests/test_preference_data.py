"""Preference pairs in TRL's formats and as HH-RLHF ships them; bad rows are one line naming the row."""

import gzip
import json
from pathlib import Path

import pytest

from omnigym.errors import OmnigymError
from omnigym.models.lm import load_tokenizer
from omnigym.tasks.preference_data import hh_messages, read_pairs, read_prompts, split_row, tokenize_pairs

HH = Path(__file__).resolve().parents[2] / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from omnigym.models.lm import build_tiny_model

    return load_tokenizer(str(build_tiny_model(tmp_path_factory.mktemp("tiny"))))


def test_explicit_implicit_and_conversational_rows_split_the_same_way():
    user = [{"role": "user", "content": "hi"}]
    good, bad = [{"role": "assistant", "content": "hello"}], [{"role": "assistant", "content": "go away"}]
    assert split_row("r", {"prompt": "Q: 1+1?", "chosen": " 2", "rejected": " 3"}) == ("Q: 1+1?", " 2", " 3")
    assert split_row("r", {"prompt": user, "chosen": good, "rejected": bad}) == (user, good, bad)
    assert split_row("r", {"chosen": user + good, "rejected": user + bad}) == (user, good, bad)
    # implicit text: the shared beginning, cut back to a word boundary
    assert split_row("r", {"chosen": "The sky is blue.", "rejected": "The sky is green."}) == \
        ("The sky is ", "blue.", "green.")


def test_hh_rlhf_transcripts_become_conversations():
    row = {"chosen": "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how are you?\n\nAssistant: fine, thanks",
           "rejected": "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how are you?\n\nAssistant: go away"}
    prompt, chosen, rejected = split_row("hh:1", row)
    assert [m["role"] for m in prompt] == ["user", "assistant", "user"]
    assert prompt[-1]["content"] == "how are you?"
    assert chosen == [{"role": "assistant", "content": "fine, thanks"}]
    assert rejected == [{"role": "assistant", "content": "go away"}]
    assert hh_messages("x", "\n\nHuman: a\n\nAssistant: b") == [{"role": "user", "content": "a"},
                                                                 {"role": "assistant", "content": "b"}]


def test_tokenized_pairs_share_the_prompt_and_end_with_eos(tokenizer):
    rows = [("r:1", {"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "ab"}],
                     "rejected": [{"role": "assistant", "content": "abc"}], "margin": 2})]
    data = tokenize_pairs(rows, tokenizer, 64)
    pair = data.pairs[0]
    assert tokenizer.decode(pair.prompt).endswith("<|assistant|>")
    assert pair.chosen[-1] == pair.rejected[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(pair.chosen[:-1]) == "ab" and pair.margin == 2.0


def test_long_prompts_are_dropped_and_cuts_are_counted(tokenizer):
    long_prompt = ("r:1", {"prompt": "x" * 50, "chosen": "a", "rejected": "b"})
    long_reply = ("r:2", {"prompt": "q", "chosen": "a" * 40 + "1", "rejected": "a" * 40 + "2"})
    ok = ("r:3", {"prompt": "q", "chosen": "a" * 30, "rejected": "b" * 30})
    data = tokenize_pairs([long_prompt, long_reply, ok], tokenizer, 20)
    assert (len(data.pairs), data.truncated, data.dropped) == (1, 2, 2)  # r:2 becomes the same reply when cut
    with pytest.raises(OmnigymError, match="no pair is left within --max-length 20"):
        tokenize_pairs([long_prompt], tokenizer, 20)


def test_unusable_pairs_are_left_out_with_one_line(tokenizer, capsys):
    rows = [("r:1", {"prompt": "q", "chosen": "same", "rejected": "same"}), ("r:2", {"prompt": "q", "chosen": "a", "rejected": " "}),
            ("r:3", {"prompt": "q", "chosen": "a", "rejected": "b"})]
    data = tokenize_pairs(rows, tokenizer, 64)
    assert len(data.pairs) == 1 and data.dropped == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "omnigym: note: left out r:1: chosen and rejected are the same reply; a pair must differ (and 1 more such rows)"]


@pytest.mark.parametrize("seed", range(1, 9))
def test_a_left_out_pair_never_refuses_the_file_whatever_the_seed(tmp_path, tokenizer, seed):
    """Whether the shuffled first row was the unusable one decided, by seed, between a note and a refusal."""
    rows = [{"prompt": f"q{i}", "chosen": f"good answer {i}", "rejected": f"bad {i}"} for i in range(20)]
    rows.append({"prompt": "x", "chosen": "a", "rejected": "a"})
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    _, heldout, training, conversational = read_pairs(str(data), "train", seed, 2, tokenizer, 64)
    assert len(heldout.pairs) + len(training.pairs) == 20 and not conversational


@pytest.mark.parametrize("row, message", [
    ({"prompt": "q", "chosen": "a"}, "r:7: a preference row needs chosen and rejected"),
    ({"prompt": "q", "chosen": "same", "rejected": "same"}, "r:7: chosen and rejected are the same reply"),
    ({"prompt": "q", "chosen": "  ", "rejected": "b"}, "r:7: the chosen reply is empty"),
    ({"prompt": "q", "chosen": "a", "rejected": ["b"]}, "r:7: prompt, chosen and rejected must all be strings"),
    ({"prompt": "q", "chosen": "a", "rejected": "b", "margin": "big"}, "r:7: margin must be a finite number"),
    # made the loss inf, blamed on "the env's observations"
    ({"prompt": "q", "chosen": "a", "rejected": "b", "margin": float("inf")}, "r:7: margin must be a finite number"),
    ({"chosen": [{"role": "user", "content": "x"}], "rejected": [{"role": "user", "content": "y"}]},
     "r:7: chosen and rejected do not end in different assistant replies"),
])
def test_bad_rows_name_the_row(tokenizer, row, message):
    with pytest.raises(OmnigymError, match=message):
        tokenize_pairs([("r:7", row)], tokenizer, 64)


def test_conversational_pairs_need_a_chat_template(tokenizer):
    import copy

    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = None
    row = {"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "a"}],
           "rejected": [{"role": "assistant", "content": "b"}]}
    with pytest.raises(OmnigymError, match="r:1: conversational data needs a chat template"):
        tokenize_pairs([("r:1", row)], tokenizer, 64)


def test_missing_field_in_a_file_names_file_and_line(tmp_path, tokenizer):
    path = tmp_path / "pairs.jsonl"
    rows = [{"prompt": "q", "chosen": f"a{i}", "rejected": f"b{i}"} for i in range(5)] + [{"prompt": "q", "chosen": "a"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(OmnigymError, match=f"{path}:6: a preference row needs chosen and rejected"):
        read_pairs(str(path), "train", 1, 2, tokenizer, 64)


def test_prompts_for_rl_come_from_any_row_shape(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "p1"}, {"question": "p2"}, {"chosen": "Q? yes", "rejected": "Q? no"},
            {"messages": [{"role": "user", "content": "p4"}, {"role": "assistant", "content": "r"}]}, {"other": 1}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    assert [p for _, p in read_prompts(str(path), "train", 1)] == ["p1", "p2", "Q? ", [{"role": "user", "content": "p4"}]]
    path.write_text(json.dumps(rows[4]) + "\n")
    with pytest.raises(OmnigymError, match=f"{path}:1: a prompt row needs prompt"):
        read_prompts(str(path), "train", 1)


@pytest.mark.skipif(not HH.exists(), reason="../shared/data/hh-rlhf is not here (it is not part of the package)")
def test_hh_rlhf_harmless_base_reads_as_it_comes(tokenizer):
    with gzip.open(HH, "rt") as f:
        rows = [(f"hh:{i}", json.loads(line)) for i, line in enumerate(f, 1) if i <= 300]
    data = tokenize_pairs(rows, tokenizer, 1024)  # row 87's chosen reply is empty: left out, counted
    assert len(data.pairs) + data.dropped == 300 and len(data.pairs) > 250 and data.dropped >= 1
    pair = data.pairs[0]
    assert tokenizer.decode(pair.prompt).startswith("<|user|>") and pair.chosen != pair.rejected


def test_a_pair_with_an_empty_reply_still_gives_its_prompt(tmp_path):
    path = tmp_path / "hh.jsonl"
    path.write_text(json.dumps({"chosen": "\n\nHuman: hi\n\nAssistant: ", "rejected": "\n\nHuman: hi\n\nAssistant: go"}) + "\n")
    assert [p for _, p in read_prompts(str(path), "train", 1)] == [[{"role": "user", "content": "hi"}]]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_file_with_bad_rows_names_its_first_whatever_the_seed(tokenizer, tmp_path, seed):
    """The rows are read in a seeded shuffle: the refusal named whichever bad row the seed put first (line 18 or
    31 for some seeds), and after it was fixed, another. Now the first in the file (line 4), for any seed."""
    from omnigym.algos.lm.sft import SFTConfig, shuffled_rows, tokenized_examples

    pairs, sft = tmp_path / "pairs.jsonl", tmp_path / "sft.jsonl"
    bad = {3, 17, 30}
    pairs.write_text("".join(json.dumps({"prompt": "x", "chosen": "y"} if i in bad else
                                        {"prompt": f"q{i}", "chosen": f"a{i}", "rejected": f"b{i}"}) + "\n"
                             for i in range(40)))
    with pytest.raises(OmnigymError, match=rf"^{pairs}:4: a preference row needs chosen and rejected"):
        read_pairs(str(pairs), "train", seed, 4, tokenizer, 64)
    sft.write_text("".join(json.dumps({"question": "x"} if i in bad else {"prompt": f"q{i}", "completion": f"a{i}"})
                           + "\n" for i in range(40)))
    cfg = SFTConfig(data=str(sft), seed=seed, eval_size=4)
    with pytest.raises(OmnigymError, match=rf"^{sft}:4: an SFT row needs prompt and completion"):
        tokenized_examples(cfg, shuffled_rows(cfg), tokenizer)
