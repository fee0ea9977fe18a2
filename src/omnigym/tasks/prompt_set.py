"""RL on prompts alone (PPO-RLHF, online DPO): which prompts, which are held out, which a step draws.

The prompts come from ``--data`` (``read_prompts``: a file or dataset of prompts, preference
pairs or conversations, or the offline demo's ``words``). Those that fit ``--max-prompt-length``
are shuffled by the seed; the first ``--eval-prompts`` are held out for the sampled
evaluations, the rest are drawn from, ``prompts_per_step`` a step, by a draw seeded by the
step, so a resumed run sees the prompts an uninterrupted one would.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from omnigym.errors import OmnigymError
from omnigym.tasks.sft_data import prompt_tokens


@dataclass
class PromptSetConfig:
    data: str = "words"
    """prompts: a .jsonl/.json file or dataset (rows with prompt, question, messages, or
    chosen/rejected pairs), or "words" (the demo's built-in prompts)"""
    split: str = "train"
    max_prompt_length: int = 256
    """longer prompts are left out (and counted)"""
    eval_prompts: int = 128
    """held-out prompts whose sampled replies are scored at each evaluation"""


def split_prompts(cfg, rows: list, tokenizer) -> tuple[list, list, int]:
    """(held-out, training, left out): the prompts that fit --max-prompt-length, shuffled by the
    seed, each as (example, token ids); the first --eval-prompts are held out."""
    prompts = []
    for where, prompt in rows:
        ids = prompt_tokens(where, prompt, tokenizer)
        if 2 <= len(ids) <= cfg.max_prompt_length:
            prompts.append(({"prompt": prompt}, ids))
    left_out = len(rows) - len(prompts)
    if len(prompts) <= cfg.eval_prompts:
        raise OmnigymError(f"--data {cfg.data} has {len(prompts)} prompts within --max-prompt-length "
                           f"{cfg.max_prompt_length} ({left_out} longer or empty) and --eval-prompts {cfg.eval_prompts} "
                           "holds out that many or more")
    random.Random(cfg.seed).shuffle(prompts)
    return prompts[:cfg.eval_prompts], prompts[cfg.eval_prompts:], left_out


def prompts_for_step(cfg, training: list, step: int) -> list[dict]:
    """Step ``step``'s prompts: a seeded draw, the same whether the run was resumed or not."""
    batch = random.Random(cfg.seed * 7_919 + step).sample(training, min(cfg.prompts_per_step, len(training)))
    return [{**example, "prompt_ids": ids} for example, ids in batch]
