"""A multi-step arithmetic task whose steps the task itself can check: the chain.

A problem is a start number and a chain of operations, "Start at 7, then +5, *3, -4."; its
solution is written one step a line, then the answer::

    7+5=12
    12*3=36
    36-4=32
    <answer>32</answer>

A reply's steps are its non-empty lines (``reply_steps``: each with its character span, so a
step's score can be placed on the token that ends it). ``check_steps`` says of each step
whether it is right: step k (k < number of operations) must state the chain's k-th operation
with its true values, ``v_k op b_k = v_{k+1}`` (spaces aside); the step after the last
operation must be ``<answer>v_n</answer>``; any further line is wrong. The true running value
is what a step is held to, so a slip makes its step wrong and every step that carries the
wrong value on wrong as well (a wrong operand that happens to give the true value, 2*2 for
2+2, leaves the steps after it right): Math-Shepherd's "can this step still reach the right answer"
label (Wang et al., 2024), which PRM800K's graders gave by hand (Lightman et al., 2023).

``labelled_replies`` makes step-labelled data without a model: the right solution and copies
of it with one step perturbed (an arithmetic slip, a wrong operand, a wrong operator, or a
wrong answer), the chain worked on from the wrong value, every step labelled by the checker.

``--task chain`` trains on it (``--terms``: numbers in the chain, so ``--terms 4`` is three
operations; ``--digits``: digits per number; ``--operations``); its env's demonstration is
the written solution, which GRPO's warm-up imitates, and its outcome reward is ``math`` (the
answer tag) on the whole reply.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

from omnigym.errors import OmnigymError
from omnigym.tasks.arithmetic import OPERATIONS

STEP = re.compile(r"^\s*(-?\d+)\s*([-+*])\s*(-?\d+)\s*=\s*(-?\d+)\s*$")
ANSWER_LINE = re.compile(r"^\s*<answer>\s*(-?\d+)\s*</answer>\s*$")
PERTURBATIONS = ("slip", "operand", "operator", "answer")


def reply_steps(reply: str) -> list[tuple[int, int]]:
    """The steps of ``reply``: its non-empty lines, as ``(start, end)`` character spans (end
    exclusive, trailing spaces left out), so ``reply[end - 1]`` is the step's last character."""
    spans, start = [], 0
    for line in reply.split("\n"):
        text = line.rstrip()
        if text.strip():
            spans.append((start + len(line) - len(line.lstrip()), start + len(text)))
        start += len(line) + 1
    return spans


def solution_lines(example: dict) -> list[str]:
    """The right solution of a chain problem, one line a step, the answer line last."""
    return [*example["steps"], f"<answer>{example['answer']}</answer>"]


def check_steps(reply: str, example: dict) -> list[bool]:
    """Whether each step of ``reply`` (``reply_steps``) is right for the chain ``example``."""
    if "steps" not in example:
        raise OmnigymError("this task's examples have no 'steps' to check a reply against; step labels need a task "
                           "whose steps are checkable (--task chain)")
    truth = [tuple(int(x) if x.lstrip("-").isdigit() else x for x in STEP.match(line).groups())
             for line in example["steps"]]
    verdicts = []
    for k, (start, end) in enumerate(reply_steps(reply)):
        line = reply[start:end]
        if k < len(truth):
            found = STEP.match(line)
            verdicts.append(found is not None and
                            (int(found[1]), found[2], int(found[3]), int(found[4])) == truth[k])
        elif k == len(truth):
            found = ANSWER_LINE.match(line)
            verdicts.append(found is not None and int(found[1]) == int(example["answer"]))
        else:
            verdicts.append(False)
    return verdicts


@dataclass
class ChainTask:
    digits: int = 1
    """digits per number"""
    terms: int = 4
    """numbers in the chain: the start and one per operation"""
    operations: str = "+-*"
    heldout_fraction: float = 0.2

    def __post_init__(self):
        if self.digits < 1 or self.terms < 2:
            raise OmnigymError(f"the chain task needs digits >= 1 and terms >= 2, got {self.digits} and {self.terms}")
        unknown = set(self.operations) - set(OPERATIONS)
        if unknown or not self.operations:
            raise OmnigymError(f"unknown operations {''.join(sorted(unknown))!r}; use some of '+-*'")

    def _draw(self, rng: random.Random) -> dict:
        low, high = 10 ** (self.digits - 1) if self.digits > 1 else 1, 10**self.digits - 1
        value = start = rng.randint(low, high)
        chain, steps = [], []
        for _ in range(self.terms - 1):
            op, number = rng.choice(self.operations), rng.randint(low, high)
            result = OPERATIONS[op](value, number)
            chain.append([op, number])
            steps.append(f"{value}{op}{number}={result}")
            value = result
        question = f"Start at {start}, then " + ", ".join(f"{op}{number}" for op, number in chain) + "."
        return {"question": question, "answer": str(value), "start": start, "chain": chain, "steps": steps}

    def split_of(self, example: dict) -> str:
        digest = hashlib.sha256(example["question"].encode()).digest()
        return "heldout" if digest[0] / 256 < self.heldout_fraction else "train"

    def sample(self, n: int, seed: int, split: str = "train") -> list[dict]:
        """``n`` problems of ``split`` ("train" or "heldout"), the same for the same seed; the two
        splits share no problem (each problem's text decides its split)."""
        if split not in ("train", "heldout"):
            raise OmnigymError(f"split must be 'train' or 'heldout', got {split!r}")
        rng, out = random.Random(seed), []
        for _ in range(n * 1000):
            example = self._draw(rng)
            if self.split_of(example) == split:
                out.append(example)
                if len(out) == n:
                    return out
        raise OmnigymError(f"could not draw {n} {split} chain problems with digits={self.digits}; the space is too small")


def perturbed(example: dict, rng: random.Random, kind: str, at: int) -> list[str]:
    """The solution of ``example`` with one mistake of ``kind`` at step ``at`` (the answer line
    when ``at`` is the number of operations, where every kind becomes a wrong answer), the
    chain carried on from the wrong value, as a model that slipped would."""
    chain, value, lines = example["chain"], example["start"], []
    for k, (op, number) in enumerate(chain):
        if k == at and kind == "operand":
            number = number + rng.choice([-2, -1, 1, 2])
        if k == at and kind == "operator":
            op = rng.choice([o for o in "+-*" if o != op])
        result = OPERATIONS[op](value, number)
        if k == at and kind == "slip":
            result += rng.choice([-10, -2, -1, 1, 2, 10])
        lines.append(f"{value}{op}{number}={result}")
        value = result
    answer = value + rng.choice([-2, -1, 1, 2]) if at == len(chain) else value
    return [*lines, f"<answer>{answer}</answer>"]


def labelled_replies(example: dict, rng: random.Random, wrong: int) -> list[tuple[str, list[bool]]]:
    """The right solution and ``wrong`` perturbed ones (step and kind drawn from ``rng``), each
    with its steps' labels from ``check_steps``."""
    replies = ["\n".join(solution_lines(example))]
    for _ in range(wrong):
        kind, at = rng.choice(PERTURBATIONS), rng.randint(0, len(example["chain"]))
        replies.append("\n".join(perturbed(example, rng, kind, len(example["chain"]) if kind == "answer" else at)))
    return [(reply, check_steps(reply, example)) for reply in replies]
