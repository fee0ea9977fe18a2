import gzip
import json
from pathlib import Path

import pytest

from omnigym.errors import OmnigymError
from omnigym.rewards import combine, get_reward
from omnigym.rewards.text import extract_answer

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def test_format_reward():
    fmt = get_reward("format")
    assert fmt("<think>2+2 is 4</think> <answer>4</answer>", {}) == 1.0
    assert fmt("the answer is <answer>4</answer>", {}) == 0.5
    assert fmt("4", {}) == 0.0


@pytest.mark.parametrize("completion, gold, expected", [
    ("<answer>42</answer>", "42", 1.0),
    ("<answer>\\frac{1}{2}</answer>", "0.5", 1.0),
    ("<answer>1,000</answer>", "1000", 1.0),
    ("<think>..</think><answer>41</answer>", "42", 0.0),
    ("42", "42", 0.0),                       # no answer tag: nothing to grade
    ("<answer>}}{{\\frac</answer>", "3", 0.0),  # unparsable answers score 0, never raise
    ("<answer>18</answer>", "Janet sells 16 - 3 - 4 = 9 eggs... #### 18", 1.0),
])
def test_math_reward(completion, gold, expected):
    assert get_reward("math")(completion, {"answer": gold}) == expected


def test_keyword_and_length():
    assert get_reward("keyword")("I love Paris in spring", {"keywords": ["paris", "rome"]}) == 0.5
    assert get_reward("length")("x" * 100, {"max_chars": 100}) == 1.0
    assert get_reward("length")("x" * 150, {"max_chars": 100}) == 0.5


def test_combined_rewards_report_each_part():
    score = combine({"math": 1.0, "format": 0.1})
    total, parts = score("<think>x</think><answer>7</answer>", {"answer": "7"})
    assert parts == {"math": 1.0, "format": 1.0}
    assert total == pytest.approx(1.1)
    with pytest.raises(OmnigymError, match="unknown reward 'nope'; known: .*math"):
        combine({"nope": 1.0})


@pytest.mark.skipif(not (SHARED / "gsm8k").exists(), reason="../shared/data not present")
def test_gsm8k_gold_answers_score_themselves():
    rows = [json.loads(line) for line in (SHARED / "gsm8k" / "test.jsonl").open()][:50]
    math = get_reward("math")
    for row in rows:
        gold = extract_answer(row["answer"])
        assert math(f"<answer>{gold}</answer>", {"answer": row["answer"]}) == 1.0


@pytest.mark.skipif(not (SHARED / "humaneval").exists(), reason="../shared/data not present")
def test_humaneval_canonical_solutions_pass_and_empty_ones_fail():
    with gzip.open(SHARED / "humaneval" / "HumanEval.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f][:8]
    code = get_reward("code")
    for row in rows:
        assert code(row["prompt"] + row["canonical_solution"], row) == 1.0, row["task_id"]
        assert code(row["prompt"] + "    pass\n", row) == 0.0, row["task_id"]
