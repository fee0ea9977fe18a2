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
