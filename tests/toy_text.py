"""A task and rewards of the user's own, named as ``toy_text:name`` from the command line."""

import torch

from omnigym.rewards import per_sample


def short_questions():
    return [{"question": f"Say {i}", "answer": str(i)} for i in range(40)]


def anything(completions, examples):
    """A batched reward: 1 for every completion."""
    return torch.ones(len(completions))


def wrong_shape(completions, examples):
    return torch.ones(len(completions) + 1)


has_text = per_sample(lambda completion, example: float(bool(completion.strip())))


def failing_task():
    raise RuntimeError("task boom")


def failing_reward(completions, examples):
    return [example["missing"] for example in examples]


def list_question_task():
    """A task function whose questions are lists: it was an AttributeError traceback (and a warm-up
    stage left behind), while the same rows in a .jsonl file were refused."""
    return [{"question": ["Say", str(i)], "answer": str(i)} for i in range(40)]


def none_answer_task():
    """Answers of None: trained on, scored against the answer "None"."""
    return [{"question": f"Say {i}", "answer": None} for i in range(40)]


def huge_reward(completions, examples):
    """Finite in Python, inf once the trainer reads it as float32."""
    return [1e300] * len(completions)


def _string_score(completion, example):
    return "1.0"


string_reward = per_sample(_string_score)
"""A per-sample reward that returns text: "1.0" was read as 1.0 and trained on."""
