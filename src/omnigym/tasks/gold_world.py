"""A synthetic preference world for measuring RLHF offline (in the spirit of Gao et al., 2023,
"Scaling Laws for Reward Model Overoptimization").

Real RLHF is judged by people; here a hidden *gold* reward stands in for them. It is a fixed
rule on the text that no trainer is shown:

    gold(reply) = the fraction of the reply's letters that are vowels (a, e, i, o, u)
                  (0 for a reply with no letters)

The pipeline then runs as it would with people:

1. ``words``: SFT demonstrations. A prompt asks for a few words on a topic; the reply is 3
   to 5 made-up words of 2 to 6 random lowercase letters (so about 5 letters in 26 are
   vowels: gold ~0.19 on average, with a spread between replies to learn from).
2. Pairs are sampled from the *SFT model* (two replies per prompt) and labelled by gold:
   the reply with more vowels is ``chosen`` (ties are dropped). Only these labels reach the
   reward model and DPO; the rule itself does not.
3. PPO-RLHF optimises the learned proxy; DPO learns from the same pairs. Success is the gold
   reward of their samples on held-out prompts going up, at a KL to the SFT model that is
   reported beside it.
"""

from __future__ import annotations

import random

VOWELS = frozenset("aeiou")

TOPICS = ("rain", "stone", "river", "cloud", "fire", "bread", "glass", "moss", "salt", "wind", "sand", "ink",
          "frost", "smoke", "silk", "clay", "iron", "wool", "dust", "honey")
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def gold_reward(reply: str) -> float:
    """The fraction of the reply's letters that are vowels (0 for a reply with no letters)."""
    letters = [c for c in reply.lower() if c.isalpha()]
    return sum(c in VOWELS for c in letters) / len(letters) if letters else 0.0


def prompt(rng: random.Random) -> str:
    return f"Say a few words about {rng.choice(TOPICS)} {rng.randrange(100)}."


def reply(rng: random.Random) -> str:
    return " ".join("".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 6))) for _ in range(rng.randint(3, 5)))


def demonstrations(n: int, seed: int) -> list[dict]:
    """``n`` conversational prompt/completion rows for ``omnigym train sft --data words``."""
    rng = random.Random(seed)
    return [{"prompt": [{"role": "user", "content": prompt(rng)}],
             "completion": [{"role": "assistant", "content": reply(rng)}]} for _ in range(n)]


def prompts(n: int, seed: int) -> list[dict]:
    """``n`` prompt rows (``{"prompt": [user message]}``) for sampling pairs and for PPO."""
    rng = random.Random(seed + 7_777)
    return [{"prompt": [{"role": "user", "content": prompt(rng)}]} for _ in range(n)]


def label_pairs(rows: list[dict], replies: list[tuple[str, str]]) -> list[dict]:
    """Explicit preference rows (``prompt``/``chosen``/``rejected``, conversational) from two
    replies per prompt, the more-vowel one chosen; ties are dropped."""
    pairs = []
    for row, (a, b) in zip(rows, replies):
        gold_a, gold_b = gold_reward(a), gold_reward(b)
        if gold_a == gold_b or not a.strip() or not b.strip():
            continue
        chosen, rejected = (a, b) if gold_a > gold_b else (b, a)
        pairs.append({"prompt": row["prompt"], "chosen": [{"role": "assistant", "content": chosen}],
                      "rejected": [{"role": "assistant", "content": rejected}]})
    return pairs
