"""The gold reward of the synthetic preference world (``omnigym.tasks.gold_world``, which
defines the rule): a fixed rule on the text that stands in for human raters, so that RLHF can
be measured offline. It is registered as ``gold_vowels`` for evaluation (``--gold-reward
gold_vowels``); a trainer that learns from preference pairs never sees it."""

from __future__ import annotations

from omnigym.tasks.gold_world import gold_reward


def gold_vowels(completion: str, example: dict) -> float:
    """The synthetic world's gold reward: the vowel fraction of the reply's letters."""
    return gold_reward(completion)
