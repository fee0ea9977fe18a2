"""The rules both schedules play a text env's episodes by (``text_env.py``: a batch, turn by
turn; ``text_episodes.py``: each episode on its own): how the env's reply becomes tokens, how
an episode's token budget cuts it, and DAPO's overlong penalty on its reward."""

from __future__ import annotations

from omnigym.models.lm import render_chat
from omnigym.rl.overlong import overlong_penalty


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    text = render_chat(tokenizer, messages, add_generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def budget_cut(completion_ids: list[int], logprobs: list[float], left: int | None):
    """A reply cut to the ``left`` tokens an episode's budget allows (None: no budget), and
    whether it was cut. A cut reply is unfinished: the episode ends there, truncated, and the
    env never reads the fragment.

    Cutting after sampling, not asking the engine for fewer tokens, keeps every episode's
    request the same ``SamplingParams``, so the engine still batches them together."""
    if left is None or len(completion_ids) <= left:
        return completion_ids, logprobs, False
    return completion_ids[:left], logprobs[:left], True


def out_of_budget(max_episode_tokens: int | None, generated: int) -> bool:
    """No token left for another reply."""
    return max_episode_tokens is not None and generated >= max_episode_tokens


def with_overlong(reward: float, parts: dict, generated: int, limit: int, buffer: int) -> tuple[float, dict]:
    """An episode's reward and parts with DAPO's overlong penalty added (as part ``overlong``)."""
    if buffer <= 0:
        return reward, parts
    penalty = overlong_penalty(generated, limit, buffer)
    return reward + penalty, {**parts, "overlong": penalty}


def inserted_tokens(tokenizer, messages: list[dict], tokens: list[int]) -> list[int]:
    """The env's reply as the chat template renders it after ``tokens``: the rendered history's
    tail when the history renders back to ``tokens``, else the last message alone."""
    full = render(tokenizer, messages)
    if full[:len(tokens)] == tokens:
        return full[len(tokens):]
    return render(tokenizer, messages[-1:], add_generation_prompt=True)
