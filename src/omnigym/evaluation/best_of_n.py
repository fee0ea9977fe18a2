"""Best-of-N as an evaluation: from ``n`` scored replies per prompt, the accuracy of keeping the
reply a reranker scores highest among ``k`` of them, for each ``k <= n``, beside the oracle
pass@k (some reply among the ``k`` is correct).

Both are the exact expectation over all ``C(n, k)`` subsets of ``k`` of the ``n`` replies, so one
set of ``n`` samples per prompt gives every point of the curve without the noise of picking
one subset (taking the first ``k`` would). For pass@k this is the unbiased estimator of Chen et
al. (2021), ``1 - C(n - c, k) / C(n, k)`` with ``c`` correct replies. For a reranker: order the
``n`` replies best first (a tie goes to the earlier sample); the reply at rank ``r`` (0-based) is
the one kept from a subset exactly when the subset holds it and none of the ``r`` ranked above
it, which ``C(n - 1 - r, k - 1)`` of the subsets do. The replies are independent draws, so
breaking ties by draw order is breaking them at random, and each point is an unbiased estimate
of best-of-k with random tie-breaking.
"""

from __future__ import annotations

from math import comb
from typing import Sequence


def ranking(scores: Sequence[float]) -> list[int]:
    """Indices of ``scores``, highest first; equal scores keep their order (the earlier sample first)."""
    return sorted(range(len(scores)), key=lambda i: -scores[i])


def best_of_k(scores: Sequence[float], correct: Sequence[bool], k: int) -> float:
    """Expected correctness of the top-scored reply among ``k`` of the ``n`` replies drawn at random."""
    n = len(scores)
    if not 1 <= k <= n or len(correct) != n:
        raise ValueError(f"best_of_k needs 1 <= k <= n and one correctness per score, got k={k}, n={n}, "
                         f"{len(correct)} correctness values")
    kept = sum(comb(n - 1 - rank, k - 1) for rank, i in enumerate(ranking(scores)) if correct[i])
    return kept / comb(n, k)


def pass_at_k(correct: Sequence[bool], k: int) -> float:
    """The probability that some reply among ``k`` of the ``n`` drawn at random is correct."""
    n = len(correct)
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n, got k={k}, n={n}")
    return 1.0 - comb(n - sum(bool(c) for c in correct), k) / comb(n, k)


def curve_points(n: int) -> list[int]:
    """The ``k`` a curve up to ``n`` shows: 1, 2, 4, ... up to ``n``, and ``n`` itself."""
    points = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return points + ([n] if points[-1] != n else [])


def accuracy_curve(groups: Sequence[tuple[Sequence[float], Sequence[bool]]], points: Sequence[int]) -> list[dict]:
    """One row per ``k`` in ``points``: ``best_of_n`` (the reranked pick's accuracy) and ``pass_at_n``
    (the oracle's), each the mean over prompts; ``groups`` holds each prompt's (scores, correct)."""
    return [{"n": k, "best_of_n": sum(best_of_k(s, c, k) for s, c in groups) / len(groups),
             "pass_at_n": sum(pass_at_k(c, k) for _, c in groups) / len(groups)} for k in points]
