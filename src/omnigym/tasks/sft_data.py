"""Supervised fine-tuning data in the formats TRL users already have, as token sequences.

A row is one of:

- ``{"prompt", "completion"}``: two strings, or two lists of chat messages (conversational
  prompt/completion); the loss is on the completion only unless ``completion_only=False``;
- ``{"messages": [{"role", "content"}, ...]}``: a conversation rendered with the chat
  template; the loss is on the assistant turns only;
- ``{"text"}``: plain text, the loss on every token.

Sources: a ``.jsonl`` / ``.jsonl.gz`` file, a folder or hub id that ``datasets.load_dataset``
loads (offline: a local path, or a cached dataset), or ``arithmetic`` (built in: the GRPO
demo's addition problems with ``<answer>`` completions) or ``words`` (built in: the RLHF demo's
random-word replies, ``omnigym.tasks.gold_world``). A row that fits no format, or has an
empty completion, is one error naming the file and line.
"""

from __future__ import annotations

from dataclasses import dataclass

from omnigym.errors import OmnigymError
from omnigym.models.lm import render_chat
from omnigym.tasks.datasets import check_messages, read_rows


@dataclass
class SFTData:
    sequences: list[tuple[list[int], list[int]]]
    """(token ids, trained) per example: trained[t] = 1 where the loss predicts token t"""
    truncated: int
    """examples cut at max_length"""
    dropped: int
    """examples with no trained token left after the cut (a prompt as long as max_length)"""


def read_sft_rows(source: str, split: str = "train", seed: int = 0) -> list[tuple[str, dict]]:
    """(where, row) pairs: ``where`` names the file and line (or dataset and index) for errors."""
    if source == "arithmetic":
        from omnigym.tasks.arithmetic import ArithmeticTask

        return [(f"arithmetic #{i}", {"prompt": [{"role": "user", "content": e["question"]}],
                                       "completion": [{"role": "assistant", "content": f"<answer>{e['answer']}</answer>"}]})
                for i, e in enumerate(ArithmeticTask().sample(5000, seed))]
    if source == "words":
        from omnigym.tasks.gold_world import demonstrations

        return [(f"words #{i}", row) for i, row in enumerate(demonstrations(5000, seed))]
    return read_rows(source, split)



def tokenize_rows(rows: list[tuple[str, dict]], tokenizer, max_length: int | None, completion_only: bool = True,
                  which: str = "") -> SFTData:
    """Token sequences of ``rows``, each cut at ``max_length`` (None: uncut, for packing).
    ``which`` ("held-out ", "training ") names the set in the error when nothing is left."""
    sequences, truncated, dropped = [], 0, 0
    for where, row in rows:
        ids, trained = to_sequence(where, row, tokenizer, completion_only)
        if max_length is not None and len(ids) > max_length:
            ids, trained, truncated = ids[:max_length], trained[:max_length], truncated + 1
        if not any(trained[1:]):
            dropped += 1
            continue
        sequences.append((ids, trained))
    if not sequences:
        raise OmnigymError(f"no {which}example has a token left to learn from within --max-length {max_length} "
                           f"({dropped} of {len(rows)} have prompts that long or longer); raise --max-length")
    return SFTData(sequences, truncated, dropped)


def pack(sequences: list[tuple[list[int], list[int]]], max_length: int) -> list[tuple[list[int], list[int]]]:
    """Concatenate the examples and cut the stream into blocks of ``max_length`` tokens (no
    padding; attention crosses example boundaries, as TRL's "wrapped" packing does)."""
    ids = [t for seq, _ in sequences for t in seq]
    trained = [m for _, mask in sequences for m in mask]
    return [(ids[i:i + max_length], trained[i:i + max_length]) for i in range(0, len(ids) - 1, max_length)
            if any(trained[i + 1:i + max_length])]


def to_sequence(where: str, row: dict, tokenizer, completion_only: bool) -> tuple[list[int], list[int]]:
    eos = [tokenizer.eos_token_id]
    if "prompt" in row and "completion" in row:
        prompt, completion = row["prompt"], row["completion"]
        if isinstance(prompt, list) and isinstance(completion, list):  # conversational prompt/completion
            check_messages(where, prompt, "prompt")
            check_messages(where, completion, "completion")
            if any(m.get("tool_calls") for m in completion):  # its text would be the contents alone ("None")
                raise OmnigymError(f"{where}: a completion with tool calls is not read as prompt/completion; give the "
                                   "conversation as messages (the chat template renders its tool calls)")
            prompt_ids = _encode(tokenizer, _render(where, tokenizer, prompt, True))
            completion = "".join(m["content"] for m in completion)
        elif isinstance(prompt, str) and isinstance(completion, str):
            prompt_ids = _encode(tokenizer, prompt)
        else:
            raise OmnigymError(f"{where}: prompt and completion must both be strings or both lists of messages")
        if not completion.strip():
            raise OmnigymError(f"{where}: the completion is empty")
        completion_ids = _encode(tokenizer, completion) + eos
        return prompt_ids + completion_ids, [0 if completion_only else 1] * len(prompt_ids) + [1] * len(completion_ids)
    if "messages" in row:
        return _conversation(where, row["messages"], tokenizer, completion_only)
    if "text" in row:
        if not isinstance(row["text"], str) or not row["text"].strip():
            raise OmnigymError(f"{where}: 'text' is empty or not a string")
        ids = _encode(tokenizer, row["text"]) + eos
        return ids, [1] * len(ids)
    raise OmnigymError(f"{where}: an SFT row needs prompt and completion, messages, or text; it has "
                       f"{', '.join(row) or 'no fields'}")


def _conversation(where, messages, tokenizer, completion_only):
    """Render the conversation once per assistant turn: the text before each turn (with the
    template's generation prompt) and the text through it. The turn's tokens are trained,
    the rest (system, user, tool turns and the template's markup) are not."""
    check_messages(where, messages, "messages")
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns:
        raise OmnigymError(f"{where}: the conversation has no assistant turn to learn from")
    empty = next((i for i in turns if not (messages[i]["content"] or "").strip() and not messages[i].get("tool_calls")),
                 None)
    if empty is not None:  # only the template's markup around it was trained on
        raise OmnigymError(f"{where}: messages[{empty}], an assistant turn, is empty")
    ids, trained, rendered = [], [], ""
    for turn in turns:
        before = _render(where, tokenizer, messages[:turn], True)
        through = _render(where, tokenizer, messages[:turn + 1], False)
        if not (before.startswith(rendered) and through.startswith(before)):
            raise OmnigymError(f"{where}: the chat template does not render this conversation turn by turn; "
                               "give the data as prompt/completion")
        context, reply = _encode(tokenizer, before[len(rendered):]), _encode(tokenizer, through[len(before):])
        ids += context + reply
        trained += [0 if completion_only else 1] * len(context) + [1] * len(reply)
        rendered = through
    rest = _encode(tokenizer, _render(where, tokenizer, messages, False)[len(rendered):])
    return ids + rest, trained + [0 if completion_only else 1] * len(rest)


def _render(where, tokenizer, messages, add_generation_prompt: bool) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise OmnigymError(f"{where}: conversational data needs a chat template; the model has none "
                           "(give one with --chat-template)")
    return render_chat(tokenizer, messages, add_generation_prompt, where)


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def prompt_tokens(where: str, prompt, tokenizer) -> list[int]:
    """A prompt as the model sees it before replying: messages through the chat template with
    its generation prompt, text as it is."""
    if isinstance(prompt, list):
        return _encode(tokenizer, _render(where, tokenizer, prompt, True))
    return _encode(tokenizer, prompt)
