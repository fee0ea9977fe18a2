"""The chain task's env (``--task chain``, ``omnigym.tasks.steps``): single-turn, scored by
the answer tag (``math``), with the written solution as the warm-up's demonstration, so the
model learns to work one step a line before GRPO and the process reward model read its steps."""

from __future__ import annotations

from omnigym.envs.text import TextEnv
from omnigym.tasks.steps import solution_lines


class ChainEnv(TextEnv):
    def demonstration(self, example: dict) -> list[dict]:
        """The scripted reply GRPO's warm-up imitates: each step on its line, then the answer."""
        return [{"role": "assistant", "content": "\n".join(solution_lines(example))}]


def chain_env(examples: list[dict]) -> ChainEnv:
    from omnigym.rewards import WeightedSum

    return ChainEnv(examples, WeightedSum({"math": 1.0}))
