"""reasoning-gym's scorers as a reward.

Each example carries reasoning-gym's own entry (``rg_entry``), whose metadata names the
dataset it came from; the reward asks that dataset's scorer, which reasoning-gym builds
from the name alone. Nothing is looked up in a cache of this process, so the reward gives
the same scores in a Ray worker or a DataLoader worker; the scorers built are kept on the
reward object, not in this process. An entry that names no scorer is
an error, not a zero. Scorers can raise on odd answers (``prime_factorization`` does on a
non-number); an answer whose scoring raises scores 0.
"""

from __future__ import annotations

from omnigym.errors import OmnigymError, missing_extra
from omnigym.rewards.text import extract_answer


def scorer(dataset_name: str):
    """reasoning-gym's scorer of ``dataset_name`` (it builds the dataset to get it)."""
    try:
        import reasoning_gym
    except ImportError:
        raise missing_extra("reasoning-gym", "llm") from None
    try:
        return reasoning_gym.get_score_answer_fn(dataset_name)
    except ValueError:
        raise OmnigymError(f"reasoning-gym has no task {dataset_name!r} to score this example") from None


class ReasoningGymScore:
    """``(completion, example) -> float``: the task's own score of the answer in ``<answer>``
    tags (0 if there is none or scoring raises). The scorers it has built are kept on this
    object (building one builds a dataset); pickling sends none of them."""

    def __init__(self):
        self.scorers: dict[str, object] = {}

    def __getstate__(self):
        return {**self.__dict__, "scorers": {}}

    def __call__(self, completion: str, example: dict) -> float:
        entry = example.get("rg_entry")
        name = (entry or {}).get("metadata", {}).get("source_dataset")
        if name is None:
            raise OmnigymError("the reasoning_gym reward needs examples from a reasoning_gym task "
                               "(--task reasoning_gym:<name>); this one has no rg_entry with a source_dataset")
        if name not in self.scorers:
            self.scorers[name] = scorer(name)
        answer = extract_answer(completion)
        if answer is None:
            return 0.0
        try:
            return float(self.scorers[name](answer=answer, entry=entry))
        except Exception:  # a model's answer can break any scorer; a broken answer scores 0
            return 0.0
