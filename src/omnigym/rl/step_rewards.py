"""Process rewards inside one reply, placed on tokens: GRPO's ``--step-rewards prm:RUN_DIR:1.0``.

A reward that scores steps (``step_scores(completions, examples)``: for each reply, ``(end,
value)`` per step, ``end`` the character after the step's last one; ``prm:`` does) is read
on each episode's reply as the generator scored it (its tokens decoded, special tokens
left out). Each step's weighted value goes to ``info["step_rewards"]`` as ``(token, value)``:
``token`` is the reply token that holds the step's last character, found by decoding the
reply one token longer at a time (what the tokenizer makes of a token depends on those
before it, so a token's text is not read alone). ``grpo.token_rewards`` adds them to the
token rewards, and ``step_reward_tensor`` hands them to the advantage estimator apart, so
``--advantage process`` (``rl/advantages.py``) can tell them from the outcome.

The trainer places them, after the rollouts come back, so every runtime (sync, async, Ray)
gets the same: the PRM runs where the policy trains, once per step, on all replies at once.
"""

from __future__ import annotations

import torch

from omnigym.errors import OmnigymError


def step_scorer(spec: str, places: dict | None = None):
    """``--step-rewards``: weighted rewards (``name:weight,...``), each one that scores steps;
    ``places`` as ``parse_weights``'s (a resumed run's folders, found where it recorded them)."""
    from omnigym.rewards import parse_weights

    reward = parse_weights(spec, places=places, flag="--step-rewards")
    flat = [name for name, part in reward.parts.items() if not hasattr(part, "step_scores")]
    if flat:
        raise OmnigymError(f"--step-rewards: {', '.join(flat)} scores whole replies, not steps; name a process reward "
                           "model (prm:RUN_DIR of omnigym train prm), and put whole-reply rewards in --rewards")
    return reward


def character_ends(tokenizer, ids: list[int]) -> list[int]:
    """The length of the reply's decoded text through each of its tokens."""
    return [len(tokenizer.decode(ids[:i + 1], skip_special_tokens=True)) for i in range(len(ids))]


def token_ending(char_end: int, ends: list[int]) -> int:
    """The first token whose text reaches ``char_end``: the one that holds character ``char_end - 1``."""
    return next((i for i, end in enumerate(ends) if end >= char_end), len(ends) - 1)


def place_step_rewards(reward, trajectories, tokenizer) -> dict:
    """Score each episode's reply step by step and store ``info["step_rewards"]``; returns the
    step metrics (mean weighted step reward, steps per reply)."""
    items = trajectories.items
    ids = [[t for t, m in zip(item.response_ids, item.loss_mask) if m] for item in items]
    texts = [tokenizer.decode(row, skip_special_tokens=True) for row in ids]
    examples = [item.example for item in items]
    summed: list[dict[int, float]] = [{} for _ in items]
    for name, weight in reward.weights.items():
        for row, steps in zip(summed, reward.parts[name].step_scores(texts, examples)):
            for end, value in steps:
                row[end] = row.get(end, 0.0) + weight * value
    values = []
    for item, row, reply in zip(items, summed, ids):
        ends = character_ends(tokenizer, reply) if row else []
        item.info["step_rewards"] = [(token_ending(end, ends), value) for end, value in sorted(row.items())]
        values += row.values()
    return {"reward/step_mean": sum(values) / len(values) if values else 0.0,
            "reward/steps_per_reply": len(values) / max(1, len(items))}


def step_reward_tensor(trajectories, masks: torch.Tensor) -> torch.Tensor:
    """``[episodes, tokens]``: each step reward on its token (a position of the generated tokens,
    mapped through the loss mask), NaN where no step ends."""
    out = torch.full(masks.shape, float("nan"))
    for b, item in enumerate(trajectories.items):
        positions = torch.nonzero(masks[b] > 0).squeeze(1).tolist()
        for token, value in item.info.get("step_rewards") or ():
            if positions:
                at = positions[min(token, len(positions) - 1)]
                out[b, at] = value if out[b, at].isnan() else out[b, at] + value
    return out
