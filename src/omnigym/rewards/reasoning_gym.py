"""reasoning-gym's scorers as a reward.

Each example carries reasoning-gym's own entry (``rg_entry``), whose metadata names the
dataset it came from; the reward asks that dataset's scorer, which reasoning-gym builds
from the name alone. Nothing is looked up in a cache of this process, so the reward gives
the same scores in a Ray worker or a DataLoader worker. An entry that names no scorer is
an error, not a zero. Scorers can raise on odd answers (``prime_factorization`` does on a
non-number); an answer whose scoring raises scores 0.
"""

from __future__ import annotations

import functools

from omnigym.errors import OmnigymError, missing_extra
from omnigym.rewards.base import per_sample, register_reward
from omnigym.rewards.text import extract_answer


@functools.lru_cache(maxsize=None)
def scorer(dataset_name: str):
    try:
        import reasoning_gym
    except ImportError:
        raise missing_extra("reasoning-gym", "llm") from None
    try:
        return reasoning_gym.get_score_answer_fn(dataset_name)
    except ValueError:
        raise OmnigymError(f"reasoning-gym has no task {dataset_name!r} to score this example") from None


def reasoning_gym_score(completion: str, example: dict) -> float:
    """The task's own score of the answer in ``<answer>`` tags (0 if there is none or scoring raises)."""
    entry = example.get("rg_entry")
    name = (entry or {}).get("metadata", {}).get("source_dataset")
    if name is None:
        raise OmnigymError("the reasoning_gym reward needs examples from a reasoning_gym task "
                           "(--task reasoning_gym:<name>); this one has no rg_entry with a source_dataset")
    score = scorer(name)
    answer = extract_answer(completion)
    if answer is None:
        return 0.0
    try:
        return float(score(answer=answer, entry=entry))
    except Exception:  # a model's answer can break any scorer; a broken answer scores 0
        return 0.0


register_reward("reasoning_gym")(per_sample(reasoning_gym_score))
