"""Pieces the language algorithms share: prompts, padded batches, token log-probs,
a supervised step and held-out accuracy."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omnigym.systems.generation import Sample, SamplingParams, distinct_rows, left_pad


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


@dataclass
class CompletionBatch:
    """Completions scored against prompts they share. Every distinct prompt, less its last
    token, is run once and its KV cache copied to each of its completions; the completion
    pass then starts from that last token. A group of 8 samples of one prompt pays for the
    prompt once instead of 8 times, forward and backward, and the numbers are the same."""
    prefix_ids: torch.Tensor      # [G, P], left-padded distinct prompts without their last token
    prefix_mask: torch.Tensor     # [G, P]
    rows: torch.Tensor            # [B], the prefix row of each completion
    input_ids: torch.Tensor       # [B, C], last prompt token + completion[:-1], right-padded
    position_ids: torch.Tensor    # [B, C]
    targets: torch.Tensor         # [B, C], the completion tokens
    loss_mask: torch.Tensor       # [B, C], 1 on completion tokens


def make_completion_batch(samples: list[Sample], pad_id: int, device="cpu") -> CompletionBatch:
    if min(len(s.prompt_ids) for s in samples) < 2:
        raise ValueError("every prompt needs at least 2 tokens")
    distinct, rows = distinct_rows(s.prompt_ids for s in samples)
    prefix_ids, prefix_mask = left_pad([p[:-1] for p in distinct], max(map(len, distinct)) - 1, pad_id)
    length = max(len(s.completion_ids) for s in samples)
    input_ids = torch.full((len(samples), length), pad_id, dtype=torch.long)
    targets = torch.full((len(samples), length), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((len(samples), length))
    for i, s in enumerate(samples):
        n = len(s.completion_ids)
        input_ids[i, :n] = torch.tensor(s.prompt_ids[-1:] + s.completion_ids[:-1])
        targets[i, :n] = torch.tensor(s.completion_ids)
        loss_mask[i, :n] = 1
    starts = torch.tensor([len(s.prompt_ids) - 1 for s in samples])
    position_ids = starts[:, None] + torch.arange(length)[None]
    return CompletionBatch(*(t.to(device) for t in (prefix_ids, prefix_mask, rows, input_ids, position_ids,
                                                     targets, loss_mask)))


def completion_logprobs(model, batch: CompletionBatch) -> torch.Tensor:
    """log p(completion token t | prompt, completion tokens < t), ``[B, C]``."""
    positions = (batch.prefix_mask.cumsum(-1) - 1).clamp(min=0)
    cache = model(input_ids=batch.prefix_ids, attention_mask=batch.prefix_mask, position_ids=positions,
                  use_cache=True).past_key_values
    cache.batch_select_indices(batch.rows)
    attention = torch.cat([batch.prefix_mask[batch.rows], (batch.loss_mask > 0).long()], 1)
    logits = model(input_ids=batch.input_ids, attention_mask=attention, position_ids=batch.position_ids,
                   past_key_values=cache, use_cache=True).logits.float()
    return logits.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)


def adamw(model, learning_rate: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW over the trainable weights; torch's fused kernel (CPU and CUDA) takes a third
    of the time of the per-tensor loop on a small model."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    return torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay, fused=fused)


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
