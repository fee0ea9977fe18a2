"""reasoning-gym's procedural tasks (no download) as omnigym examples and a reward.

Each example keeps reasoning-gym's own entry, so the reward asks the task's own scorer.
Scorers can raise on odd answers (``prime_factorization`` does on a non-number); a raising
scorer scores 0.
"""

from __future__ import annotations

from omnigym.errors import OmnigymError, missing_extra
from omnigym.rewards import register_reward
from omnigym.rewards.text import extract_answer

_DATASETS: dict[str, object] = {}


def load_reasoning_gym(name: str, size: int = 1000, seed: int = 0, **task_kwargs) -> list[dict]:
    try:
        import reasoning_gym
    except ImportError:
        raise missing_extra("reasoning-gym", "llm") from None
    try:
        dataset = reasoning_gym.create_dataset(name, size=size, seed=seed, **task_kwargs)
    except Exception as exc:  # its registry raises a bare error for unknown names
        raise OmnigymError(f"reasoning-gym has no task {name!r} ({exc})") from None
    key = f"{name}:{seed}:{size}:{sorted(task_kwargs.items())}"
    _DATASETS[key] = dataset
    return [{"question": e["question"], "answer": e["answer"], "rg_entry": e, "rg_dataset": key} for e in dataset]


@register_reward("reasoning_gym")
def reasoning_gym_reward(completion: str, example: dict) -> float:
    """The task's own score of the answer in ``<answer>`` tags (0 if there is none or it raises)."""
    answer = extract_answer(completion)
    if answer is None:
        return 0.0
    try:
        return float(_DATASETS[example["rg_dataset"]].score_answer(answer=answer, entry=example["rg_entry"]))
    except Exception:
        return 0.0
