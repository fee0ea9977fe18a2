"""The gold reward of the synthetic preference world (``omnigym.tasks.gold_world``): a fixed
rule on the text that stands in for human raters, so that RLHF can be measured offline. It
is registered as ``gold_vowels`` for evaluation (``--gold-reward gold_vowels``); a trainer
that learns from preference pairs never sees it."""

from __future__ import annotations

VOWELS = frozenset("aeiou")


def gold_reward(reply: str) -> float:
    """The fraction of the reply's letters that are vowels (0 for a reply with no letters)."""
    letters = [c for c in reply.lower() if c.isalpha()]
    return sum(c in VOWELS for c in letters) / len(letters) if letters else 0.0


def gold_vowels(completion: str, example: dict) -> float:
    """The synthetic world's gold reward: the vowel fraction of the reply's letters."""
    return gold_reward(completion)
