"""The generator seam: what a language algorithm trains on, and who makes it.

What crosses it::

    generator.generate(examples: list[dict], group_size: int) -> Trajectories
    generator.update_weights(named_tensors, version: int) -> None   # sample from these weights as ``version``

``update_weights`` takes the tensors that changed (every one the first time; none: the same
weights under a new version) and hands them to the generator's inference engine, which
copies what it does not already share. Nothing else of a generator is read from outside:
its engine, env and tokenizer are its own.

Each example is played ``group_size`` times. A ``Trajectory`` is one whole episode as one
token sequence after its first prompt: the tokens the model generated (``loss_mask`` 1,
with the engine's log-probs) and the tokens the env or the chat template inserted
between turns (``loss_mask`` 0), its reward, the group it belongs to (the example's
index) and the policy version that generated it. Trainers read nothing else, so a
generator in another process (a Ray actor) can hand the same object over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Protocol

import torch


@dataclass
class Trajectory:
    prompt_ids: list[int]
    response_ids: list[int]
    """every token after the first prompt: generated, then inserted, then generated, ..."""
    loss_mask: list[int]
    """1 where the model generated the token, 0 where the env or the template inserted it"""
    logprobs: list[float]
    """the engine's sampling log-prob of each generated token, 0.0 on inserted tokens"""
    reward: float
    group_id: int
    policy_version: int
    example: dict
    info: dict = field(default_factory=dict)
    """``reward_parts`` (each reward's value), ``turns``, ``truncated`` (out of turns),
    ``cut_off`` (a reply stopped at max_new_tokens before the model ended it)"""


@dataclass
class Trajectories:
    items: list[Trajectory]

    def __len__(self) -> int:
        return len(self.items)

    def rewards(self) -> torch.Tensor:
        return torch.tensor([t.reward for t in self.items])

    def group_ids(self) -> torch.Tensor:
        return torch.tensor([t.group_id for t in self.items])

    def select(self, indices: list[int]) -> "Trajectories":
        return Trajectories([self.items[i] for i in indices])

    def noted_share(self, note: str) -> float | None:
        """The share of episodes whose reward noted ``note`` (``Reward.score_notes``: ``sandbox_blocked``,
        ``judge_unparsable``) above 0; None where no episode carries the note."""
        if not any(note in t.info for t in self.items):
            return None
        return sum(t.info.get(note, 0) > 0 for t in self.items) / len(self.items)

    def reward_parts(self) -> dict[str, float]:
        """Each reward's mean over the batch (the parts of a weighted sum); an episode cut off
        before a final reply counts 0 for every part."""
        names = dict.fromkeys(name for t in self.items for name in t.info.get("reward_parts", {}))
        return {name: sum(t.info.get("reward_parts", {}).get(name, 0.0) for t in self.items) / len(self.items)
                for name in names}


class Generator(Protocol):
    def generate(self, examples: list[dict], group_size: int) -> Trajectories: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None: ...
