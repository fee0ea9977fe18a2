"""train rm, train dpo, train rlhf: they train, same seed gives the same metrics, an interrupted
run resumes to the same metrics, bad input is one line with no run left behind; and the
offline demo (slow): the whole pipeline raises the hidden gold reward."""

import json
import os
import random
import shutil

import pytest
import torch

from omnigym.algos import dpo, rlhf, rm
from omnigym.cli import main
from omnigym.tasks.gold_world import label_pairs, prompts, reply


def quiet(run_dir, **kw):
    return {"run_dir": str(run_dir) if run_dir else None, "progress": False, "plot": False, "tensorboard": False, **kw}


def metrics(run_dir):
    return [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]


def strip(rows):
    """The metrics without wall-clock timings (the only values two identical runs may differ in)."""
    return [{k: v for k, v in r.items() if not k.startswith(("perf", "time"))} for r in rows]


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory):
    """400 gold-labelled pairs of random-word replies (no SFT model needed)."""
    rng = random.Random(0)
    rows = prompts(400, 0)
    path = tmp_path_factory.mktemp("data") / "pairs.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in label_pairs(rows, [(reply(rng), reply(rng)) for _ in rows])))
    return path


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory, pairs_file):
    """A reward model of 40 steps on those pairs, and rm.train's summary of it. This module and
    test_online_dpo.py trained the same one each, on each pytest-xdist worker that ran their
    tests; now the first trains it for the session and the others wait for it (a file lock)."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root  # the workers' common folder
    run_dir, kept = root / "reward-model" / "run", root / "reward-model" / "summary.json"
    with FileLock(str(root / "reward-model.lock")):
        if not kept.is_file():  # written after the run ends whole
            summary = rm.train(rm.RMConfig(**quiet(run_dir), data=str(pairs_file), eval_size=50, steps=40,
                                           batch_size=16, eval_every=20, learning_rate=1e-3,
                                           overwrite=run_dir.exists()))
            kept.write_text(json.dumps(summary))
    return run_dir, json.loads(kept.read_text())


def test_reward_model_learns_and_is_saved_as_a_reward(reward_model):
    run_dir, summary = reward_model
    rows = metrics(run_dir)
    assert rows[-1]["train/loss"] < rows[1]["train/loss"] or summary["accuracy"] > summary["initial_accuracy"]
    assert summary["accuracy"] > 0.6  # random guessing is 0.5
    info = json.loads((run_dir / "model" / "omnigym_reward.json").read_text())
    assert info["conversational"] is True and info["max_length"] == 256

    from omnigym.rewards import parse_weights

    reward = parse_weights(f"rm:{run_dir}:1.0")
    example = {"prompt": [{"role": "user", "content": "Say a few words about rain 1."}]}
    scores = reward(["aeiou oa ei", "xkcd trm pl", ""], [example] * 3)  # an empty reply is scored too
    assert scores.shape == (3,) and torch.isfinite(scores).all() and scores[0] > scores[1]


def test_reward_model_same_seed_and_resume(tmp_path, pairs_file, monkeypatch):
    cfg = dict(data=str(pairs_file), eval_size=50, steps=6, batch_size=8, eval_every=3, checkpoint_every=3)
    rm.train(rm.RMConfig(**quiet(tmp_path / "a"), **cfg))
    rm.train(rm.RMConfig(**quiet(tmp_path / "b"), **cfg))
    assert strip(metrics(tmp_path / "a")) == strip(metrics(tmp_path / "b"))
    interrupt_at(monkeypatch, rm, 5)
    with pytest.raises(KeyboardInterrupt):
        rm.train(rm.RMConfig(**quiet(tmp_path / "c"), **cfg))
    monkeypatch.undo()
    rm.train(rm.RMConfig(**quiet(None, resume=str(tmp_path / "c")), **cfg))
    assert strip(metrics(tmp_path / "c")) == strip(metrics(tmp_path / "a"))


def interrupt_at(monkeypatch, module, calls: int):
    """Ctrl-C inside the ``calls``-th optimizer step of the module's trainer."""
    from omnigym.backends.local import LocalBackend

    original, count = LocalBackend.optim_step, {"n": 0}

    def step(self):
        count["n"] += 1
        if count["n"] == calls:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(LocalBackend, "optim_step", step)


@pytest.mark.parametrize("flags", [dict(loss="sigmoid"), dict(loss="sigmoid", label_smoothing=0.1, precompute_ref=True),
                                   dict(loss="ipo"), dict(loss="hinge"), dict(loss="simpo", beta=2.0),
                                   dict(loss="sigmoid", lora_r=4)])
def test_dpo_variants_train(tmp_path, pairs_file, flags):
    """Four steps of each loss move the policy towards the gold-labelled chosen replies: on the
    held-out pairs the implicit reward margin rises and most pairs are ranked right (measured
    0.65-0.725 of 40; ranking at random gets half, a gradient of the wrong sign most wrong)."""
    cfg = dpo.DPOConfig(**quiet(tmp_path / "run"), data=str(pairs_file), eval_size=40, steps=4, batch_size=8,
                        eval_every=4, **flags)
    summary = dpo.train(cfg)
    rows = metrics(tmp_path / "run")
    before, after = rows[0], rows[-1]
    assert before["eval/margin"] == pytest.approx(0.0, abs=1e-6) or flags["loss"] == "simpo"  # policy = reference
    assert after["eval/margin"] > before["eval/margin"]
    assert after["eval/accuracy"] >= 0.6
    assert after["rewards/margin"] == pytest.approx(after["rewards/chosen"] - after["rewards/rejected"], abs=1e-6)
    assert 0 < largest_weight_change(cfg, tmp_path / "run" / "model") and summary["gold_after"] is None


def largest_weight_change(cfg, exported) -> float:
    """The largest change of any weight from the run's starting model to its exported one
    (LoRA merged in)."""
    from transformers import AutoModelForCausalLM

    from omnigym.models.lm import load_policy_and_tokenizer

    start = load_policy_and_tokenizer(cfg.model, cfg.seed)[0].state_dict()
    end = AutoModelForCausalLM.from_pretrained(exported).state_dict()
    assert start.keys() == end.keys()
    return max((start[name] - end[name]).abs().max().item() for name in start)


def test_dpo_with_lora_uses_the_base_as_reference():
    from omnigym.models.lm import LoraSettings, load_policy_and_tokenizer
    from omnigym.models.reference import FrozenReference

    policy, _ = load_policy_and_tokenizer("tiny", lora=LoraSettings(r=4))
    reference = FrozenReference(policy)
    assert reference.model is policy and reference.state_dict() == {}  # no second copy


def test_dpo_same_seed_and_resume_with_gold_samples(tmp_path, pairs_file, monkeypatch):
    cfg = dict(data=str(pairs_file), eval_size=40, steps=4, batch_size=8, eval_every=2, checkpoint_every=2,
               gold_reward="gold_vowels:1.0", eval_prompts=8, max_new_tokens=8)
    dpo.train(dpo.DPOConfig(**quiet(tmp_path / "a"), **cfg))
    dpo.train(dpo.DPOConfig(**quiet(tmp_path / "b"), **cfg))
    assert strip(metrics(tmp_path / "a")) == strip(metrics(tmp_path / "b"))
    assert "eval/gold_reward" in metrics(tmp_path / "a")[-1]
    samples = [json.loads(line) for line in open(tmp_path / "a" / "samples.jsonl")]
    assert {"global_step", "prompt", "completion", "gold_reward"} <= set(samples[0])
    interrupt_at(monkeypatch, dpo, 3)
    with pytest.raises(KeyboardInterrupt):
        dpo.train(dpo.DPOConfig(**quiet(tmp_path / "c"), **cfg))
    monkeypatch.undo()
    dpo.train(dpo.DPOConfig(**quiet(None, resume=str(tmp_path / "c")), **cfg))
    assert strip(metrics(tmp_path / "c")) == strip(metrics(tmp_path / "a"))
    assert open(tmp_path / "c" / "samples.jsonl").read() == open(tmp_path / "a" / "samples.jsonl").read()


def rlhf_cfg(reward_dir, pairs_file, **kw):
    return {**dict(reward_model=str(reward_dir), data=str(pairs_file), steps=3, prompts_per_step=8, minibatches=2,
                   ppo_epochs=2, eval_prompts=8, eval_every=2, checkpoint_every=2, max_new_tokens=12), **kw}


def test_rlhf_trains_policy_and_value_and_logs_the_phases(tmp_path, reward_model, pairs_file):
    reward_dir, _ = reward_model
    summary = rlhf.train(rlhf.RLHFConfig(**quiet(tmp_path / "run"), **rlhf_cfg(reward_dir, pairs_file,
                                                                             target_kl=0.5)))
    rows = metrics(tmp_path / "run")
    last = rows[-1]
    for phase in ("generate", "reference", "reward", "value", "update"):
        assert last[f"time/{phase}"] > 0
    # the adaptive controller (Ziegler et al.): the next step's beta is this one's times
    # 1 + clip(KL per reply / target - 1, -0.2, 0.2) x 8 replies / 10,000 (--kl-horizon); the KL
    # stayed under the 0.5 target (-0.11 to 0.33 here), so beta fell at every step
    steps = [r for r in rows if "kl/beta" in r]
    assert len(steps) == 3 and steps[0]["kl/beta"] == 0.05
    for before, after in zip(steps, steps[1:]):
        error = max(-0.2, min(0.2, before["kl/mean"] / 0.5 - 1))
        assert after["kl/beta"] == pytest.approx(before["kl/beta"] * (1 + error * 8 / 10_000), rel=1e-9)
        assert before["kl/mean"] < 0.5 and after["kl/beta"] < before["kl/beta"]
    assert last["losses/value_loss"] > 0 and "eval/rm_score" in rows[0] and "eval/kl" in last
    assert rows[0]["eval/kl"] == 0.0 and summary["kl"] >= 0
    samples = [json.loads(line) for line in open(tmp_path / "run" / "samples.jsonl")]
    assert {"prompt", "completion", "rm_score"} <= set(samples[0])


def test_rlhf_same_seed_and_resume(tmp_path, reward_model, pairs_file, monkeypatch):
    reward_dir, _ = reward_model
    cfg = rlhf_cfg(reward_dir, pairs_file, value_init="policy", steps=4)
    rlhf.train(rlhf.RLHFConfig(**quiet(tmp_path / "a"), **cfg))
    rlhf.train(rlhf.RLHFConfig(**quiet(tmp_path / "b"), **cfg))
    assert strip(metrics(tmp_path / "a")) == strip(metrics(tmp_path / "b"))
    interrupt_at(monkeypatch, rlhf, 2 * 2 * 2 * 3 + 1)  # inside step 4 (policy + value steps, 2 epochs x 2 minibatches)
    with pytest.raises(KeyboardInterrupt):
        rlhf.train(rlhf.RLHFConfig(**quiet(tmp_path / "c"), **cfg))
    monkeypatch.undo()
    rlhf.train(rlhf.RLHFConfig(**quiet(None, resume=str(tmp_path / "c")), **cfg))
    assert strip(metrics(tmp_path / "c")) == strip(metrics(tmp_path / "a"))


def test_grpo_scores_with_a_reward_model(tmp_path, reward_model, monkeypatch):
    from omnigym.algos import grpo

    reward_dir, _ = reward_model
    batches = record_reward_model_scores(monkeypatch)
    grpo.train(grpo.GRPOConfig(**quiet(tmp_path / "run"), rewards=f"rm:{reward_dir}:1.0", sft_steps=0, steps=2,
                               prompts_per_step=4, group_size=4, eval_size=8, eval_every=100, max_new_tokens=8,
                               skip_equal_groups=False))
    rows = [r for r in metrics(tmp_path / "run") if "reward/mean" in r]
    # each step's logged rewards are the reward model's scores of that step's 16 replies (the
    # calls on 8 replies score the held-out set, before and after)
    steps = [batch for batch in batches if len(batch[0]) == 4 * 4]
    assert len(steps) == len(rows) == 2
    for row, (completions, examples, scores) in zip(rows, steps):
        assert row["reward/mean"] == pytest.approx(scores.mean().item(), abs=1e-5)
        assert row["reward/std"] == pytest.approx(scores.std().item(), abs=1e-5) and row["reward/std"] > 0
        assert torch.allclose(fresh_scores(reward_dir, completions, examples), scores, atol=1e-5)


def record_reward_model_scores(monkeypatch) -> list:
    """(completions, examples, scores) of every call of a reward model in this process."""
    from omnigym.rewards.reward_model import RewardModelScorer

    calls, score = [], RewardModelScorer.__call__

    def recorded(self, completions, examples):
        scores = score(self, completions, examples)
        calls.append((list(completions), list(examples), scores))
        return scores

    monkeypatch.setattr(RewardModelScorer, "__call__", recorded)
    return calls


def fresh_scores(reward_dir, completions, examples) -> torch.Tensor:
    """The reward model's scores, from a reward loaded afresh from its folder."""
    from omnigym.rewards import parse_weights

    return parse_weights(f"rm:{reward_dir}:1.0")(completions, examples)


@pytest.mark.parametrize("argv, message", [
    (["train", "rlhf", "--reward-model", "{tmp}"], "is not a reward model"),
    (["train", "rlhf", "--model", "{tmp}"], "give --reward-model RUN_DIR"),
    (["train", "grpo", "--rewards", "rm:{tmp}:1.0"], "is not a reward model"),
    (["train", "rm", "--data", "{tmp}/none.jsonl"], "no such file"),
    (["train", "dpo", "--loss", "kto"], "unknown --loss 'kto'"),
    (["train", "dpo", "--data", "{pairs}", "--eval-size", "5000"], "holds out that many or more"),
    (["train", "rlhf", "--value-init", "random"], "--value-init must be reward or policy"),
    (["train", "rlhf", "--minibatches", "100"], "is more than the 64 replies"),
    # the demo's data with a model of one's own: a misspelt folder is refused before any demo stage
    (["train", "dpo", "--model", "{tmp}/mdl_typo"], "no such folder"),
    (["train", "rm", "--model", "{tmp}"], "has no config.json"),
])
def test_bad_input_is_one_line_and_no_run_dir(tmp_path, capsys, pairs_file, argv, message):
    run_dir = tmp_path / "run"
    argv = [a.format(tmp=tmp_path, pairs=pairs_file) for a in argv] + ["--run-dir", str(run_dir)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not run_dir.exists()


@pytest.mark.slow
def test_offline_demo_pipeline_raises_the_gold_reward(tmp_path, rlhf_demo_run, capsys):
    """Seed 1, the defaults of `omnigym train rlhf` (SFT -> RM -> 20 PPO steps), then DPO on the
    same pairs from the same SFT model. Measured: RM held-out accuracy 0.930; PPO gold 0.197 ->
    0.688 at KL 8.31 nats; DPO gold 0.198 -> 0.719 at KL 17.66, preference accuracy 0.795
    (docs/rlhf.md). The hacking monitor says nothing of the PPO run (test_hacking.py: it does
    when the reward model pays against the gold).
    The demo's stages are the session's (conftest.py), reused with --overwrite as a second start
    of the demo reuses its own: the same figures as a run that makes them."""
    shutil.copytree(rlhf_demo_run, tmp_path / "ppo")
    summary = rlhf.train(rlhf.RLHFConfig(**quiet(tmp_path / "ppo"), overwrite=True))
    stages = tmp_path / "ppo" / "stages"
    rm_summary = json.loads((stages / "rm" / "model" / "omnigym_reward.json").read_text())
    assert rm_summary["heldout_accuracy"] >= 0.8
    assert summary["gold_before"] < 0.25 and summary["gold_after"] >= summary["gold_before"] + 0.2
    assert 0 < summary["kl"] < 30
    assert "reward hacking?" not in capsys.readouterr().err
    result = dpo.train(dpo.DPOConfig(**quiet(tmp_path / "dpo"), data=str(stages / "pairs.jsonl"),
                                     model=str(stages / "sft"), gold_reward="gold_vowels:1.0"))
    assert result["gold_after"] >= result["gold_before"] + 0.15 and result["accuracy_after"] >= 0.7


def test_scores_are_read_at_the_last_real_token_when_pad_is_eos(tmp_path):
    """A tokenizer without a pad token pads with EOS; a reply ending in EOS is still scored at
    its own last token: the same score alone as in a padded batch."""
    from omnigym.models.lm import build_tiny_model, load_tokenizer
    from omnigym.models.scalar_head import load_scalar_model, pair_scores

    folder = build_tiny_model(tmp_path / "m")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("pad_token", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = load_tokenizer(str(folder))
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    model = load_scalar_model(str(folder), tokenizer.pad_token_id)
    eos = tokenizer.eos_token_id
    prompts, replies = [[10, 11, 12], [10, 11, 12], [13, 14]], [[20, eos], [21, 22, 23, 24, eos], [25, eos]]
    together = pair_scores(model, prompts, replies, tokenizer.pad_token_id, "cpu")
    alone = torch.cat([pair_scores(model, [p], [r], tokenizer.pad_token_id, "cpu") for p, r in zip(prompts, replies)])
    assert torch.allclose(together, alone, atol=1e-5)


def test_a_set_of_only_unusable_pairs_is_one_line(tmp_path, capsys):
    path = tmp_path / "same.jsonl"
    path.write_text("".join(json.dumps({"prompt": "q", "chosen": f"a{i}", "rejected": f"a{i}"}) + "\n" for i in range(30)))
    assert main(["train", "dpo", "--data", str(path), "--eval-size", "5", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "chosen and rejected are the same reply" in err[0], err
    assert not (tmp_path / "run").exists()


def test_text_reinforce_scores_with_a_reward_model_and_writes_samples(tmp_path, reward_model):
    from omnigym.algos import text_reinforce

    reward_dir, _ = reward_model
    text_reinforce.train(text_reinforce.TextReinforceConfig(**quiet(tmp_path / "run"), rewards=f"rm:{reward_dir}:1.0",
                                                            steps=2, batch_size=4))
    rows = metrics(tmp_path / "run")
    assert len(rows) == 2
    assert_samples_carry_the_reward_models_scores(tmp_path / "run", reward_dir)


def assert_samples_carry_the_reward_models_scores(run_dir, reward_dir):
    """The rewards logged with the replies in samples.jsonl are the reward model's scores of
    those replies (to the 4 decimals written)."""
    samples = [json.loads(line) for line in open(run_dir / "samples.jsonl")]
    assert {"prompt", "completion", "reward"} <= set(samples[0]) and samples[0]["prompt"] == "Say something."
    scores = fresh_scores(reward_dir, [s["completion"] for s in samples], [{"question": s["prompt"]} for s in samples])
    assert [s["reward"] for s in samples] == pytest.approx(scores.tolist(), abs=1e-4)


ASYNC = dict(runtime="ray", max_staleness=1, num_generators=2)


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module's runs on Ray generators: a run joins it instead of starting
    and stopping one of its own (several seconds each; test_ray_runtime.py does the same). The
    runs are the same: each starts its own actors and ends them."""
    ray = pytest.importorskip("ray", reason="ray is not installed (the [ray] extra; in [dev])")
    from omnigym.runtime.ray_actors import THREAD_ENV

    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": THREAD_ENV})
    yield
    ray.shutdown()


def test_rlhf_on_ray_generators_is_bounded_repeatable_and_resumes(tmp_path, reward_model, pairs_file, monkeypatch,
                                                                  local_ray):
    """PPO-RLHF on the rollouts seam: replies from two generator actors one version behind,
    pi_old recomputed by the trainer, the sampler's log-probs in the capped weight. Same seed,
    same metrics: the interrupted run is a second run of the first's seed, and resumed, it
    ends with the first's metrics row for row."""
    pytest.importorskip("ray", reason="ray is not installed (the [ray] extra; in [dev])")
    reward_dir, _ = reward_model
    cfg = rlhf_cfg(reward_dir, pairs_file, value_init="policy", steps=4, **ASYNC)
    rlhf.train(rlhf.RLHFConfig(**quiet(tmp_path / "a"), **cfg))
    rows = strip_async(metrics(tmp_path / "a"))
    steps = [r for r in rows if "losses/policy_loss" in r]
    assert len(steps) == 4 and all(r["async/staleness_max"] <= 1 for r in steps)
    assert steps[-1]["async/staleness_mean"] == 1.0 and steps[-1]["losses/approx_kl"] > 0
    interrupt_at(monkeypatch, rlhf, 2 * 2 * 2 * 3 + 1)  # inside step 4, after the checkpoint at step 2
    with pytest.raises(KeyboardInterrupt):
        rlhf.train(rlhf.RLHFConfig(**quiet(tmp_path / "c"), **cfg))
    monkeypatch.undo()
    rlhf.train(rlhf.RLHFConfig(**quiet(None, resume=str(tmp_path / "c")), **cfg))
    assert strip_async(metrics(tmp_path / "c")) == rows


def test_text_reinforce_on_ray_generators_splits_the_batch_and_is_bounded(tmp_path, reward_model, local_ray):
    pytest.importorskip("ray", reason="ray is not installed (the [ray] extra; in [dev])")
    from omnigym.algos import text_reinforce

    reward_dir, _ = reward_model
    cfg = dict(rewards=f"rm:{reward_dir}:1.0", steps=3, batch_size=4, **ASYNC)
    text_reinforce.train(text_reinforce.TextReinforceConfig(**quiet(tmp_path / "a"), **cfg))
    text_reinforce.train(text_reinforce.TextReinforceConfig(**quiet(tmp_path / "b"), **cfg))
    rows = strip_async(metrics(tmp_path / "a"))
    assert rows == strip_async(metrics(tmp_path / "b"))
    assert len(rows) == 3 and all(r["async/staleness_max"] <= 1 for r in rows)
    assert rows[-1]["async/staleness_mean"] == 1.0
    assert_samples_carry_the_reward_models_scores(tmp_path / "a", reward_dir)


@pytest.mark.parametrize("argv, message", [
    (["text_reinforce", "--runtime", "ray", "--num-generators", "3", "--batch-size", "8"],
     "--batch-size 8 does not split evenly between --num-generators 3"),
    (["rlhf", "--runtime", "ray", "--num-generators", "65"], "--num-generators 65 is more than the 64 prompts"),
    (["rlhf", "--behaviour-cap", "-1"], "--behaviour-cap must be positive"),
    (["text_reinforce", "--num-generators", "2"], "--num-generators: read by --runtime ray only")])
def test_bad_runtime_flags_of_rlhf_and_text_reinforce_are_one_line(tmp_path, capsys, argv, message):
    assert main(["train", *argv, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "run").exists()


def strip_async(rows):
    """``strip`` and the async metrics that measure wall-clock time."""
    return [{k: v for k, v in r.items() if not k.startswith(("async/generator_idle", "async/trainer_idle"))}
            for r in strip(rows)]
