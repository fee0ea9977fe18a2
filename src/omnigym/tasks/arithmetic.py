"""Procedural arithmetic problems with difficulty knobs; needs no download.

Train and held-out splits are disjoint by construction: each problem's text is hashed and
the hash decides its split, so held-out accuracy is measured on problems never trained on.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from types import MappingProxyType

from omnigym.errors import OmnigymError

OPERATIONS = MappingProxyType({"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b})


@dataclass
class ArithmeticTask:
    digits: int = 2
    """digits per operand"""
    terms: int = 2
    """operands per problem"""
    operations: str = "+"
    """operators to draw from, e.g. "+-*" """
    heldout_fraction: float = 0.2

    def __post_init__(self):
        if self.digits < 1 or self.terms < 2:
            raise OmnigymError(f"arithmetic needs digits >= 1 and terms >= 2, got {self.digits} and {self.terms}")
        unknown = set(self.operations) - set(OPERATIONS)
        if unknown or not self.operations:
            raise OmnigymError(f"unknown operations {''.join(sorted(unknown))!r}; use some of '+-*'")

    def _draw(self, rng: random.Random) -> dict:
        low, high = 10 ** (self.digits - 1) if self.digits > 1 else 0, 10**self.digits - 1
        numbers = [rng.randint(low, high) for _ in range(self.terms)]
        ops = [rng.choice(self.operations) for _ in range(self.terms - 1)]
        expression = " ".join(str(numbers[0]) if i == 0 else f"{ops[i - 1]} {numbers[i]}" for i in range(self.terms))
        # Python evaluates * before + and -, as a person would.
        answer = eval(expression, {"__builtins__": {}})  # noqa: S307 - only digits and + - * built above
        return {"question": f"What is {expression}?", "answer": str(answer), "expression": expression}

    def split_of(self, example: dict) -> str:
        digest = hashlib.sha256(example["expression"].encode()).digest()
        return "heldout" if digest[0] / 256 < self.heldout_fraction else "train"

    def sample(self, n: int, seed: int, split: str = "train") -> list[dict]:
        """``n`` problems of ``split`` ("train" or "heldout"), the same for the same seed."""
        if split not in ("train", "heldout"):
            raise OmnigymError(f"split must be 'train' or 'heldout', got {split!r}")
        rng, out = random.Random(seed), []
        for _ in range(n * 1000):
            example = self._draw(rng)
            if self.split_of(example) == split:
                out.append(example)
                if len(out) == n:
                    return out
        raise OmnigymError(f"could not draw {n} {split} problems with digits={self.digits}; the space is too small")
