"""A process reward model (``omnigym train prm``) as a reward: ``prm:RUN_DIR``.

A PRM is a scalar head on a causal LM read at the end of every step of a reply (a step is a
non-empty line: ``tasks.steps.reply_steps``); ``sigmoid(head)`` there is the probability that
the step is right. It is one reward with two readings:

- the whole reply (``--rewards prm:RUN_DIR:1.0``, best-of-N reranking): the *minimum* of its
  step probabilities, as Math-Shepherd scores a solution (Wang et al., 2024). The product,
  PRM800K's choice (Lightman et al., 2023), falls with every extra step, right or not, so it
  prefers short replies; the minimum asks only how sure the model is of the weakest step. A
  reply with no step scores 0: nothing in it is shown right.
- each step (``step_scores``; GRPO's ``--step-rewards prm:RUN_DIR:1.0``): its probability and
  the character where it ends, which GRPO turns into a reward on the token that ends the
  step (``rl/step_rewards.py``).

Inputs are rendered as the PRM was trained (``train prm``: the prompt through the chat
template, the reply as text). ``prm:`` on a folder that is not a PRM (an ``rm`` run, a model)
is one line when the reward is named; the weights load on the first call; pickling sends the
folder, not the weights.
"""

from __future__ import annotations

from typing import Sequence

import torch

from omnigym.errors import OmnigymError
from omnigym.models.scalar_head import token_values
from omnigym.models.tokens import make_sequence_batch
from omnigym.rewards.reward_model import RewardModelScorer, prompt_of
from omnigym.tasks.steps import reply_steps

PREFIX = "prm:"
KIND = "process"
"""``kind`` in a PRM folder's omnigym_reward.json (an ``rm`` folder has none)"""


def tokenized_reply(tokenizer, reply: str) -> tuple[list[int], list[int]]:
    """The reply's tokens, and for each step (``reply_steps``) how many tokens reach through
    its last character: the step's score is read after that many reply tokens."""
    encoded = tokenizer(reply, add_special_tokens=False, return_offsets_mapping=True)
    starts = [start for start, _ in encoded["offset_mapping"]]
    return encoded["input_ids"], [sum(1 for s in starts if s < end) for _, end in reply_steps(reply)]


def step_logits(model, prompts: list[list[int]], replies: list[list[int]], ends: list[list[int]], pad_id: int,
                device) -> list[torch.Tensor]:
    """The head's logit at the end of every step of every reply: ``ends[i][k]`` reply tokens
    in, so on reply token ``ends[i][k] - 1`` (the token that ends step k), having read the
    prompt and the reply up to there. One tensor per reply, ``[len(ends[i])]``."""
    batch = make_sequence_batch([(p + r, [1] * (len(p) + len(r))) for p, r in zip(prompts, replies)], pad_id, device)
    values = token_values(model, batch.input_ids, batch.attention_mask)
    rows = [i for i, e in enumerate(ends) for _ in e]
    columns = [len(prompts[i]) + end - 1 for i, e in enumerate(ends) for end in e]
    flat = values[torch.tensor(rows, dtype=torch.long), torch.tensor(columns, dtype=torch.long)]
    return list(flat.split([len(e) for e in ends]))


def fit(prompt: list[int], reply: list[int], ends: list[int], limit: int | None) -> tuple[list[int], list[int], list[int]]:
    """``prompt`` + ``reply`` cut to ``limit`` tokens (the prompt's start goes first, then the
    reply's end); a step that ends past the cut is read at the last token kept."""
    if limit and len(prompt) + len(reply) > limit:
        prompt = prompt[-max(1, limit - len(reply)):]
        reply = reply[:max(1, limit - len(prompt))]
        ends = [min(end, len(reply)) for end in ends]
    return prompt, reply, ends


class ProcessRewardScorer(RewardModelScorer):
    """A reward model's loading, pickling and device moves (``RewardModelScorer``), scoring steps."""
    PREFIX = PREFIX

    def __init__(self, given: str, device: str = "cpu", batch_size: int = 32):
        super().__init__(given, device, batch_size)
        if self.info.get("kind") != KIND:
            raise OmnigymError(f"{PREFIX}{given} scores whole replies (a reward model of `omnigym train rm`), not "
                               f"steps; use rm:{given}, or give the run directory of `omnigym train prm`")

    @torch.no_grad()
    def step_scores(self, completions: Sequence[str], examples: Sequence[dict]) -> list[list[tuple[int, float]]]:
        """For each completion, ``(end, probability)`` per step: ``end`` is the character after
        the step's last one (``completion[end - 1]`` ends it)."""
        from omnigym.tasks.sft_data import prompt_tokens

        if len(completions) != len(examples):
            raise OmnigymError(f"{len(completions)} completions but {len(examples)} examples")
        model, tokenizer = self._load()
        out = []
        for first in range(0, len(completions), self.batch_size):
            rows = []
            for i in range(first, min(first + self.batch_size, len(completions))):
                prompt = prompt_of(examples[i])
                if isinstance(prompt, str) and self.info.get("conversational", True):
                    prompt = [{"role": "user", "content": prompt}]
                reply, ends = tokenized_reply(tokenizer, completions[i])
                rows.append(fit(prompt_tokens(f"completion {i}", prompt, tokenizer), reply, ends,
                                self.info.get("max_length")))
            scored = [row for row in rows if row[2]]
            logits = iter(step_logits(model, *map(list, zip(*scored)), tokenizer.pad_token_id, self.device)
                          if scored else [])
            for i, (_, _, ends) in enumerate(rows, first):
                probabilities = torch.sigmoid(next(logits)).tolist() if ends else []
                out.append([(end, p) for (_, end), p in zip(reply_steps(completions[i]), probabilities)])
        return out

    def __call__(self, completions: Sequence[str], examples: Sequence[dict]) -> torch.Tensor:
        """The whole reply's score: its weakest step's probability (0 for a reply with no step)."""
        return torch.tensor([min((p for _, p in steps), default=0.0) for steps in self.step_scores(completions, examples)],
                            dtype=torch.float64)
