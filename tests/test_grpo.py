"""GRPO on the tiny offline model: repeatable, resumable, and it learns from rewards alone."""

import json

import pytest

pytest.importorskip("transformers")

from omnigym.algos import grpo  # noqa: E402
from interrupts import interrupt_at_log  # noqa: E402


def small(run_dir, **extra):
    flags = dict(sft_steps=20, sft_target_accuracy=1.1, sft_eval_every=10, steps=6, prompts_per_step=2, group_size=4,
                 eval_size=20, eval_every=3, checkpoint_every=2, progress=False, plot=False, tensorboard=False)
    return grpo.GRPOConfig(run_dir=str(run_dir), **{**flags, **extra})


def metrics(run_dir):
    rows = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


def test_same_seed_same_metrics(tmp_path):
    grpo.train(small(tmp_path / "a"))
    grpo.train(small(tmp_path / "b"))
    a, warm_up = metrics(tmp_path / "a"), metrics(tmp_path / "a" / "stages" / "warmup")
    assert len(a) == 6 and all("reward/mean" in row for row in a)
    assert len(warm_up) == 20 and all("sft/loss" in row for row in warm_up)  # the warm-up stage's own log
    assert a == metrics(tmp_path / "b") and warm_up == metrics(tmp_path / "b" / "stages" / "warmup")


def test_interrupted_run_resumes_to_the_same_metrics(tmp_path, monkeypatch):
    grpo.train(small(tmp_path / "whole"))
    # stopped at GRPO step 3, after the checkpoint at step 2
    interrupt_at_log(monkeypatch, lambda: grpo.train(small(tmp_path / "cut")), n=3)
    stage = tmp_path / "cut" / "stages" / "warmup" / "model"
    made = stage.stat().st_mtime_ns
    grpo.train(small(tmp_path / "cut", resume=str(tmp_path / "cut")))
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "whole")
    assert stage.stat().st_mtime_ns == made  # the finished warm-up stage was reused, not trained again


def test_a_resume_with_another_reward_is_refused(tmp_path, capsys):
    """--rewards given to a run made without it swapped what the run optimizes and what its held-out accuracy counts
    as correct ("0.000 -> 1.000" for a length reward), in silence."""
    from omnigym.cli import main

    run = tmp_path / "run"
    grpo.train(small(run, steps=2, sft_steps=0, eval_every=2))
    capsys.readouterr()
    assert main(["train", "grpo", "--resume", str(run), "--steps", "4", "--rewards", "length:1.0"]) == 2
    assert capsys.readouterr().err.strip() == (f"omnigym: error: {run} was made without --rewards, not --rewards "
                                               "length:1.0; its checkpoint only fits its own setting (leave the flag "
                                               "out to keep it)")


@pytest.mark.parametrize("variant", [dict(advantage="rloo", beta=0.0, loss_aggregation="token-mean", clip_high=0.28,
                                          engine="hf"),
                                     dict(advantage="dr_grpo", loss_aggregation="seq-mean-token-sum-norm",
                                          ppo_epochs=2, kl_estimator="k1", lora_r=4),
                                     dict(advantage="gae", behaviour_cap=2.0),
                                     dict(precision="bf16", ppo_epochs=2, lora_r=4, engine="hf"),
                                     dict(precision="bf16", behaviour_cap=2.0)])
def test_variants_update_the_policy(tmp_path, monkeypatch, variant):
    """Each variant's policy steps change the trained weights (LoRA: the adapters only), and
    the metrics that measure the update move: the KL to the reference grows from 0, and with
    two epochs the second one sees a ratio away from 1."""
    import torch

    before, after, original = {}, {}, grpo.policy_steps

    def watched(cfg, trainer, *args, **kwargs):
        trained = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        before.setdefault("params", trained)
        out = original(cfg, trainer, *args, **kwargs)
        after["params"] = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        return out

    monkeypatch.setattr(grpo, "policy_steps", watched)
    # A reward an untrained model already earns sometimes (letters in its reply), so every
    # group carries signal without a warm-up.
    task = tmp_path / "letters.jsonl"
    task.write_text("\n".join(json.dumps({"question": f"Say {i}.", "answer": "-", "keywords": ["a", "e", "o"]})
                              for i in range(40)))
    grpo.train(small(tmp_path / "run", task=str(task), rewards="keyword:1.0", sft_steps=0, eval_size=4, **variant))
    tmp_path = tmp_path / "run"
    rows = [r for r in metrics(tmp_path) if "reward/mean" in r]
    updated = [r for r in rows if "losses/policy_loss" in r]
    assert len(rows) == 6 and len(updated) >= 2
    assert before["params"].keys() == after["params"].keys()
    if variant.get("lora_r"):
        assert all("lora_" in name for name in before["params"])
    if variant.get("precision") == "bf16":  # products in bf16; the weights trained stay float32
        assert all(p.dtype == torch.float32 for p in after["params"].values())
    changed = [n for n in before["params"] if not torch.equal(before["params"][n], after["params"][n])]
    assert len(changed) >= len(before["params"]) // 2, changed
    if variant.get("beta", 0.04) > 0:
        kls = [r["kl/mean"] for r in updated]  # logged from the last epoch of each step
        if variant.get("ppo_epochs", 1) == 1:
            assert kls[0] == pytest.approx(0.0, abs=1e-6)  # the first step starts at the reference
        assert max(kls[1:]) > max(kls[0], 1e-6)
    else:
        assert all("kl/mean" not in r for r in rows)
    if variant.get("ppo_epochs", 1) > 1:
        assert max(r["losses/approx_kl"] for r in updated) > 0


def test_gae_advantage_is_accepted_from_the_command_line(tmp_path):
    """`--advantage gae` used to end in a TypeError traceback (two calling contracts in one registry)."""
    from omnigym.cli import main

    args = ["train", "grpo", "--advantage", "gae", "--run-dir", str(tmp_path / "run"), "--sft-steps", "10",
            "--sft-target-accuracy", "1.1", "--steps", "2", "--prompts-per-step", "2", "--group-size", "2",
            "--eval-size", "4", "--no-progress", "--no-plot", "--no-tensorboard"]
    assert main(args) == 0
    assert sum("reward/mean" in r for r in metrics(tmp_path / "run")) == 2


def test_bad_reward_spec_is_a_clear_error(tmp_path):
    from omnigym.errors import OmnigymError

    with pytest.raises(OmnigymError, match="--rewards must look like"):
        grpo.train(small(tmp_path, rewards="math=1"))


def test_gsm8k_task_reads_the_final_answer(tmp_path):
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"q{i}", "answer": f"work <<1+1=2>>\n#### {i}"})
                              for i in range(30)))
    from omnigym.envs.task_spec import load_task

    task = load_task(f"gsm8k:{data}", seed=1, eval_size=10)
    train_rows, heldout = task.train, task.heldout
    assert len(train_rows) == 20 and len(heldout) == 10
    assert all(r["answer"] == r["question"][1:] for r in train_rows + heldout)


def test_reinforce_on_text_learns_a_keyword(tmp_path, capsys):
    from omnigym.algos import text_reinforce

    text_reinforce.train(text_reinforce.TextReinforceConfig(run_dir=str(tmp_path), keywords="z", steps=30,
                                                            progress=False, plot=False, tensorboard=False))
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    rewards = [row["reward/mean"] for row in rows]
    assert rewards[0] < 0.4  # an untrained model rarely writes a "z" in 16 characters
    assert sum(rewards[-5:]) / 5 > 0.9
    # the reward-hacking monitor watched every step and found nothing (test_hacking_trainers.py plants a hack)
    assert all("hacking/echo_rate" in row for row in rows) and "reward hacking?" not in capsys.readouterr().err


@pytest.mark.slow
def test_demo_grpo_raises_heldout_accuracy(tmp_path):
    """The offline demo's settings, seed 1, with 50 GRPO steps instead of 150 (the whole demo is
    in docs/benchmarks.md). Measured with `omnigym train grpo --steps 50 --seed 1` in a fresh run
    directory, one thread: held-out accuracy 0.240 -> 0.404 at 8f17a71 and again at 26f03ff
    (the kv sampler's shared prompts); asked: +0.10. It ran 100 steps (0.240 -> 0.466 in an
    earlier measurement) at 6.8 minutes, the suite's longest test, for a claim that 50 steps
    already show with 6 points to spare. Those figures are the AMD EPYC's; on the Intel Xeon
    measured 2026-11-29 the CLI run gives 0.470 -> 0.680 at step 50."""
    summary = grpo.train(grpo.GRPOConfig(run_dir=str(tmp_path), steps=50, progress=False, plot=False,
                                         tensorboard=False))
    assert 0.15 <= summary["accuracy_before"] <= 0.5
    assert summary["accuracy_after"] - summary["accuracy_before"] >= 0.10


def test_too_few_examples_is_a_clear_error_before_the_run_dir(tmp_path):
    from omnigym.errors import OmnigymError

    task = tmp_path / "three.jsonl"
    task.write_text("\n".join(json.dumps({"question": f"q{i}", "answer": "1"}) for i in range(3)))
    with pytest.raises(OmnigymError, match="leaves 1 training examples after the 2 held out"):
        grpo.train(small(tmp_path / "run", task=str(task), eval_size=2))
    assert not (tmp_path / "run").exists()


def test_grpo_trains_through_the_tool_env(tmp_path, monkeypatch):
    """`--env tools`: the same command plays multi-turn episodes (calculator call, the env's
    reply, the answer) and trains on the model's own tokens; a short warm-up demonstrates
    the calculator call, so many episodes take two turns (measured: 1.44 and 1.58 turns per
    episode on average, with and without packed replies)."""
    import torch

    seen = {}
    original = grpo.policy_steps

    def watched(cfg, trainer, reference, trajectories, *args, **kwargs):
        seen.setdefault("before", {n: p.detach().clone() for n, p in trainer.model.named_parameters()})
        seen.setdefault("episodes", []).extend(trajectories.items)
        out = original(cfg, trainer, reference, trajectories, *args, **kwargs)
        seen["after"] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        return out

    monkeypatch.setattr(grpo, "policy_steps", watched)
    grpo.train(small(tmp_path, env="tools", max_turns=3, sft_steps=120, sft_batch_size=16, sft_eval_every=1000,
                     max_new_tokens=40, steps=4, prompts_per_step=4, eval_size=8))
    rows = [r for r in metrics(tmp_path) if "reward/mean" in r]
    assert len(rows) == 4 and sum(r["episode/turns"] for r in rows) / 4 > 1.25
    multi_turn = [t for t in seen["episodes"] if t.info["turns"] == 2]
    assert multi_turn, "no trained episode called the tool"
    for t in multi_turn:  # the env's reply sits between the two turns, masked out of the loss
        first_zero = t.loss_mask.index(0)
        assert 0 < first_zero and 1 in t.loss_mask[first_zero:] and 0.0 == t.logprobs[first_zero]
    assert any(not torch.equal(seen["before"][n], seen["after"][n]) for n in seen["before"])


@pytest.mark.parametrize("flags, message", [(["--env", "tool"], "--env must be one of single-turn, tools, python, search, guess"),
                                            (["--max-turns", "0"], "--max-turns must be positive, got 0"),
                                            (["--behaviour-cap", "-1"], "--behaviour-cap must be positive"),
                                            (["--advantage", "gea"], "unknown advantage estimator 'gea'"),
                                            (["--micro-batch-size", "-1"], "--micro-batch-size must be 0 or more"),
                                            (["--micro-batch-size", "4", "--training-backend", "deepspeed"],
                                             "--micro-batch-size with --training-backend deepspeed")])
def test_bad_new_flags_get_one_line_and_no_run_dir(tmp_path, capsys, flags, message):
    from omnigym.cli import main

    assert main(["train", "grpo", "--run-dir", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("omnigym: error:") and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_an_interrupted_warm_up_leaves_no_run_behind(tmp_path, monkeypatch):
    """Ctrl-C (or an error) in the warm-up stage, before GRPO's first checkpoint: the stage and
    the run directory it made are gone, so the same command starts afresh."""
    from omnigym.pipelines import grpo_warmup

    original, calls = grpo_warmup.warm_up_loss, {"n": 0}

    def interrupted(model, batch, step):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(model, batch, step)

    monkeypatch.setattr(grpo_warmup, "warm_up_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        grpo.train(small(tmp_path / "run"))
    assert calls["n"] == 3 and not (tmp_path / "run").exists()
    monkeypatch.undo()
    grpo.train(small(tmp_path / "run", steps=1))
    assert len(metrics(tmp_path / "run" / "stages" / "warmup")) == 20


def test_a_warm_up_that_reaches_its_target_early_says_so_in_a_line_and_its_metrics(tmp_path, capsys):
    grpo.train(small(tmp_path / "run", sft_target_accuracy=0.0, steps=1))  # any accuracy reaches 0: stop at step 10
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warm-up: stopped")]
    warm_up = metrics(tmp_path / "run" / "stages" / "warmup")
    assert len(warm_up) == 10 and warm_up[-1]["sft/target_reached"] == 1
    assert said == [f"warm-up: stopped at step 10 of --sft-steps 20: validation accuracy "
                    f"{warm_up[-1]['sft/val_accuracy']:.3f} reached --sft-target-accuracy 0.0 (a higher target, or "
                    "one above 1, runs more steps)"]


@pytest.mark.parametrize("aggregation, epochs", [("seq-mean-token-mean", 1), ("token-mean", 2),
                                                 ("seq-mean-token-sum-norm", 1)])
def test_micro_batches_make_the_same_step_as_the_whole_batch(tmp_path, monkeypatch, aggregation, epochs):
    """--micro-batch-size: the batch in passes of 3 rows (uneven parts; old and reference log-probs
    taken per part), the gradients accumulated, then one optimizer step: the gradient it steps
    with and the logged loss are the whole batch's, up to float rounding, and the passes are the
    ones asked for. (The weights after AdamW's first step are not compared: it divides each
    gradient by its own size, so a rounding-level difference in a near-zero one moves its weight
    by up to the learning rate.)"""
    import torch

    from omnigym.backends.local import LocalBackend
    from omnigym.rewards.base import REWARDS, per_sample

    # a graded reward (a reply's share of digits), so every group carries a signal to train on
    monkeypatch.setitem(REWARDS, "digit_share", per_sample(lambda reply, example: sum(c.isdigit() for c in reply) /
                                                           max(len(reply), 1)))
    rows_per_pass, gradients = [], []
    original_batch, original_step = grpo.policy_batch, LocalBackend.optim_step
    monkeypatch.setattr(grpo, "policy_batch", lambda *a, **k: rows_per_pass.append(len(a[3])) or original_batch(*a, **k))

    def recorded_step(self):
        gradients.append({n: p.grad.clone() for n, p in self.model.named_parameters() if p.grad is not None})
        return original_step(self)

    monkeypatch.setattr(LocalBackend, "optim_step", recorded_step)
    logged = {}
    for micro in (0, 3):
        run = tmp_path / f"micro{micro}"
        gradients_before = len(gradients)
        grpo.train(small(run, steps=1, prompts_per_step=4, eval_size=4, loss_aggregation=aggregation,
                         rewards="digit_share:1.0", ppo_epochs=epochs, micro_batch_size=micro))
        logged[micro] = [r for r in metrics(run) if "reward/mean" in r][0]
        gradients[gradients_before:] = [gradients[-epochs]]  # the GRPO step's first (the warm-up's came before)
    whole, parts = rows_per_pass[0], rows_per_pass[1:]
    assert whole > 3 and len(parts) == -(-whole // 3) and sum(parts) == whole and max(parts) <= 3
    assert logged[0]["reward/mean"] == logged[3]["reward/mean"]  # the same samples were trained on
    assert abs(logged[0]["losses/policy_loss"] - logged[3]["losses/policy_loss"]) < 1e-5
    one_pass, accumulated = gradients
    assert max(g.abs().max().item() for g in one_pass.values()) > 1e-4  # a real step, not two zero gradients
    for name, grad in one_pass.items():
        assert torch.allclose(grad, accumulated[name], rtol=1e-4, atol=1e-7), name
