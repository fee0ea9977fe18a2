"""Token batches for a causal LM and the log-probabilities of their tokens.

``TokenBatch`` (prompt + completion, right-padded) is the plain batch;
``CompletionBatch`` runs what prompts share once (each distinct prompt, and the prefix the
whole batch shares) and scores the completions that read it: what SFT, the preference
trainers and the policy and reference passes of RL read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omnigym.models.precision import autocast_for


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


def make_trained_batch(sequences: list[tuple[list[int], list[int]]], pad_id: int,
                       device="cpu") -> "TokenBatch | CompletionBatch":
    """(token ids, trained) sequences as the cheapest batch that gives the same loss. Where
    prompts (the tokens before each sequence's first trained one) repeat, as in preference
    pairs, each sequence is split there and every distinct prompt runs once. Where they are
    all distinct, as in SFT, the sequences are split where they stop agreeing, and what they
    all start with (a chat template's header, a system prompt) runs once. With fewer than
    ``MIN_TRUNK`` tokens to share, the plain padded batch. ``batch_logprobs`` and
    ``loss_mask`` line up either way."""
    firsts = [trained.index(1) if 1 in trained else len(ids) for ids, trained in sequences]
    prompts = [tuple(ids[:first]) for first, (ids, _) in zip(firsts, sequences)]
    if len(set(prompts)) < len(prompts) and min(firsts) >= 2:
        splits = firsts
    else:
        shared = min(common_prefix_length([ids for ids, _ in sequences]), min(firsts))
        if shared < MIN_TRUNK:
            return make_sequence_batch(sequences, pad_id, device)
        splits = [shared] * len(sequences)
    if any(split == len(ids) for split, (ids, _) in zip(splits, sequences)):  # nothing after the split
        return make_sequence_batch(sequences, pad_id, device)
    return make_completion_batch([ids[:split] for split, (ids, _) in zip(splits, sequences)],
                                 [ids[split:] for split, (ids, _) in zip(splits, sequences)], pad_id,
                                 [trained[split:] for split, (_, trained) in zip(splits, sequences)], device)


def batch_logprobs(model, batch: "TokenBatch | CompletionBatch") -> torch.Tensor:
    """The log-probabilities ``batch.loss_mask`` weighs, from either kind of batch."""
    return completion_logprobs(model, batch) if isinstance(batch, CompletionBatch) else token_logprobs(model, batch)


def token_logprobs(model, batch: TokenBatch) -> torch.Tensor:
    """log p(token t+1 | tokens <= t) for every position, ``[B, L-1]``."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    return gathered_logprobs(logits, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def gathered_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)`` at ``targets`` (``[..., k]`` ids per position -> ``[..., k]``),
    taken as logit - logsumexp: no second vocabulary-wide tensor is made."""
    return logits.gather(-1, targets) - torch.logsumexp(logits, -1, keepdim=True)


def target_logprobs(model, batch: TokenBatch, targets: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each row's log-probs of the ids ``targets[i]`` names at each of its positions (``(n,)``,
    or ``(n, k)`` for k candidates per position), from one forward of the right-padded
    ``batch`` (``make_sequence_batch``): a caller that names its own targets, as the Tinker
    server's clients do (the next token, or the top k of a teacher)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    result = []
    for row, wanted in enumerate(targets):
        n = len(wanted)
        picked = gathered_logprobs(logits[row, :n], wanted.view(n, -1).to(logits.device))
        result.append(picked.view(wanted.shape).cpu())
    return result


def token_budget_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Consecutive sequences grouped into right-padded micro-batches of at most ``max_tokens``
    (padded width x rows), by index; a sequence longer than that is a batch alone."""
    batches, current, width = [], [], 0
    for i, n in enumerate(lengths):
        if current and max(width, n) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, width = [], 0
        current.append(i)
        width = max(width, n)
    return batches + ([current] if current else [])


# Below this many tokens a batch-wide common prefix is not run on its own: one more forward
# call costs a small model more than the repeated tokens it saves.
MIN_TRUNK = 8


def common_prefix_length(sequences) -> int:
    """The length of the longest prefix all ``sequences`` start with."""
    first, n = sequences[0], min(map(len, sequences))
    for other in sequences[1:]:
        n = next((i for i in range(n) if other[i] != first[i]), n)
    return n


@dataclass
class ContextLevel:
    """One level of a batch's shared context. Its rows continue the rows of the level before
    (``parents``; None on the first level) and are run once however many replies read them."""
    ids: torch.Tensor             # [N, L], left-padded
    mask: torch.Tensor            # [N, L]
    position_ids: torch.Tensor    # [N, L]
    parents: torch.Tensor | None  # [N]

    def to(self, device) -> "ContextLevel":
        return ContextLevel(self.ids.to(device), self.mask.to(device), self.position_ids.to(device),
                            None if self.parents is None else self.parents.to(device))


def padded_level(rows, pad_id: int, start: int = 0, parents: torch.Tensor | None = None) -> ContextLevel:
    """``rows`` left-padded, their positions counted from ``start`` over real tokens only."""
    ids, mask = left_pad(rows, max(map(len, rows)), pad_id)
    return ContextLevel(ids, mask, start + (mask.cumsum(-1) - 1).clamp(min=0), parents)


def context_levels(contexts: list[tuple[int, ...]], pad_id: int) -> tuple[list[ContextLevel], torch.Tensor]:
    """Distinct contexts as a prefix tree: the tokens all of them start with (a chat template's
    header, a system prompt), run once, then each context's own rest. Returns the levels and,
    for each context, its row in the last level."""
    trunk = common_prefix_length(contexts) if len(contexts) > 1 else 0
    if trunk < MIN_TRUNK:
        return [padded_level(contexts, pad_id)], torch.arange(len(contexts))
    levels = [padded_level([contexts[0][:trunk]], pad_id)]
    rests = [c[trunk:] for c in contexts]
    if not any(rests):  # the contexts differ only in their last prompt token
        return levels, torch.zeros(len(contexts), dtype=torch.long)
    levels.append(padded_level(rests, pad_id, trunk, torch.zeros(len(rests), dtype=torch.long)))
    return levels, torch.arange(len(contexts))


@dataclass
class CompletionBatch:
    """Completions scored against the prompts they share. A prompt less its last token is its
    *context*; contexts run once as a prefix tree (``context_levels``: what every prompt of
    the batch starts with, then each distinct prompt's rest), and their KV cache is copied to
    the completions that read it. The completion pass starts from the prompt's last token. A
    group of 8 samples of one prompt pays for the prompt once instead of 8 times, a system
    prompt is paid for once per batch, forward and backward, and the numbers are the same."""
    context: list[ContextLevel]   # outermost first
    rows: torch.Tensor            # [B], each completion's row in the last context level
    input_ids: torch.Tensor       # [B, C], last prompt token + completion[:-1], right-padded
    position_ids: torch.Tensor    # [B, C]
    targets: torch.Tensor         # [B, C], the completion tokens
    loss_mask: torch.Tensor       # [B, C], 1 on completion tokens the loss counts
    attention: torch.Tensor       # [B, C], 1 on every completion token (generated or inserted)
    packed: "PackedReplies | None" = None  # the same replies in fewer rows, when they fit

    def to(self, device) -> "CompletionBatch":
        return CompletionBatch([level.to(device) for level in self.context],
                               *(t.to(device) for t in (self.rows, self.input_ids, self.position_ids, self.targets,
                                                        self.loss_mask, self.attention)),
                               None if self.packed is None else self.packed.to(device))


@dataclass
class PackedReplies:
    """Replies that read the same context row, laid end to end in fewer (up to twice as wide)
    rows, each attending to the context and to its own earlier tokens only (a block-causal
    mask): most of the padding a batch of uneven replies carries is not run. ``index``
    reads the packed outputs back into the batch's ``[B, C]`` layout."""
    rows: torch.Tensor          # [P], each packed row's row in the last context level
    input_ids: torch.Tensor     # [P, W], W between C and 2C
    position_ids: torch.Tensor  # [P, W]
    targets: torch.Tensor       # [P, W]
    block: torch.Tensor         # [P, 1, W, W] bool, which reply tokens each reply token sees
    index: torch.Tensor         # [B, C], each batch position's place in the flattened [P * W] rows

    def to(self, device) -> "PackedReplies":
        return PackedReplies(*(t.to(device) for t in (self.rows, self.input_ids, self.position_ids, self.targets,
                                                       self.block, self.index)))


def pack_replies(rows: list[int], lengths: list[int]) -> tuple[list[list[int]], int] | None:
    """Replies grouped into packed rows (first fit, longest first; only replies of the same
    context row together), and the rows' width: the one of the longest reply up to twice it
    that runs the fewest tokens. None when no width saves any."""
    longest, order = max(lengths), sorted(range(len(lengths)), key=lambda i: -lengths[i])
    best, best_tokens = None, len(lengths) * longest
    for width in sorted({longest * k // 4 for k in range(4, 9)}):
        bins: dict[int, list[list]] = {}  # context row -> its packed rows, each [free tokens, replies]
        for i in order:
            own = bins.setdefault(rows[i], [])
            fit = next((b for b in own if b[0] >= lengths[i]), None)
            if fit is None:
                own.append([width - lengths[i], [i]])
            else:
                fit[0] -= lengths[i]
                fit[1].append(i)
        groups = [members for own in bins.values() for _, members in own]
        if len(groups) * width < best_tokens:
            best, best_tokens = (groups, width), len(groups) * width
    return best


def packed_replies(groups: list[list[int]], width: int, lengths: list[int], batch: "CompletionBatch") -> PackedReplies:
    """The packed layout of ``batch``'s replies (``groups``: the batch rows in each packed row)."""
    columns = batch.input_ids.shape[1]
    source = [-1] * (len(groups) * width)  # each packed position's place in the flattened [B * C] batch
    segment = [-1] * (len(groups) * width)
    index = [0] * (len(lengths) * columns)
    for p, members in enumerate(groups):
        start = p * width
        for i in members:
            n = lengths[i]
            source[start:start + n] = range(i * columns, i * columns + n)
            segment[start:start + n] = [i] * n
            # the batch's padding reads the reply's last real token, an empty reply the row's
            # first (the loss mask drops both)
            index[i * columns:(i + 1) * columns] = [start + min(t, n - 1) if n else p * width for t in range(columns)]
            start += n
    source, segment = torch.tensor(source).view(-1, width), torch.tensor(segment).view(-1, width)
    real, take = source >= 0, source.clamp(min=0)
    input_ids, targets = (batch.input_ids.flatten()[take] * real, batch.targets.flatten()[take] * real)
    position_ids = batch.position_ids.flatten()[take] * real
    block = (segment[:, :, None] == segment[:, None, :]) & torch.ones(width, width, dtype=torch.bool).tril()
    block |= torch.eye(width, dtype=torch.bool)  # a padding position sees itself: no row is all masked
    return PackedReplies(batch.rows[[members[0] for members in groups]], input_ids, position_ids, targets,
                         block[:, None], torch.tensor(index).view(-1, columns))


def make_completion_batch(prompts: list[list[int]], completions: list[list[int]], pad_id: int,
                          masks: list[list[int]] | None = None, device="cpu") -> CompletionBatch:
    """``completions[i]`` follows ``prompts[i]``; ``masks[i]`` (default all 1) marks the
    tokens the loss counts: a multi-turn episode's tool and template tokens are 0."""
    if min(len(p) for p in prompts) < 2:
        raise ValueError("every prompt needs at least 2 tokens")
    distinct, rows = distinct_rows(prompts)
    levels, last_row = context_levels([p[:-1] for p in distinct], pad_id)
    length = max(len(c) for c in completions)
    padding = [[pad_id] * (length - len(c)) for c in completions]
    input_ids = torch.tensor([(p[-1:] + c[:-1])[:len(c)] + pad for p, c, pad in zip(prompts, completions, padding)])
    targets = torch.tensor([c + pad for c, pad in zip(completions, padding)])
    attention = torch.tensor([[1] * len(c) + [0] * len(pad) for c, pad in zip(completions, padding)])
    loss_mask = attention.float() if masks is None else \
        torch.tensor([list(m) + [0] * len(pad) for m, pad in zip(masks, padding)], dtype=torch.float32)
    starts = torch.tensor([len(p) - 1 for p in prompts])
    position_ids = starts[:, None] + torch.arange(length)[None]
    batch = CompletionBatch(levels, last_row[rows], input_ids, position_ids, targets, loss_mask, attention)
    lengths = [len(c) for c in completions]
    packing = pack_replies(batch.rows.tolist(), lengths)
    if packing is not None:
        batch.packed = packed_replies(*packing, lengths, batch)
    return batch.to(device)


def cache_name() -> str:
    """The keyword (and output field) a transformers model takes its KV cache by. transformers
    5.x renamed ``past_key_values`` to ``cache``, warns on every call made with the old name and
    drops it in 5.40; the versions before the rename (down to our lower bound, 4.51) know only
    the old name. Asked of the output class, not of the version number, so a release that
    renames in between is read right too."""
    from transformers.modeling_outputs import BaseModelOutputWithPast

    return "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


def shared_prefix_forward(module, batch: CompletionBatch, read):
    """``read(output, targets)`` at every reply position of ``batch``, ``[B, C]``: ``module``'s
    output (a causal LM's ``.logits``, a backbone's ``.last_hidden_state``) turned into one
    value per position there. The context levels run once each, their KV cache copied down the
    tree to the replies that read them; packed replies run in fewer rows and are read back
    into the batch's layout (after ``read``, so a vocabulary-wide output is never copied)."""
    with autocast_for(module):  # --precision bf16: one region, so a trained weight is cast once, not once a call
        return _shared_prefix_forward(module, batch, read)


def _shared_prefix_forward(module, batch: CompletionBatch, read):
    cache, seen = None, None  # seen: which context tokens so far are real, per row
    name = cache_name()
    for level in batch.context:
        if cache is not None:
            cache.batch_select_indices(level.parents)
            seen = seen[level.parents]
        seen = level.mask if seen is None else torch.cat([seen, level.mask], 1)
        output = module(input_ids=level.ids, attention_mask=seen, position_ids=level.position_ids,
                        use_cache=True, **{name: cache})
        cache = getattr(output, name)
    packed = batch.packed
    # flash-attention kernels take no 4-D mask: their models run the padded rows; so does a
    # recurrent LM (models/lstm_lm.py), whose state, not a mask, says what a token has read
    if packed is None or (getattr(module.config, "_attn_implementation", None) or "sdpa") not in ("sdpa", "eager") \
            or getattr(module, "is_recurrent", False):
        cache.batch_select_indices(batch.rows)
        attention = torch.cat([seen[batch.rows], batch.attention], 1)
        output = module(input_ids=batch.input_ids, attention_mask=attention, position_ids=batch.position_ids,
                        use_cache=True, **{name: cache})
        return read(output, batch.targets)
    cache.batch_select_indices(packed.rows)
    context = seen[packed.rows].bool()[:, None, None, :].expand(-1, 1, packed.block.shape[2], -1)
    output = module(input_ids=packed.input_ids, attention_mask=torch.cat([context, packed.block], -1),
                    position_ids=packed.position_ids, use_cache=True, **{name: cache})
    return read(output, packed.targets).flatten(0, 1)[packed.index]


def completion_logprobs(model, batch: CompletionBatch, temperature: float = 1.0) -> torch.Tensor:
    """log p(completion token t | prompt, completion tokens < t), ``[B, C]``, under the
    distribution the tokens were sampled from (logits divided by ``temperature``)."""

    def token_logprob(output, targets):
        logits = output.logits.float()
        if temperature != 1.0:
            logits = logits / temperature
        return gathered_logprobs(logits, targets.unsqueeze(-1)).squeeze(-1)

    return shared_prefix_forward(model, batch, token_logprob)


def local_batch(trainer, sequences: list, pad_id: int, device: str):
    """This process's rows of a batch of sequences, and their share of its loss tokens (the
    loss is a token mean: a data-parallel step weighs each process by its tokens; the first
    token of a sequence is never predicted, so it is not counted)."""
    local, share = trainer.local_part(sequences, weights=[sum(trained[1:]) for _, trained in sequences])
    return make_trained_batch(local, pad_id, device), share


def padded(rows: list[list], width: int | None = None) -> torch.Tensor:
    """Right-padded ``[B, width]`` float tensor of ragged rows (per-token log-probs, loss masks)."""
    width = width or max(map(len, rows))
    out = torch.zeros((len(rows), width))
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.tensor(row, dtype=torch.float32)
    return out
