"""Token batches for a causal LM and the log-probabilities of their tokens.

``TokenBatch`` (prompt + completion, right-padded) is what supervised losses read;
``CompletionBatch`` runs each distinct prompt once and scores the completions that share
it, which is what the policy and reference passes of RL read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def left_pad(sequences, width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, width]`` token ids, right-aligned, and the mask of real tokens."""
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        if seq:
            ids[i, width - len(seq):] = torch.tensor(seq)
            mask[i, width - len(seq):] = 1
    return ids, mask


def distinct_rows(sequences) -> tuple[list[tuple[int, ...]], torch.Tensor]:
    """The distinct sequences, in first-seen order, and each input's index among them."""
    keys = [tuple(seq) for seq in sequences]
    distinct = list(dict.fromkeys(keys))
    index = {seq: i for i, seq in enumerate(distinct)}
    return distinct, torch.tensor([index[key] for key in keys], dtype=torch.long)


@dataclass
class TokenBatch:
    input_ids: torch.Tensor       # [B, L], right-padded prompt + completion
    attention_mask: torch.Tensor  # [B, L]
    loss_mask: torch.Tensor       # [B, L-1], 1 where the *next* token is a completion token


def make_batch(pairs: list[tuple[list[int], list[int]]], pad_id: int, device="cpu") -> TokenBatch:
    """(prompt, completion) pairs, the loss on the completion."""
    return make_sequence_batch([(p + c, [0] * len(p) + [1] * len(c)) for p, c in pairs], pad_id, device)


def make_sequence_batch(sequences: list[tuple[list[int], list[int]]], pad_id: int, device="cpu") -> TokenBatch:
    """(token ids, trained) sequences: ``trained[t]`` is 1 where token t is predicted by the
    loss (an assistant turn, a completion; the first token never is). Right padding keeps
    every sequence's positions starting at 0, as in generation (where left padding is undone
    by position ids from the attention mask)."""
    width = max(len(ids) for ids, _ in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    loss_mask = torch.zeros((len(sequences), width - 1))
    for i, (ids, trained) in enumerate(sequences):
        n = len(ids)
        input_ids[i, :n] = torch.tensor(ids)
        attention[i, :n] = 1
        loss_mask[i, :n - 1] = torch.tensor(trained[1:n], dtype=torch.float32)
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
    loss_mask: torch.Tensor       # [B, C], 1 on completion tokens the model generated
    attention: torch.Tensor       # [B, C], 1 on every completion token (generated or inserted)


def make_completion_batch(prompts: list[list[int]], completions: list[list[int]], pad_id: int,
                          masks: list[list[int]] | None = None, device="cpu") -> CompletionBatch:
    """``completions[i]`` follows ``prompts[i]``; ``masks[i]`` (default all 1) marks the
    tokens the loss counts: a multi-turn episode's tool and template tokens are 0."""
    if min(len(p) for p in prompts) < 2:
        raise ValueError("every prompt needs at least 2 tokens")
    distinct, rows = distinct_rows(prompts)
    prefix_ids, prefix_mask = left_pad([p[:-1] for p in distinct], max(map(len, distinct)) - 1, pad_id)
    length = max(len(c) for c in completions)
    input_ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    targets = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((len(prompts), length))
    attention = torch.zeros((len(prompts), length), dtype=torch.long)
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        n = len(completion)
        input_ids[i, :n] = torch.tensor(prompt[-1:] + completion[:-1])
        targets[i, :n] = torch.tensor(completion)
        loss_mask[i, :n] = 1 if masks is None else torch.tensor(masks[i], dtype=torch.float32)
        attention[i, :n] = 1
    starts = torch.tensor([len(p) - 1 for p in prompts])
    position_ids = starts[:, None] + torch.arange(length)[None]
    return CompletionBatch(*(t.to(device) for t in (prefix_ids, prefix_mask, rows, input_ids, position_ids,
                                                     targets, loss_mask, attention)))


def shared_prefix_forward(module, batch: CompletionBatch):
    """``module``'s output on the reply part of ``batch``: each distinct prompt (less its last
    token) is run once and its KV cache copied to the replies that share it. ``module`` is a
    causal LM (its output has ``.logits``) or a backbone (``.last_hidden_state``)."""
    positions = (batch.prefix_mask.cumsum(-1) - 1).clamp(min=0)
    cache = module(input_ids=batch.prefix_ids, attention_mask=batch.prefix_mask, position_ids=positions,
                   use_cache=True).past_key_values
    cache.batch_select_indices(batch.rows)
    attention = torch.cat([batch.prefix_mask[batch.rows], batch.attention], 1)
    return module(input_ids=batch.input_ids, attention_mask=attention, position_ids=batch.position_ids,
                  past_key_values=cache, use_cache=True)


def completion_logprobs(model, batch: CompletionBatch, temperature: float = 1.0) -> torch.Tensor:
    """log p(completion token t | prompt, completion tokens < t), ``[B, C]``, under the
    distribution the tokens were sampled from (logits divided by ``temperature``)."""
    logits = shared_prefix_forward(model, batch).logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return logits.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
