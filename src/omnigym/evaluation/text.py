"""Held-out accuracy of a language policy: greedy episodes of its env, scored by a verifier."""

from __future__ import annotations

import copy

import torch

from omnigym.generators.text_env import TextEnvGenerator
from omnigym.inference.engine import SamplingParams


@torch.no_grad()
def accuracy(env, engine, tokenizer, examples: list[dict], reward, max_new_tokens: int = 32,
             max_turns: int = 8) -> float:
    """Fraction of ``examples`` whose greedy episode of ``env`` gets ``reward`` 1 (e.g. a correct answer)."""
    judged = copy.copy(env)
    judged.reward = reward
    generator = TextEnvGenerator(judged, engine, tokenizer, SamplingParams(max_new_tokens=max_new_tokens, greedy=True),
                                 max_turns)
    trajectories = generator.generate(examples, 1)
    return sum(t.reward >= 1.0 for t in trajectories.items) / max(len(examples), 1)
