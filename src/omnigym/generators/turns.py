"""An episode's model calls, as sampled, joined into the token sequences a trainer reads.

Each call the model answered is a ``Turn``: the prompt ids it was given and the ids it
generated, with their log-probs and the policy version that sampled them. ``stitch`` joins
consecutive turns whose prompt continues the previous turn's prompt and completion token
for token: what lies between (a tool's output, the env's reply, the chat template's role
markers) is kept with loss mask 0, so nothing is ever re-tokenized and the trainer sees
exactly the tokens the engine saw. A turn whose prompt does not continue the sequence (an
agent that rewrote or trimmed its history) starts a new sequence of the same episode.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Turn:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    version: int
    finished: bool = True
    """False when max_new_tokens stopped the reply before the model ended it"""


@dataclass
class Sequence:
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    """the policy version of each generated token (-1 on inserted tokens)"""
    turns: int = 0

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add(self, turn: Turn) -> None:
        inserted = turn.prompt_ids[len(self.tokens):]
        self.response_ids += inserted + turn.completion_ids
        self.loss_mask += [0] * len(inserted) + [1] * len(turn.completion_ids)
        self.logprobs += [0.0] * len(inserted) + list(turn.logprobs)
        self.versions += [-1] * len(inserted) + [turn.version] * len(turn.completion_ids)
        self.turns += 1

    def oldest_version(self) -> int:
        generated = [v for v in self.versions if v >= 0]
        return min(generated) if generated else -1


def continues(sequence: Sequence, prompt_ids: list[int]) -> bool:
    tokens = sequence.tokens
    return len(prompt_ids) >= len(tokens) and prompt_ids[:len(tokens)] == tokens


def stitch(turns: list[Turn]) -> list[Sequence]:
    """The episode's turns as few sequences as possible, in order."""
    sequences: list[Sequence] = []
    for turn in turns:
        if not sequences or not continues(sequences[-1], turn.prompt_ids):
            sequences.append(Sequence(list(turn.prompt_ids)))
        sequences[-1].add(turn)
    return sequences
