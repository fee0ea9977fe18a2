"""Rewards on text: format tags, math answers, keywords, length (per-completion functions;
``registry.py`` names them)."""

from __future__ import annotations

import re
import threading

THINK_ANSWER = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
NUMBER = re.compile(r"-?\d[\d,]*\.?\d*")
UNEVALUATED = re.compile(r"\d\s*(?:[-+*^×]|\\times|\\cdot)\s*-?\d")
"""a sum, difference, product or power still to be worked out: math-verify would evaluate it"""
INTEGER = re.compile(r"-?(?:0|[1-9]\d{0,17})")
"""a plain integer, no leading zeros: math-verify parses it exactly, and compares two exactly"""


def extract_answer(text: str) -> str | None:
    """The last ``<answer>…</answer>``, else what follows GSM8K's ``####``, else None."""
    tagged = ANSWER.findall(text)
    if tagged:
        return tagged[-1].strip()
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    return None


def format_reward(completion: str, example: dict) -> float:
    """1 for ``<think>…</think><answer>…</answer>`` and nothing else, 0.5 for an answer tag alone."""
    if THINK_ANSWER.match(completion):
        return 1.0
    return 0.5 if ANSWER.search(completion) else 0.0


def _numeric(text: str) -> float | None:
    found = NUMBER.findall(text.replace("$", ""))
    if not found:
        return None
    try:
        return float(found[-1].replace(",", "").rstrip("."))
    except ValueError:
        return None


def math_reward(completion: str, example: dict) -> float:
    """1 if the answer in ``<answer>`` tags equals ``example["answer"]`` (math-verify: LaTeX,
    fractions, sets; numeric comparison when math-verify is absent or cannot parse)."""
    predicted = extract_answer(completion)
    if predicted is None or UNEVALUATED.search(predicted):
        # "<answer>682 * 609</answer>" is the question handed back, not its answer; math-verify
        # evaluates it and would score it right (a policy found this instead of the calculator)
        return 0.0
    gold = str(example["answer"])
    gold = extract_answer(gold) or gold
    if INTEGER.fullmatch(predicted) and INTEGER.fullmatch(gold):
        # math-verify's verdict on two plain integers, without its sympy parse (1.7 ms a call, most of
        # the arithmetic demo's scoring): the same number, or not
        return float(int(predicted) == int(gold))
    try:
        from math_verify import parse, verify

        # math-verify's timeouts are SIGALRM, which only the main thread may set: elsewhere (an
        # episode scored in a worker thread, --rollouts async) it raised, and every answer scored 0.
        # There it runs without one; the answer is at most one reply long.
        main = threading.current_thread() is threading.main_thread()
        limit = {} if main else {"parsing_timeout": None}
        gold_parsed, predicted_parsed = parse(gold, **limit), parse(predicted, **limit)
        if gold_parsed and predicted_parsed:
            return float(verify(gold_parsed, predicted_parsed, **({} if main else {"timeout_seconds": None})))
    except ImportError:
        pass
    except Exception:  # a model's answer can break any parser; a broken answer scores 0
        return 0.0
    a, b = _numeric(predicted), _numeric(gold)
    return float(a is not None and b is not None and abs(a - b) <= 1e-6 * max(1.0, abs(b)))


def keyword_reward(completion: str, example: dict) -> float:
    """Fraction of ``example["keywords"]`` that appear in the completion (case-insensitive)."""
    keywords = example.get("keywords") or []
    text = completion.lower()
    return sum(k.lower() in text for k in keywords) / len(keywords) if keywords else 0.0


def length_reward(completion: str, example: dict) -> float:
    """1 at or under ``example["max_chars"]`` (default 512), falling linearly to 0 at twice that."""
    limit = example.get("max_chars", 512)
    return max(0.0, min(1.0, 2.0 - len(completion) / limit))

