import json
import re
from pathlib import Path

import pytest

from omnigym.errors import OmnigymError
from omnigym.tasks.arithmetic import ArithmeticTask
from omnigym.tasks.datasets import load_gsm8k, load_humaneval, load_prompt_answer, read_jsonl

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def test_arithmetic_is_repeatable_correct_and_splits_disjoint():
    task = ArithmeticTask(digits=2, terms=3, operations="+-*")
    train, heldout = task.sample(200, seed=0), task.sample(100, seed=0, split="heldout")
    assert train == task.sample(200, seed=0)
    assert {e["expression"] for e in train}.isdisjoint(e["expression"] for e in heldout)
    for e in train[:50]:
        assert int(e["answer"]) == eval(e["expression"])
        assert len(e["expression"].split()) == 5


def test_arithmetic_rejects_bad_knobs():
    with pytest.raises(OmnigymError, match="unknown operations '/'"):
        ArithmeticTask(operations="+/")
    with pytest.raises(OmnigymError, match="terms >= 2"):
        ArithmeticTask(terms=1)


def test_malformed_rows_name_file_and_line(tmp_path):
    bad = tmp_path / "data.jsonl"
    bad.write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": "2+2"}\n')
    with pytest.raises(OmnigymError, match=r"data.jsonl:2: missing field\(s\) answer; the row has prompt"):
        load_prompt_answer(str(bad))
    bad.write_text('{"prompt": "1+1", "answer": "2"}\n{oops\n')
    with pytest.raises(OmnigymError, match=r"data.jsonl:2: not valid JSON"):
        read_jsonl(bad)


def test_jsonl_and_hf_datasets_load_the_same_rows(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("\n".join(json.dumps({"q": f"{i}+1", "a": i + 1}) for i in range(5)))
    from_file = load_prompt_answer(str(path), "q", "a")
    from_hf = load_prompt_answer("json", "q", "a", data_files=str(path))
    assert [r["question"] for r in from_file] == [r["question"] for r in from_hf] == [f"{i}+1" for i in range(5)]
    assert from_file[0]["answer"] == "1"


@pytest.mark.skipif(not (SHARED / "gsm8k").exists(), reason="../shared/data not present")
def test_real_gsm8k_and_humaneval_rows():
    gsm = load_gsm8k(SHARED / "gsm8k" / "test.jsonl")
    assert len(gsm) == 1319 and gsm[0]["answer"] == "18"
    human = load_humaneval(SHARED / "humaneval" / "HumanEval.jsonl.gz")
    assert len(human) == 164 and human[0]["entry_point"] == "has_close_elements"


def test_reasoning_gym_tasks_and_their_scorer():
    pytest.importorskip("reasoning_gym")
    from omnigym.rewards import get_reward
    from omnigym.tasks.reasoning_gym import load_reasoning_gym

    examples = load_reasoning_gym("prime_factorization", size=5, seed=1)
    assert len(examples) == 5 and examples[0]["question"]
    reward = get_reward("reasoning_gym")
    completions = [f"<answer>{examples[0]['answer']}</answer>", "<answer>not a number</answer>", "no tags"]
    assert reward(completions, examples[:1] * 3).tolist() == [1.0, 0.0, 0.0]  # its scorer raises on the 2nd
    with pytest.raises(OmnigymError, match="reasoning-gym has no task 'nope'"):
        load_reasoning_gym("nope")


SCORE_IN_A_FRESH_PROCESS = """
import pickle, sys
from omnigym.rewards import get_reward
examples, completions = pickle.load(sys.stdin.buffer)
print(get_reward("reasoning_gym")(completions, examples).tolist())
"""


def test_reasoning_gym_reward_scores_the_same_in_another_process():
    """A Ray or DataLoader worker has none of the parent's state: the examples alone must carry
    what the scorer needs (a process-global cache used to turn every reward into 0 there)."""
    pytest.importorskip("reasoning_gym")
    import pickle
    import subprocess
    import sys

    from omnigym.tasks.reasoning_gym import load_reasoning_gym

    examples = load_reasoning_gym("basic_arithmetic", size=4, seed=3)
    completions = [f"<answer>{e['answer']}</answer>" for e in examples[:2]] + ["<answer>-999999</answer>"] * 2
    worker = subprocess.run([sys.executable, "-c", SCORE_IN_A_FRESH_PROCESS], input=pickle.dumps((examples, completions)),
                            capture_output=True, check=True)
    assert worker.stdout.decode().strip() == "[1.0, 1.0, 0.0, 0.0]"


def test_reasoning_gym_reward_refuses_examples_it_cannot_score():
    from omnigym.rewards import get_reward

    with pytest.raises(OmnigymError, match="needs examples from a reasoning_gym task"):
        get_reward("reasoning_gym")(["<answer>1</answer>"], [{"question": "q", "answer": "1"}])


def test_humaneval_rows_work_in_a_text_env(tmp_path):
    """``humaneval:FILE`` gives questions a model can answer and an env scored by the tests."""
    from omnigym.envs.task_spec import load_task

    rows = [{"task_id": f"t/{i}", "prompt": f"def times{i}(x):\n    \"\"\"x times {i}\"\"\"\n", "entry_point": f"times{i}",
             "canonical_solution": f"    return x * {i}\n",
             "test": f"def check(candidate):\n    assert candidate(3) == {3 * i}\n"} for i in range(2, 8)]
    path = tmp_path / "he.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = load_task(f"humaneval:{path}", seed=0, eval_size=2)
    assert len(task.train) == 4 and len(task.heldout) == 2
    messages, info = task.env.reset(seed=0)
    example = info["example"]
    assert example["prompt"] in messages[-1]["content"] and "```python" in messages[-1]["content"]
    body = example["canonical_solution"]
    assert task.env.step(f"```python\n{body}```")[1] == 1.0      # the body only, fenced
    task.env.reset(options={"example": example})
    assert task.env.step(example["prompt"] + "    return 0\n")[1] == 0.0


def test_an_instruction_row_may_leave_its_answer_empty_or_out(tmp_path):
    """docs/instructions.md says so: such rows were refused ("answer must be a non-empty string"),
    while a plain row with an empty answer still is."""
    import json

    from omnigym.errors import OmnigymError
    from omnigym.tasks.datasets import load_prompt_answer

    rows = [{"question": "Say hi in capitals.", "answer": "", "instruction_id_list": ["change_case:english_capital"]},
            {"question": "Say bye in capitals.", "instruction_id_list": ["change_case:english_capital"]}]
    path = tmp_path / "if.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [r["answer"] for r in load_prompt_answer(str(path), "question", "answer")] == ["", ""]
    path.write_text(json.dumps({"question": "What is 1 + 1?", "answer": ""}) + "\n")
    with pytest.raises(OmnigymError, match="row 1: answer must be a non-empty string or number, got ''"):
        load_prompt_answer(str(path), "question", "answer")
    path.write_text(json.dumps({"question": "What is 1 + 1?"}) + "\n")
    with pytest.raises(OmnigymError, match="if.jsonl:1: missing field\\(s\\) answer"):
        load_prompt_answer(str(path), "question", "answer")


def test_data_files_in_each_format_read_as_the_same_rows(tmp_path):
    """.json (an array, or JSON lines, or gzipped), .csv and .parquet give the same rows; .json went
    through datasets' json builder, whose bad UTF-8 was a pyarrow traceback."""
    import gzip
    import json

    pytest.importorskip("datasets")
    import datasets

    from omnigym.tasks.datasets import read_rows

    rows = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(3)]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    (tmp_path / "l.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with gzip.open(tmp_path / "g.json.gz", "wt") as f:
        json.dump(rows, f)
    (tmp_path / "bom.json").write_text("\ufeff" + json.dumps(rows))
    table = datasets.Dataset.from_list(rows)
    table.to_csv(str(tmp_path / "t.csv"), index=False)
    table.to_parquet(str(tmp_path / "t.parquet"))
    for name in ("a.json", "l.json", "g.json.gz", "bom.json", "t.csv", "t.parquet"):
        assert [row for _, row in read_rows(str(tmp_path / name))] == rows, name
    # a CSV column of numbers stays text (datasets typed it int: a reply of "4" was refused as not a string)
    (tmp_path / "N.CSV").write_text("prompt,completion\nWhat is 2 + 2?,4\n")
    assert read_rows(str(tmp_path / "N.CSV")) == [(str(tmp_path / "N.CSV") + ":2", {"prompt": "What is 2 + 2?",
                                                                                     "completion": "4"})]


def test_chat_messages_are_checked_but_a_tool_call_turn_passes():
    from omnigym.errors import OmnigymError
    from omnigym.tasks.datasets import check_messages

    call = {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f"}}]}
    check_messages("x:1", [{"role": "user", "content": "hi"}, call, {"role": "tool", "content": "3"}], "messages")
    for bad, said in (([{"role": "user", "content": None}], "messages[0]'s content must be text, got NoneType"),
                      ([{"content": "hi"}], "messages[0] is not a {'role', 'content'} message"),
                      ([], "messages must be a list of")):
        with pytest.raises(OmnigymError, match=re.escape(said)):
            check_messages("x:1", bad, "messages")


def test_a_completion_with_tool_calls_is_refused_as_prompt_completion():
    """Its text was the contents joined: "None4It is 4." was trained on."""
    from omnigym.errors import OmnigymError
    from omnigym.tasks.sft_data import to_sequence

    row = {"prompt": [{"role": "user", "content": "2 + 2?"}],
           "completion": [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "add"}}]},
                          {"role": "tool", "content": "4"}, {"role": "assistant", "content": "It is 4."}]}
    with pytest.raises(OmnigymError, match="x:1: a completion with tool calls is not read as prompt/completion"):
        to_sequence("x:1", row, tokenizer=type("Tokenizer", (), {"eos_token_id": 0})(), completion_only=True)


def test_a_task_functions_instruction_rows_may_leave_the_answer_out():
    """A task file's IFEval rows could; a task function's were refused ("every example needs 'answer'")."""
    from omnigym.envs.task_spec import _split

    rows = [{"question": f"Say {i} in capitals.", "instruction_id_list": ["change_case:english_capital"],
             **({"answer": None} if i % 2 else {})} for i in range(6)]
    task = _split("mine:rows", rows, None, seed=0, eval_size=2)
    assert len(task.train) == 4 and all(r["answer"] == "" for r in task.train + task.heldout)
