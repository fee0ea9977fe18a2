"""Episodes of a TextEnv played by a generation engine, as one token sequence with a mask:
1 on tokens the model generated (trained on), 0 on prompt, tool and template tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

from omnigym.systems.generation import SamplingParams


@dataclass
class TextEpisode:
    tokens: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    """1 where the model generated the token, 0 where the env or the template inserted it"""
    logprobs: list[float] = field(default_factory=list)
    """sampling log-prob on generated tokens, 0 elsewhere"""
    reward: float = 0.0
    messages: list[dict] = field(default_factory=list)
    truncated: bool = False


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def play(env, engine, tokenizer, params: SamplingParams, seed: int | None = None, max_turns: int = 8) -> TextEpisode:
    """One episode, turn by turn. Each turn's prompt is the conversation so far; what the env
    appended since the model's last reply is added with mask 0."""
    messages, _ = env.reset(seed=seed)
    episode = TextEpisode()
    prompt = render(tokenizer, messages)
    episode.tokens, episode.generated, episode.logprobs = list(prompt), [0] * len(prompt), [0.0] * len(prompt)
    for _ in range(max_turns):
        sample = engine.generate([episode.tokens], 1, params)[0][0]
        episode.tokens += sample.completion_ids
        episode.generated += [1] * len(sample.completion_ids)
        episode.logprobs += sample.logprobs
        text = tokenizer.decode(sample.completion_ids, skip_special_tokens=True)
        messages, reward, terminated, truncated, _ = env.step(text)
        episode.reward += reward
        if terminated or truncated:
            episode.truncated = truncated
            break
        # The env's reply, rendered by the chat template, continues the sequence.
        full = render(tokenizer, messages)
        inserted = full[len(episode.tokens):] if full[:len(episode.tokens)] == episode.tokens else \
            render(tokenizer, messages[-1:], add_generation_prompt=True)
        episode.tokens += inserted
        episode.generated += [0] * len(inserted)
        episode.logprobs += [0.0] * len(inserted)
    episode.messages = messages
    return episode
