"""One agent episode's requests as the engine sampled them, and the Trajectories they make.

The endpoint records each chat request of an episode as a ``generators.turns.Turn``: the
prompt ids the engine was given, the ids it generated and their log-probs, the policy
version. When the agent sends its history back, the new prompt is built on the earlier
turn's tokens, not re-tokenized: if the newly rendered text begins with the text of an
earlier turn's prompt and completion (the template rendered the model's reply back as it
was generated), the prompt is those very ids followed by the tokens of the rest of the text.
Otherwise (the agent rewrote its history, or the template renders a reply differently) the
whole text is tokenized and ``stitch`` starts a new sequence of the same episode.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from omnigym.generators.base import Trajectory
from omnigym.generators.turns import Turn, stitch


@dataclass
class Exchange:
    """What the endpoint answered to one request, beside its Turn (for samples.jsonl and metrics)."""

    asked: dict
    """the request's last message (what the agent added since the previous reply)"""
    reply: str
    tool_calls: list[dict]
    malformed_tool_calls: int
    finish_reason: str
    cut_by: str | None = None
    """what a reply cut off (finish_reason "length") ran into: "max_tokens" (the request's own,
    below the run's limit), "--max-new-tokens" (the run's) or "context" (what the prompt left)"""
    stripped: dict = field(default_factory=dict)
    """special tokens the reply's decoding left out, and the reply with them (models.lm.stripped_special_tokens)"""

    def shown(self) -> dict:
        """Its entry in the episode's transcript (samples.jsonl)."""
        return {"asked": self.asked, "reply": self.reply, "tool_calls": self.tool_calls,
                "finish_reason": self.finish_reason, **({"cut_by": self.cut_by} if self.cut_by else {}),
                **self.stripped}


@dataclass
class EpisodeRecord:
    episode_id: str
    turns: list[Turn] = field(default_factory=list)
    exchanges: list[Exchange] = field(default_factory=list)
    fatal: str | None = None
    """a request the run cannot serve at all (a chat template without tool support): the run stops"""
    crash: BaseException | None = None
    """the server failed serving a request (the engine raised): raised again in the run"""
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, turn: Turn, exchange: Exchange) -> bool:
        """Record a served request; False when the episode was closed meanwhile (timed out)."""
        with self.lock:
            if self.closed:
                return False
            self.turns.append(turn)
            self.exchanges.append(exchange)
            return True


def prompt_ids(tokenizer, record: EpisodeRecord, text: str) -> list[int]:
    """The ids of ``text``, built on the tokens of the latest earlier turn it continues."""
    with record.lock:
        turns = list(record.turns)
    for turn in reversed(turns):
        earlier = turn.prompt_ids + turn.completion_ids
        earlier_text = tokenizer.decode(earlier, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if text.startswith(earlier_text):
            return earlier + encode(tokenizer, text[len(earlier_text):])
    return encode(tokenizer, text)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def trajectories(record: EpisodeRecord, reward: float, parts: dict, group_id: int, example: dict, version: int,
                 error: str | None = None, timed_out: bool = False) -> list:
    """The episode as Trajectories: one per stitched sequence (usually one), each with the
    episode's reward; an episode that failed is one Trajectory carrying ``info["error"]``
    (never trained on) and whatever tokens it had."""
    with record.lock:
        turns, exchanges = list(record.turns), list(record.exchanges)
    info = {"reward_parts": parts, "turns": len(turns), "truncated": False,
            "cut_off": any(not t.finished for t in turns),
            "cut_by": sorted({e.cut_by for e in exchanges if e.cut_by}),
            "tool_calls": sum(len(e.tool_calls) for e in exchanges),
            "tool_errors": sum(e.malformed_tool_calls for e in exchanges),
            "transcript": [e.shown() for e in exchanges]}
    if error is not None:
        info.update(error=error, timed_out=timed_out)
    sequences = stitch(turns)
    if error is not None or not sequences:
        first = sequences[0] if sequences else None
        return [Trajectory(first.prompt_ids if first else [], first.response_ids if first else [],
                           first.loss_mask if first else [], first.logprobs if first else [], reward, group_id,
                           version, example, {**info, "error": error or "the agent made no request"})]
    return [Trajectory(s.prompt_ids, s.response_ids, s.loss_mask, s.logprobs, reward, group_id,
                       s.oldest_version(), example, dict(info, sequences=len(sequences), sequence=i))
            for i, s in enumerate(sequences)]
