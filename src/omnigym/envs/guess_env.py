"""A multi-turn game with feedback: guess the secret number.

Each reply is one guess, ``<guess>N</guess>``; the env answers as the user, "higher",
"lower", or how to reply when the reply is not exactly one guess of a whole number in range.
The episode ends when the guess is right (scored: 1 + 0.5 x the share of turns left, so
fewer turns score more) or at the turn limit (truncated, reward 0). Bisection solves
1..``high`` in ceil(log2(high + 1)) turns, so ``max_turns`` below that makes luck count.

The game cannot be won by a malformed reply: a reply with several guesses, a number with
signs, decimals or non-ASCII digits, or a guess out of range only earns the instructions
again (and uses a turn); the reward reads the final reply again with the same rule and the
secret, so a reply that is not the winning guess scores 0 whatever the episode thinks.
"""

from __future__ import annotations

import random
import re

from omnigym.envs.text import ToolEnv

GUESS = re.compile(r"<guess>\s*([0-9]{1,9})\s*</guess>", re.ASCII)
TAG = re.compile(r"<guess>", re.IGNORECASE)

SYSTEM_PROMPT = ("Guess the secret whole number. Reply with exactly one guess, like <guess>50</guess>; "
                 "you will be told whether the secret is higher or lower.")


def read_guess(text: str, high: int) -> int | None:
    """The one guess in ``text``, or None unless there is exactly one, a whole number in 1..high."""
    if len(TAG.findall(text)) != 1:
        return None
    found = GUESS.findall(text)
    if len(found) != 1:
        return None
    value = int(found[0])
    return value if 1 <= value <= high else None


def guess_score(completion: str, example: dict) -> float:
    """1 + 0.5 x (turns left / max turns) for the winning guess, else 0."""
    high, secret = int(example["high"]), int(example["answer"])
    if read_guess(completion, high) != secret:
        return 0.0
    turns, max_turns = int(example.get("turns", 1)), max(int(example.get("max_turns", 1)), 1)
    return 1.0 + 0.5 * max(max_turns - turns, 0) / max_turns


class GuessEnv(ToolEnv):
    """Number guessing: the secret is ``example["answer"]`` in 1..``example["high"]``."""

    TOOLS = ()

    def __init__(self, examples, reward, system_prompt=None, max_turns: int = 8):
        super().__init__(examples, reward, system_prompt, max_turns, tools=())

    def demonstration(self, example: dict) -> list[dict]:
        """Bisection to the secret, with the env's feedback (GRPO's warm-up)."""
        low, high, secret, turns = 1, int(example["high"]), int(example["answer"]), []
        while True:
            guess = (low + high) // 2
            turns.append({"role": "assistant", "content": f"<guess>{guess}</guess>"})
            if guess == secret:
                return turns
            turns.append({"role": "user", "content": feedback(guess, secret)})
            low, high = (guess + 1, high) if secret > guess else (low, guess - 1)

    def respond(self, text: str):
        self.turns += 1
        self.messages.append({"role": "assistant", "content": text})
        high, secret = int(self.example["high"]), int(self.example["answer"])
        guess = read_guess(text, high)
        if guess == secret:
            # the reward sees how many turns it took: a copy of the example, this episode's own
            self.example = {**self.example, "turns": self.turns, "max_turns": self.max_turns}
            return list(self.messages), True, False, {"example": self.example}
        if guess is None:
            reply = f"Reply with exactly one guess, a whole number from 1 to {high}, like <guess>{(high + 1) // 2}</guess>."
        else:
            reply = feedback(guess, secret)
        self.messages.append({"role": "user", "content": reply})
        truncated = self.turns >= self.max_turns
        return list(self.messages), False, truncated, {"example": self.example, "valid_guess": guess is not None}


def feedback(guess: int, secret: int) -> str:
    return f"{guess} is wrong: the secret is {'higher' if secret > guess else 'lower'}."


def guess_examples(n: int, seed: int, high: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"question": f"I am thinking of a whole number from 1 to {high}. Guess it.", "answer": str(rng.randint(1, high)),
             "high": high} for _ in range(n)]


def guess_env(n: int = 5000, seed: int = 0, high: int = 100, system_prompt: str | None = SYSTEM_PROMPT,
              max_turns: int = 8) -> GuessEnv:
    """``guess-v0``: a secret in 1..``high``, ``max_turns`` guesses."""
    from omnigym.rewards import per_sample

    return GuessEnv(guess_examples(n, seed, high), per_sample(guess_score), system_prompt, max_turns)
