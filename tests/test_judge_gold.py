"""A judge reward raises the hidden gold score (issue 43): bench/judge_gold.py at small sizes.

The judge ("tiny-small" taught by omnigym's SFT to answer a short rubric with ``Score: N``, N =
min(10, round(20 gold))) learns from the replies of 300 of the RLHF demo's gold-labelled pairs
(seed 1's, the session's shared demo stages) and as many random-word strings, for 200 steps;
then 12 GRPO steps of 8 prompts x 8 replies with ``--rewards judge:RUN:1.0`` start from the
demo's SFT policy. The bench's sizes (600 judge steps, 40 GRPO steps) and both seeds' figures
are in docs/judges.md.

Measured on seed 1 (about 56 s of CPU from the finished shared stages): the judge orders 0.68 of the
200 held-out pairs as gold does (0.31 ties), and GRPO takes the gold reward of one sampled reply
per held-out prompt from 0.191 to 0.347 (the judge's score 0.33 -> 0.59).
"""

from __future__ import annotations

from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.slow
def test_a_judge_reward_raises_the_gold_score(rlhf_demo_run, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import judge_gold

    sizes = judge_gold.Sizes(judge_model="tiny-small", judge_steps=200, judge_batch=16, judge_learning_rate=3e-3,
                             judge_pairs=300, grpo_steps=12, prompts_per_step=8, group_size=8, eval_prompts=100,
                             rubric="Reply: {reply}\nScore: N (0 to 10, more vowels higher)")
    result = judge_gold.one_seed(tmp_path, 1, sizes, stages=rlhf_demo_run / "stages")
    agreement, before, after = result["agreement"], result["before"], result["after"]
    assert agreement["pairwise"] >= 0.6, agreement  # 0.68 measured; a judge that says one score for all: 0
    assert after["judge"] > before["judge"], (before, after)  # GRPO raised what it was paid
    assert after["gold"] - before["gold"] >= 0.1, (before, after)  # and the hidden gold: +0.155 measured
