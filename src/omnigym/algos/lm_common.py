"""Pieces the language algorithms share: prompts, padded batches, token log-probs,
a supervised step and held-out accuracy."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omnigym.systems.generation import Sample, SamplingParams


def prompt_ids(tokenizer, question: str, system_prompt: str | None = None) -> list[int]:
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt else [])
    messages.append({"role": "user", "content": question})
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@dataclass
class TokenBatch:
    input_ids: torch.Tensor       # [B, L], right-padded prompt + completion
    attention_mask: torch.Tensor  # [B, L]
    loss_mask: torch.Tensor       # [B, L-1], 1 where the *next* token is a completion token


def make_batch(pairs: list[tuple[list[int], list[int]]], pad_id: int, device="cpu") -> TokenBatch:
    """Right padding keeps every sequence's positions starting at 0, as in generation
    (where left padding is undone by position ids from the attention mask)."""
    width = max(len(p) + len(c) for p, c in pairs)
    input_ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(pairs), width), dtype=torch.long)
    loss_mask = torch.zeros((len(pairs), width - 1))
    for i, (prompt, completion) in enumerate(pairs):
        n = len(prompt) + len(completion)
        input_ids[i, :n] = torch.tensor(prompt + completion)
        attention[i, :n] = 1
        loss_mask[i, len(prompt) - 1:n - 1] = 1
    return TokenBatch(input_ids.to(device), attention.to(device), loss_mask.to(device))


def token_logprobs(model, batch: TokenBatch) -> torch.Tensor:
    """log p(token t+1 | tokens <= t) for every position, ``[B, L-1]``."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    targets = batch.input_ids[:, 1:].unsqueeze(-1)
    return logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, -1)


def sft_loss(model, batch: TokenBatch) -> torch.Tensor:
    logprobs = token_logprobs(model, batch)
    return -(logprobs * batch.loss_mask).sum() / batch.loss_mask.sum().clamp(min=1)


@torch.no_grad()
def accuracy(engine, tokenizer, examples: list[dict], reward, system_prompt=None, max_new_tokens: int = 32) -> float:
    """Fraction of ``examples`` whose greedy completion gets reward 1 (e.g. a correct answer)."""
    prompts = [prompt_ids(tokenizer, e["question"], system_prompt) for e in examples]
    samples = engine.generate(prompts, 1, SamplingParams(max_new_tokens=max_new_tokens, greedy=True))
    texts = [tokenizer.decode(group[0].completion_ids, skip_special_tokens=True) for group in samples]
    return sum(reward(t, e) >= 1.0 for t, e in zip(texts, examples)) / max(len(examples), 1)


def completion_texts(tokenizer, groups: list[list[Sample]]) -> list[str]:
    return [tokenizer.decode(s.completion_ids, skip_special_tokens=True) for group in groups for s in group]
