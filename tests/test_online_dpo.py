"""train online_dpo: pairs are each prompt's best and worst sampled reply as the judge scores them,
the policy moves, same seed gives the same metrics, an interrupted run resumes to the same
metrics, Ray generators run it K versions behind, bad input is one line with no run left behind;
and (slow) the offline demo raises the hidden gold reward."""

import shutil

import pytest
import torch
from safetensors.torch import load_file
from test_rlhf import (interrupt_at, local_ray, metrics, pairs_file, quiet,  # noqa: F401
                       record_reward_model_scores, reward_model, strip, strip_async)

from omnigym.algos import online_dpo
from omnigym.algos.lm.online_dpo import best_and_worst
from omnigym.cli import main
from omnigym.generators.base import Trajectory


def cfg(reward_dir, pairs, **kw):
    return {**dict(rewards=f"rm:{reward_dir}:1.0", data=str(pairs), steps=4, prompts_per_step=6, samples_per_prompt=3,
                   eval_prompts=8, eval_every=2, checkpoint_every=2, max_new_tokens=12, gold_reward="gold_vowels:1.0",
                   learning_rate=1e-3), **kw}


def reply(group: int, tokens: list[int]) -> Trajectory:
    return Trajectory([1, 2], tokens, [1] * len(tokens), [0.0] * len(tokens), 0.0, group, 0, {}, {"finished": True})


def test_each_prompt_pairs_its_best_and_worst_reply_and_a_tie_gives_none():
    items = [reply(0, [5]), reply(0, [6]), reply(0, [7]), reply(1, [8]), reply(1, [9]), reply(2, [3]), reply(2, [4])]
    scores = torch.tensor([0.2, 0.9, -0.4, 0.5, 0.5, -1.0, 1.0], dtype=torch.float64)
    pairs = best_and_worst(items, scores)
    assert [(c.response_ids, r.response_ids) for c, r in pairs] == [([6], [7]), ([4], [3])]


def test_trains_on_the_judges_best_and_worst_replies(tmp_path, reward_model, pairs_file, monkeypatch):
    reward_dir, _ = reward_model
    calls = record_reward_model_scores(monkeypatch)
    summary = online_dpo.train(online_dpo.OnlineDPOConfig(**quiet(tmp_path / "run"),
                                                          **cfg(reward_dir, pairs_file, missing_eos_penalty=0.0)))
    rows = [r for r in metrics(tmp_path / "run") if "pairs/kept_fraction" in r]
    steps = [c for c in calls if len(c[0]) == 6 * 3]  # a step's 6 prompts x 3 replies (evaluations score 8)
    assert len(rows) == len(steps) == 4
    for row, (_, _, scores) in zip(rows, steps):  # the replies come grouped by prompt, 3 a prompt
        groups = scores.double().view(6, 3)
        differ = groups.max(1).values > groups.min(1).values
        assert row["pairs/kept_fraction"] == pytest.approx(differ.double().mean().item())
        assert row["reward/chosen_score"] == pytest.approx(groups.max(1).values[differ].mean().item(), abs=1e-5)
        assert row["reward/rejected_score"] == pytest.approx(groups.min(1).values[differ].mean().item(), abs=1e-5)
    # the policy starts as the reference (margin 0) and moves toward the chosen replies at every
    # step: the implicit reward margin grows (0, 0.02, 0.13, 0.17 here), and so does the KL to
    # the reference at each evaluation (0, 0.35, 1.02). Four steps teach the judge nothing yet:
    # its score went 2.60 -> 2.21 here, so the summary is checked for what it reports, not a gain.
    margins = [r["rewards/margin"] for r in rows]
    assert margins[0] == 0.0 and all(a < b for a, b in zip(margins, margins[1:])), margins
    evals = [r for r in metrics(tmp_path / "run") if "eval/judge_score" in r]
    kls = [r["eval/kl"] for r in evals]
    assert len(evals) == 3 and kls[0] == 0.0 and all(a < b for a, b in zip(kls, kls[1:])), kls
    assert (summary["score_before"], summary["score_after"]) == (evals[0]["eval/judge_score"],
                                                                 evals[-1]["eval/judge_score"])
    assert (summary["gold_before"], summary["gold_after"], summary["kl"]) == (
        evals[0]["eval/gold_reward"], evals[-1]["eval/gold_reward"], kls[-1])


def test_the_policy_changes_and_the_same_seed_gives_the_same_metrics(tmp_path, reward_model, pairs_file):
    reward_dir, _ = reward_model
    settings = cfg(reward_dir, pairs_file, steps=3)
    online_dpo.train(online_dpo.OnlineDPOConfig(**quiet(tmp_path / "a"), **settings))
    online_dpo.train(online_dpo.OnlineDPOConfig(**quiet(tmp_path / "b"), **settings))
    assert strip(metrics(tmp_path / "a")) == strip(metrics(tmp_path / "b"))
    online_dpo.train(online_dpo.OnlineDPOConfig(**quiet(tmp_path / "c"), **{**settings, "steps": 1}))
    trained, barely = (load_file(str(tmp_path / run / "model" / "model.safetensors")) for run in ("a", "c"))
    assert any(not torch.equal(trained[k], barely[k]) for k in trained)


def test_an_interrupted_run_resumes_to_the_same_metrics(tmp_path, reward_model, pairs_file, monkeypatch):
    reward_dir, _ = reward_model
    settings = cfg(reward_dir, pairs_file)
    online_dpo.train(online_dpo.OnlineDPOConfig(**quiet(tmp_path / "a"), **settings))
    interrupt_at(monkeypatch, online_dpo, 4)  # inside step 4, after the checkpoint at step 2
    with pytest.raises(KeyboardInterrupt):
        online_dpo.train(online_dpo.OnlineDPOConfig(**quiet(tmp_path / "b"), **settings))
    monkeypatch.undo()
    online_dpo.train(online_dpo.OnlineDPOConfig(**quiet(None, resume=str(tmp_path / "b")), **settings))
    assert strip(metrics(tmp_path / "b")) == strip(metrics(tmp_path / "a"))


def test_on_ray_generators_the_pairs_are_k_versions_old_and_repeatable(tmp_path, reward_model, pairs_file, local_ray):
    pytest.importorskip("ray", reason="ray is not installed (the [ray] extra; in [dev])")
    reward_dir, _ = reward_model
    settings = cfg(reward_dir, pairs_file, steps=5, runtime="ray", max_staleness=2, num_generators=2)
    online_dpo.train(online_dpo.OnlineDPOConfig(**quiet(tmp_path / "a"), **settings))
    online_dpo.train(online_dpo.OnlineDPOConfig(**quiet(tmp_path / "b"), **settings))
    rows = strip_async(metrics(tmp_path / "a"))
    assert rows == strip_async(metrics(tmp_path / "b"))
    steps = [r for r in rows if "pairs/kept_fraction" in r]
    assert [r["async/staleness_mean"] for r in steps] == [0.0, 1.0, 2.0, 2.0, 2.0]
    assert steps[-1]["losses/loss"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--samples-per-prompt", "1"], "--samples-per-prompt must be at least 2"),
    (["--model", "{tmp}"], "give --rewards, the judge"),
    (["--rewards", "rm:{tmp}:1.0"], "is not a reward model"),
    (["--rewards", "no_such_reward:1.0"], "unknown reward 'no_such_reward'"),
    (["--loss", "kto"], "unknown --loss 'kto'"),
    (["--behaviour-cap", "2"], "online DPO's loss has no such ratio"),
    (["--max-staleness", "2"], "--max-staleness: read by --runtime ray only"),
    (["--data", "{tmp}/none.jsonl"], "no such file"),
])
def test_bad_input_is_one_line_and_no_run_dir(tmp_path, capsys, argv, message):
    run_dir = tmp_path / "run"
    assert main(["train", "online_dpo", *[a.format(tmp=tmp_path) for a in argv], "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not run_dir.exists()


@pytest.mark.slow
def test_offline_demo_raises_the_gold_reward(tmp_path, rlhf_demo_run, capsys):
    """Seed 1, the defaults of `omnigym train online_dpo` (the demo's SFT policy and reward
    model, 100 steps of 16 pairs). Measured: gold 0.197 -> 0.717 at KL 11.85 nats (docs/online_dpo.md).
    The demo's stages are the session's (conftest.py), reused with --overwrite as a second start
    of the demo reuses its own: the same figures as a run that makes them."""
    shutil.copytree(rlhf_demo_run, tmp_path / "run")
    summary = online_dpo.train(online_dpo.OnlineDPOConfig(**quiet(tmp_path / "run"), overwrite=True))
    assert summary["gold_before"] < 0.25 and summary["gold_after"] >= summary["gold_before"] + 0.15
    # KL: 11.85 nats on the AMD EPYC (Zen 3) where the docs' figure was measured, 20.5 on an Intel Xeon
    # with AVX-512 under the tests' ATEN_CPU_CAPABILITY=avx2 (the BLAS picks its kernels by CPU): a bound
    # that says the policy moved and did not run off, not a figure
    assert summary["score_after"] > summary["score_before"] + 1.0 and 0 < summary["kl"] < 30
    assert "reward hacking?" not in capsys.readouterr().err  # test_hacking_trainers.py plants a judge that hacks


def test_a_run_whose_judge_never_makes_a_pair_says_so(tmp_path, reward_model, pairs_file, capsys):
    """Every reply scored alike: no step trained, and the run exited 0 with an unchanged policy, unsaid."""
    reward_dir, _ = reward_model
    online_dpo.train(online_dpo.OnlineDPOConfig(**quiet(tmp_path / "run"), **cfg(
        reward_dir, pairs_file, rewards="toy_text:anything:1.0", steps=2, missing_eos_penalty=0.0)))
    assert all(r["pairs/kept_fraction"] == 0.0 for r in metrics(tmp_path / "run") if "pairs/kept_fraction" in r)
    assert "omnigym: note: none of the 2 steps had a pair to train on (each prompt's replies all scored alike)" \
        in capsys.readouterr().err
