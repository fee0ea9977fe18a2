import gzip
import json
from pathlib import Path

import pytest

from omnigym.errors import OmnigymError
from omnigym.rewards import WeightedSum, get_reward, per_sample
from omnigym.rewards.text import format_reward
from omnigym.rewards.text import extract_answer

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def test_format_reward():
    fmt = format_reward  # the per-sample function behind the batched reward
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
    ("<answer>682 * 609</answer>", "415338", 0.0),  # the question handed back: math-verify evaluates it
    ("<answer>3 \\times 4</answer>", "12", 0.0),
    ("<answer>400000 - 1</answer>", "399999", 0.0),
    ("<answer>-12</answer>", "-12", 1.0),
    ("<answer>3/4</answer>", "0.75", 1.0),
])
def test_math_reward(completion, gold, expected):
    assert get_reward("math")([completion], [{"answer": gold}]).tolist() == [expected]


def test_plain_integers_score_as_math_verify_scores_them():
    """math_reward skips math-verify's parse for two plain integers (most of the arithmetic demo's
    scoring time); its verdicts are math-verify's own, down to a 30-digit answer one off."""
    from math_verify import parse, verify

    from omnigym.rewards.text import math_reward

    golds = ["0", "7", "-3", "1089", "9801", "5" * 30]
    answers = [str(i) for i in range(-12, 110, 7)] + ["-0", "0", "7", "-3", "1089", "9801", "5" * 30, "5" * 29 + "6"]
    for gold in golds:
        for answer in answers:
            assert math_reward(f"<answer>{answer}</answer>", {"answer": gold}) == \
                float(verify(parse(gold), parse(answer))), (gold, answer)


def test_keyword_and_length():
    assert get_reward("keyword")(["I love Paris in spring"], [{"keywords": ["paris", "rome"]}]).tolist() == [0.5]
    length = get_reward("length")
    assert length(["x" * 100, "x" * 150], [{"max_chars": 100}] * 2).tolist() == [1.0, 0.5]


def test_weighted_sum_reports_each_part_and_is_batched():
    score = WeightedSum({"math": 1.0, "format": 0.1})
    completions = ["<think>x</think><answer>7</answer>", "<answer>8</answer>", "7"]
    examples = [{"answer": "7"}] * 3
    parts = score.components(completions, examples)
    assert {k: v.tolist() for k, v in parts.items()} == {"math": [1.0, 0.0, 0.0], "format": [1.0, 0.5, 0.0]}
    assert score(completions, examples).tolist() == pytest.approx([1.1, 0.05, 0.0])
    with pytest.raises(OmnigymError, match="unknown reward 'nope'; known: .*math"):
        WeightedSum({"nope": 1.0})


def test_rewards_pickle_and_refuse_mismatched_batches():
    import pickle

    for name in ("math", "format", "code", "keyword", "reasoning_gym"):
        reward = pickle.loads(pickle.dumps(get_reward(name)))
        assert isinstance(reward, per_sample)
    assert pickle.loads(pickle.dumps(WeightedSum({"math": 1.0})))(["<answer>1</answer>"], [{"answer": "1"}]) == 1.0
    with pytest.raises(OmnigymError, match="2 completions but 1 examples"):
        get_reward("math")(["a", "b"], [{"answer": "1"}])


@pytest.mark.skipif(not (SHARED / "gsm8k").exists(), reason="../shared/data not present")
def test_gsm8k_gold_answers_score_themselves():
    rows = [json.loads(line) for line in (SHARED / "gsm8k" / "test.jsonl").open()][:50]
    math = get_reward("math")
    for row in rows:
        gold = extract_answer(row["answer"])
        assert math([f"<answer>{gold}</answer>"], [{"answer": row["answer"]}]).item() == 1.0


@pytest.mark.skipif(not (SHARED / "humaneval").exists(),
                    reason="../shared/data/humaneval not present (the data lives beside the checkout, not in it)")
def test_all_164_humaneval_canonical_solutions_pass_and_pass_bodies_fail():
    """Through the loader and the verifier, whole functions and body-only completions alike."""
    from omnigym.tasks.datasets import load_humaneval

    rows = load_humaneval(SHARED / "humaneval" / "HumanEval.jsonl.gz")
    code = get_reward("code")
    whole = code([row["prompt"] + row["canonical_solution"] for row in rows], rows)
    body_only = code([row["canonical_solution"] for row in rows], rows)
    fenced = code([f"Here:\n```python\n{row['prompt']}{row['canonical_solution']}```" for row in rows[:20]], rows[:20])
    empty = code([row["prompt"] + "    pass\n" for row in rows], rows)
    assert (len(rows), whole.sum().item(), body_only.sum().item(), fenced.sum().item()) == (164, 164, 164, 20)
    assert empty.sum().item() == 0


def test_every_reward_answers_the_declared_members_and_a_plain_callable_becomes_one():
    """Callers use Reward's members only (score, accuracy, to): a weighted sum, a built-in and a
    plain function of yours answer them alike, with no type checks at the call site."""
    from omnigym.rewards import Reward, as_reward, leading_part, scored_with_parts

    completions, examples = ["<think>x</think><answer>7</answer>", "<answer>8</answer>"], [{"answer": "7"}] * 2
    total, parts = WeightedSum({"math": 1.0, "format": 0.1}).score(completions, examples)
    assert total.tolist() == pytest.approx([1.1, 0.05]) and {k: v.tolist() for k, v in parts.items()} == \
        {"math": [1.0, 0.0], "format": [1.0, 0.5]}
    assert leading_part(WeightedSum({"math": 1.0, "format": 0.1}))(completions, examples).tolist() == [1.0, 0.0]

    def lengths(completions, examples):  # a plain function: no parts, itself for accuracy
        return [float(len(c)) for c in completions]

    total, parts = scored_with_parts(lengths, completions, examples)
    assert total.tolist() == [float(len(c)) for c in completions] and parts == {}
    assert isinstance(as_reward(lengths, "mine"), Reward) and leading_part(lengths)(["ab"], [{}]) == [2.0]
    with pytest.raises(OmnigymError, match="reward of the env returned shape \\(1,\\) for 2 completions"):
        scored_with_parts(lambda c, e: [1.0], completions, examples)

    class HoldsAModel(Reward):
        device = "cpu"

        def to(self, device):
            self.device = device
            return self

    held = HoldsAModel()
    summed = WeightedSum({"math": 1.0})
    summed.parts["math"] = held
    assert summed.to("meta") is summed and held.device == "meta"


def test_a_per_sample_reward_may_return_numpy_scalars_but_not_text():
    """np.where(ok, 1.0, 0.0) is a 0-d array: it was refused by the check that now refuses "1.0" (read as 1.0)."""
    import numpy as np
    import torch

    for value in (np.where(True, 1.0, 0.0), np.bool_(True), np.int64(1), np.float32(1.0), torch.tensor(1.0)):
        assert per_sample(lambda c, e, v=value: v)(["a"], [{}]).tolist() == [1.0]
    for value in ("1.0", None, np.array("x"), [1.0]):
        with pytest.raises(OmnigymError, match="for a completion; a reward is a number"):
            per_sample(lambda c, e, v=value: v)(["a"], [{}])
