"""reasoning-gym's procedural tasks (no download) as omnigym examples.

Each example keeps reasoning-gym's own entry, so the ``reasoning_gym`` reward can ask the
task's own scorer (``rewards/reasoning_gym.py``).
"""

from __future__ import annotations

from omnigym.errors import OmnigymError, missing_extra


def load_reasoning_gym(name: str, size: int = 1000, seed: int = 0, **task_kwargs) -> list[dict]:
    try:
        import reasoning_gym
    except ImportError:
        raise missing_extra("reasoning-gym", "llm") from None
    try:
        dataset = reasoning_gym.create_dataset(name, size=size, seed=seed, **task_kwargs)
    except Exception as exc:  # its registry raises a bare error for unknown names
        raise OmnigymError(f"reasoning-gym has no task {name!r} ({exc})") from None
    return [{"question": e["question"], "answer": e["answer"], "rg_entry": e} for e in dataset]
