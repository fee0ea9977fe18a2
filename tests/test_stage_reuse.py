"""A run that reuses its finished stages (``--overwrite`` retrains only the last one) logs what
the run that made them logged. Before the stages kept the random state they left, it did not:
making a stage moves torch's random state (GRPO's warm-up builds and trains the tiny model; the
RLHF demo samples its gold pairs), reusing it does not, and the sampling that follows drew other
completions (GRPO: completion lengths 14.9 vs 15.4 at step 1; online DPO: another score at step 1)."""

import shutil

import pytest
from test_rlhf import metrics, quiet, strip

from omnigym.algos import grpo, online_dpo
from omnigym.pipelines import rlhf_demo


def made_then_reused(tmp_path, train, config):
    """The run that makes its stages, and the same command again with --overwrite on a copy."""
    made, reused = tmp_path / "made", tmp_path / "reused"
    train(config(made, overwrite=False))
    shutil.copytree(made, reused)
    train(config(reused, overwrite=True))
    return strip(metrics(made)), strip(metrics(reused))


@pytest.mark.slow
def test_grpo_after_a_reused_warm_up_samples_what_it_sampled_after_making_it(tmp_path, capsys):
    def config(run, overwrite):
        return grpo.GRPOConfig(**quiet(run), seed=1, sft_steps=12, sft_eval_every=6, steps=2, eval_size=8, eval_every=2,
                               prompts_per_step=4, group_size=4, overwrite=overwrite)

    made, reused = made_then_reused(tmp_path, grpo.train, config)
    assert "warm-up: reusing" in capsys.readouterr().err
    assert len(made) == 2 and reused == made


@pytest.mark.slow
def test_online_dpo_after_reused_demo_stages_samples_what_it_sampled_after_making_them(tmp_path, monkeypatch):
    monkeypatch.setattr(rlhf_demo, "SFT_STEPS", 4)  # the demo's stages, small: the same code, less of it
    monkeypatch.setattr(rlhf_demo, "PAIR_PROMPTS", 260)  # the reward model holds 200 out
    monkeypatch.setattr(rlhf_demo, "RM_STEPS", 4)

    def config(run, overwrite):
        return online_dpo.OnlineDPOConfig(**quiet(run), seed=1, steps=2, eval_every=2, eval_prompts=8,
                                          overwrite=overwrite)

    made, reused = made_then_reused(tmp_path, online_dpo.train, config)
    assert (tmp_path / "reused" / "stages" / rlhf_demo.PAIRS_RANDOM_STATE).is_file()
    assert len(made) == 3 and reused == made  # the evaluation before step 1, then 2 steps
