"""Preference pairs in the formats TRL users already have, as token ids.

A row is one of:

- explicit prompt: ``{"prompt", "chosen", "rejected"}``: three strings, or a list of chat
  messages for the prompt and lists of (assistant) messages for the two replies;
- implicit prompt: ``{"chosen", "rejected"}``: two whole conversations (message lists) or
  two whole texts; the shared beginning is the prompt. Anthropic HH-RLHF transcripts
  (``"\\n\\nHuman: ... \\n\\nAssistant: ..."``) are read as they come: they become
  conversations, rendered with the model's chat template.

Sources are those of ``omnigym.tasks.datasets.read_rows`` (.jsonl, .json, a dataset folder,
an offline hub id). A row with a missing field or mixed formats is refused in one line naming
the file and line. A row with an empty reply, or a chosen reply identical to the rejected one,
is left out and counted, with one line naming the first; a set of nothing else is refused.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass

from omnigym.errors import OmnigymError
from omnigym.tasks.datasets import check_held_out, check_messages, first_refusal, read_rows
from omnigym.tasks.sft_data import to_sequence

HH_TURN = re.compile(r"\n\n(Human|Assistant): ?")


@dataclass
class Pair:
    prompt: list[int]
    chosen: list[int]
    """the chosen reply's tokens (end-of-sequence token included)"""
    rejected: list[int]
    margin: float = 0.0
    """the row's ``margin`` field (how much better chosen is), 0 when it has none"""
    source_prompt: str | list = ""
    """the prompt as the row gave it (text or messages), for rewards that read it"""


@dataclass
class PreferenceData:
    pairs: list[Pair]
    truncated: int
    """pairs whose replies were cut to fit max_length"""
    dropped: int
    """pairs left with no reply tokens, or the same tokens twice, after the cut"""


def split_row(where: str, row: dict) -> tuple[str | list, str | list, str | list]:
    """``(prompt, chosen, rejected)`` of one row, in any of the formats above; ``UnusablePair``
    when the two replies cannot teach a preference."""
    prompt, chosen, rejected = row_parts(where, row)
    if chosen == rejected:
        raise UnusablePair(f"{where}: chosen and rejected are the same reply; a pair must differ")
    for name, reply in (("chosen", chosen), ("rejected", rejected)):
        if not prompt_text(reply).strip():
            raise UnusablePair(f"{where}: the {name} reply is empty")
    return prompt, chosen, rejected


def row_parts(where: str, row: dict) -> tuple[str | list, str | list, str | list]:
    """The prompt and the two replies of a row, without judging the replies (the prompt of a
    pair with an empty reply is still a prompt)."""
    missing = [k for k in ("chosen", "rejected") if k not in row]
    if missing:
        raise OmnigymError(f"{where}: a preference row needs chosen and rejected (and optionally prompt); "
                           f"it has {', '.join(row) or 'no fields'}")
    chosen, rejected = row["chosen"], row["rejected"]
    if "prompt" in row:
        prompt = row["prompt"]
    else:
        if isinstance(chosen, str) and isinstance(rejected, str) and HH_TURN.search(chosen):
            chosen, rejected = hh_messages(where, chosen), hh_messages(where, rejected)
        prompt, chosen, rejected = shared_prefix(where, chosen, rejected)
    if type(prompt) is not type(chosen) or type(chosen) is not type(rejected) or not isinstance(chosen, (str, list)):
        raise OmnigymError(f"{where}: prompt, chosen and rejected must all be strings or all lists of messages")
    if isinstance(chosen, list):
        check_messages(where, prompt, "prompt", empty_ok=True)  # a split conversation may share nothing before
        for name, reply in (("chosen", chosen), ("rejected", rejected)):
            check_messages(where, reply, name)
            if any(m.get("tool_calls") for m in reply):  # a reply is read as its messages' contents ("None")
                raise OmnigymError(f"{where}: the {name} reply has tool calls, which a preference pair's reply "
                                   "cannot hold (it is read as its messages' text)")
    return prompt, chosen, rejected


class UnusablePair(OmnigymError):
    """A well-formed row that cannot teach a preference (an empty reply, the same reply twice).
    A data set with a few of them is read without them, and says so in one line (HH-RLHF has
    4 empty replies in 2,312 rows); a set with only such rows is this error."""


def hh_messages(where: str, transcript: str) -> list[dict]:
    """An HH-RLHF transcript as chat messages (Human -> user, Assistant -> assistant)."""
    parts = HH_TURN.split(transcript)
    if parts[0].strip():
        raise OmnigymError(f"{where}: text before the first 'Human:' turn of an HH-RLHF transcript")
    roles = {"Human": "user", "Assistant": "assistant"}
    return [{"role": roles[who], "content": text.strip()} for who, text in zip(parts[1::2], parts[2::2])]


def shared_prefix(where: str, chosen, rejected):
    """Split an implicit-prompt pair into (prompt, chosen reply, rejected reply). Conversations
    split at the first message that differs (the replies start at the last assistant turn of
    the shared part); texts split at the last whitespace before the first differing character."""
    if isinstance(chosen, list) and isinstance(rejected, list):
        n = 0
        while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
            n += 1
        if n == len(chosen) or n == len(rejected) or chosen[n].get("role") != "assistant" \
                or rejected[n].get("role") != "assistant":
            raise OmnigymError(f"{where}: chosen and rejected do not end in different assistant replies "
                               "after a shared conversation")
        return chosen[:n], chosen[n:], rejected[n:]
    if isinstance(chosen, str) and isinstance(rejected, str):
        n = 0
        while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
            n += 1
        while n > 0 and not chosen[n - 1].isspace():
            n -= 1
        return chosen[:n], chosen[n:], rejected[n:]
    raise OmnigymError(f"{where}: chosen and rejected must both be strings or both lists of messages")


def prompt_text(reply) -> str:
    """A prompt or reply's text: the string, or its messages' contents one after another."""
    return reply if isinstance(reply, str) else "".join(str(m.get("content", "")) for m in reply if isinstance(m, dict))


def row_margin(where: str, row: dict) -> float:
    margin = row.get("margin", 0.0)
    # Infinity passed, and made the loss inf: "loss became inf ... check the env's observations"
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin):
        raise OmnigymError(f"{where}: margin must be a finite number, got {margin!r}")
    return float(margin)


def pair_tokens(where: str, row: dict, tokenizer):
    """One row as ``(prompt, prompt ids, chosen ids, rejected ids, margin)``; what it refuses is
    an ``OmnigymError``, a row that cannot teach a preference an ``UnusablePair``."""
    prompt, chosen, rejected = split_row(where, row)
    tokens = []
    for reply in (chosen, rejected):
        ids, trained = to_sequence(where, {"prompt": prompt, "completion": reply}, tokenizer, completion_only=True)
        start = trained.index(1)
        tokens.append((ids[:start], ids[start:]))
    (prompt_ids, chosen_ids), (_, rejected_ids) = tokens
    return prompt, prompt_ids, chosen_ids, rejected_ids, row_margin(where, row)


def check_pair_row(where: str, row: dict, tokenizer) -> None:
    """What ``tokenize_pairs`` refuses of one row (a row it leaves out is no refusal)."""
    try:
        pair_tokens(where, row, tokenizer)
    except UnusablePair:
        pass


def tokenize_pairs(rows: list[tuple[str, dict]], tokenizer, max_length: int, which: str = "") -> PreferenceData:
    """Token pairs of ``rows``: prompt + reply is cut to ``max_length`` tokens (the reply's
    tail goes; the cut is counted). A pair is dropped when its prompt leaves no room for a
    reply, or when the cut makes both replies the same."""
    pairs, truncated, dropped, unusable = [], 0, 0, []
    for where, row in rows:
        try:
            prompt, prompt_ids, chosen_ids, rejected_ids, margin = pair_tokens(where, row, tokenizer)
        except UnusablePair as exc:
            unusable.append(exc)
            continue
        room = max_length - len(prompt_ids)
        if room < 1:
            dropped += 1
            continue
        if len(chosen_ids) > room or len(rejected_ids) > room:
            truncated += 1
            chosen_ids, rejected_ids = chosen_ids[:room], rejected_ids[:room]
        if chosen_ids == rejected_ids:
            dropped += 1
            continue
        pairs.append(Pair(prompt_ids, chosen_ids, rejected_ids, margin, prompt))
    if unusable and not pairs:
        raise unusable[0]
    if unusable:
        more = f" (and {len(unusable) - 1} more such rows)" if len(unusable) > 1 else ""
        print(f"omnigym: note: left out {unusable[0]}{more}", file=sys.stderr)
        dropped += len(unusable)
    if not pairs:
        raise OmnigymError(f"no {which}pair is left within --max-length {max_length} ({dropped} of {len(rows)} have "
                           "prompts that long, or replies that only differ after the cut); raise --max-length")
    return PreferenceData(pairs, truncated, dropped)


def read_pairs(source: str, split: str, seed: int, eval_size: int, tokenizer, max_length: int):
    """``(rows, held-out, training, conversational)``: the rows shuffled by ``seed``, the first
    ``eval_size`` held out. ``conversational`` says the pairs were rendered as chat."""
    import random

    rows = read_rows(source, split)
    if not rows:  # it read "use --eval-size below 0"
        raise OmnigymError(f"--data {source} has no pairs")
    check_held_out(f"--data {source}", len(rows), "pairs", eval_size)
    random.Random(seed).shuffle(rows)
    try:
        heldout = tokenize_pairs(rows[:eval_size], tokenizer, max_length, "held-out ")
        training = tokenize_pairs(rows[eval_size:], tokenizer, max_length, "training ")
    except UnusablePair:  # the whole set: no row of it can teach a preference
        raise
    except OmnigymError as refused:
        raise first_refusal(rows, lambda where, row: check_pair_row(where, row, tokenizer), refused) from None
    # from a pair that was kept: the shuffled first row could be one left out (chosen the same as rejected), whose
    # split refused the whole file for some seeds and not others
    conversational = isinstance(training.pairs[0].source_prompt, list)
    return rows, heldout, training, conversational


def longest_pair(pairs: list[Pair]) -> int:
    """Tokens of the longest prompt + reply among ``pairs`` (1 when there are none)."""
    return max((len(p.prompt) + max(len(p.chosen), len(p.rejected)) for p in pairs), default=1)


def pair_sequences(pairs: list[Pair]) -> list[tuple[list[int], list[int]]]:
    """Every pair's prompt + chosen, then every pair's prompt + rejected, as SFT-style
    (ids, trained) sequences: the trained tokens are the reply's."""
    return [(p.prompt + reply, [0] * len(p.prompt) + [1] * len(reply))
            for replies in ([p.chosen for p in pairs], [p.rejected for p in pairs])
            for p, reply in zip(pairs, replies)]


def read_prompts(source: str, split: str, seed: int) -> list[tuple[str, str | list]]:
    """(where, prompt) for RL on prompts alone: a row's ``prompt``, the shared prompt of a
    preference pair, a conversation up to its last assistant turn, or a ``question``;
    ``words`` is the offline demo's built-in prompts."""
    if source == "words":
        from omnigym.tasks.gold_world import prompts

        return [(f"words #{i}", row["prompt"]) for i, row in enumerate(prompts(5000, seed))]
    out = []
    for where, row in read_rows(source, split):
        if "prompt" in row:
            prompt = row["prompt"]
        elif "chosen" in row and "rejected" in row:
            prompt = row_parts(where, row)[0]
        elif isinstance(row.get("messages"), list):
            turns = [i for i, m in enumerate(row["messages"]) if isinstance(m, dict) and m.get("role") == "assistant"]
            prompt = row["messages"][:turns[-1]] if turns else row["messages"]
        elif "question" in row:
            prompt = row["question"]
        else:
            raise OmnigymError(f"{where}: a prompt row needs prompt, question, messages, or chosen and rejected; "
                               f"it has {', '.join(row) or 'no fields'}")
        if isinstance(prompt, list):
            check_messages(where, prompt, "the prompt")
        if not isinstance(prompt, (str, list)) or not prompt_text(prompt).strip():
            raise OmnigymError(f"{where}: the prompt is empty or neither text nor a list of messages")
        out.append((where, prompt))
    return out
