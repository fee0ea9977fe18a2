"""Multi-turn credit (issue 26 item 5): GRPO trains a multi-turn episode's own tokens only,
and --advantage gae gives each turn its own advantage."""

import json
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

from omnigym.algos.lm import grpo  # noqa: E402
from omnigym.generators.base import Trajectories, Trajectory  # noqa: E402
from omnigym.models.tokens import completion_logprobs, make_completion_batch  # noqa: E402
from omnigym.rl.advantages import AdvantageConfig, get_advantage, turn_spans  # noqa: E402
from omnigym.rl.losses import PolicyLossConfig  # noqa: E402


def trajectory(mask, reward, group_id=0, turn_rewards=None):
    info = {"turns": len(turn_spans(torch.tensor(mask))), "cut_off": False}
    if turn_rewards is not None:
        info["turn_rewards"] = turn_rewards
    return Trajectory([1, 2], [5] * len(mask), list(mask), [0.0] * len(mask), reward, group_id, 0, {}, info)


def test_turns_are_the_runs_of_generated_tokens():
    assert turn_spans(torch.tensor([1, 1, 0, 0, 1, 1, 0, 1, 0, 0])) == [(0, 2), (4, 6), (7, 8)]
    assert turn_spans(torch.tensor([0, 0])) == []


def test_per_turn_advantages_equal_hand_computed_values():
    """Group 0: A calls a tool that fails (step reward -0.5), then answers right (1); B calls it
    and answers wrong (0); C answers at once, right (1). Group 1: two one-turn answers, 1 and 0.
    gamma 0.9, lambda 0.5. By hand: returns A (0.4, 1), B (0, 0), C (1); the group's values
    V0 = (0.4 + 0 + 1) / 3, V1 = (1 + 0) / 2 = 0.5; after the last turn 0.
    A: delta1 = 1 - 0.5 = 0.5, A1 = 0.5; delta0 = -0.5 + 0.9 * 0.5 - 0.46667 = -0.51667,
       A0 = -0.51667 + 0.45 * 0.5 = -0.29167.
    B: A1 = -0.5; delta0 = 0.45 - 0.46667 = -0.01667, A0 = -0.01667 - 0.225 = -0.24167.
    C: A0 = 1 - 0.46667 = 0.53333. Group 1: 1 - 0.5 and 0 - 0.5."""
    items = [trajectory([1, 1, 0, 0, 1, 1], 1.0, turn_rewards=[-0.5, 0.0]),
             trajectory([1, 1, 1, 0, 1], 0.0),
             trajectory([1, 1, 1], 1.0),
             trajectory([1, 1], 1.0, group_id=1),
             trajectory([1, 1, 1, 1], 0.0, group_id=1)]
    cfg = grpo.GRPOConfig(advantage="gae", gamma=0.9, lam=0.5, skip_equal_groups=False)
    advantages, informative = grpo.group_advantages(cfg, get_advantage("gae"), Trajectories(items))
    v0 = 1.4 / 3
    expected = torch.tensor([[-0.5 + 0.45 - v0 + 0.225] * 2 + [0, 0] + [0.5] * 2,
                             [0.45 - v0 - 0.225] * 3 + [0] + [-0.5] + [0],
                             [1 - v0] * 3 + [0] * 3,
                             [0.5] * 2 + [0] * 4,
                             [-0.5] * 4 + [0] * 2])
    torch.testing.assert_close(advantages, expected)
    assert informative.tolist() == [True, True, True, True, True]


def test_gae_over_one_turn_is_reward_minus_the_group_mean():
    """gamma and lambda 1: a single-turn batch gets Dr. GRPO's advantages, token for token."""
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    rewards = torch.zeros(4, 3)
    rewards[0, 1], rewards[1, 2], rewards[3, 1] = 1.0, 0.2, 0.7
    ids = torch.tensor([0, 0, 1, 1])
    gae, _ = get_advantage("gae")(rewards, mask, ids, cfg=AdvantageConfig(1.0, 1.0))
    dr, _ = get_advantage("dr_grpo")(rewards, mask, ids)
    torch.testing.assert_close(gae, dr)


def test_a_critic_s_values_are_read_at_each_turn_s_first_token():
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 9.0, 1.5, 9.0]])  # 9: not a turn's first token, never read
    advantages, returns = get_advantage("gae")(rewards, mask, values=values, cfg=AdvantageConfig(0.5, 1.0))
    # returns: turn 1 2.0, turn 0 0.5 x 2 = 1.0; advantages: return - value
    torch.testing.assert_close(returns, torch.tensor([[1.0, 0.0, 2.0, 2.0]]))
    torch.testing.assert_close(advantages, torch.tensor([[0.5, 0.0, 0.5, 0.5]]))


@pytest.fixture(scope="module")
def two_turn_batch():
    """Two episodes of the tiny model: a reply, the env's inserted tool message, a second reply."""
    from omnigym.models.lm import load_policy_and_tokenizer

    policy, tokenizer = load_policy_and_tokenizer("tiny", 0)

    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    prompt = ids("What is 123 * 456?")
    turns = [(ids('<tool name="calculator">123 * 456</tool>'), ids("tool: 56088\n"), ids("<answer>56088</answer>")),
             (ids('<tool name="calculator">123*456</tool>'), ids("tool: error\n"), ids("<answer>5</answer>"))]
    responses = [a + env + b for a, env, b in turns]
    masks = [[1] * len(a) + [0] * len(env) + [1] * len(b) for a, env, b in turns]
    batch = make_completion_batch([prompt, prompt], responses, tokenizer.pad_token_id, masks)
    mask = batch.loss_mask
    advantages = torch.tensor([[1.0], [-1.0]]) * mask
    return policy, batch, mask, advantages


def loss_with(policy, batch, advantages, garbage: float | None, monkeypatch, leaf: bool = False):
    """GRPO's loss on ``batch`` with every log-prob at the inserted tokens (the policy's, the
    old policy's, the reference's and the sampler's) replaced by ``garbage``; returns the loss,
    its stats and the policy's log-probs (a leaf tensor when ``leaf``: its gradient is read)."""
    mask = batch.loss_mask
    real = completion_logprobs(policy, batch)
    inserted = mask == 0

    def spoiled(x, shift=0.0):
        return x if garbage is None else torch.where(inserted, torch.full_like(x, garbage + shift), x)

    new = spoiled(real.detach()).requires_grad_() if leaf else spoiled(real)
    monkeypatch.setattr(grpo, "completion_logprobs", lambda model, tokens, temperature=1.0: new)
    base = real.detach()
    pb = grpo.PolicyBatch(batch, advantages, spoiled(base - 0.1, -3e3), spoiled(base + 0.2, 7e3), spoiled(base, -5e3))
    cfg = grpo.GRPOConfig(beta=0.04, loss_aggregation="seq-mean-token-mean")
    loss_cfg = PolicyLossConfig(0.2, 0.2, cfg.loss_aggregation, normalizer=cfg.max_new_tokens, behaviour_cap=2.0)
    loss, stats = grpo.grpo_loss(policy, pb, cfg, loss_cfg, step=0)
    return loss, stats, new


@pytest.mark.parametrize("garbage", [1e4, -1e4, 88.0, -1e30])
def test_inserted_tokens_log_probs_change_nothing(two_turn_batch, monkeypatch, garbage):
    """The env's tokens get huge log-probs of every kind: loss, KL, entropy, clip statistics
    and the gradient on the weights are those of the clean batch (before the fix, exp(1e4)
    times a 0 advantage made the loss NaN)."""
    policy, batch, mask, advantages = two_turn_batch
    assert [len(turn_spans(row)) for row in mask] == [2, 2]  # inserted tokens between two replies
    clean, clean_stats, _ = loss_with(policy, batch, advantages, None, monkeypatch)
    policy.zero_grad()
    clean.backward()
    clean_grad = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad()
    spoiled, spoiled_stats, _ = loss_with(policy, batch, advantages, garbage, monkeypatch)
    spoiled.backward()
    assert torch.isfinite(clean) and clean.item() != 0.0
    torch.testing.assert_close(spoiled, clean)
    for key in ("kl", "entropy", "approx_kl", "clip_fraction", "clipped_objective_fraction"):
        torch.testing.assert_close(spoiled_stats[key], clean_stats[key], msg=key)
    assert clean_stats["kl"] > 0 and clean_stats["entropy"] > 0
    for p, g in zip(policy.parameters(), clean_grad):
        torch.testing.assert_close(p.grad, g)
    policy.zero_grad()


def test_the_loss_gradient_is_zero_on_inserted_tokens(two_turn_batch, monkeypatch):
    policy, batch, mask, advantages = two_turn_batch
    loss, _, logprobs = loss_with(policy, batch, advantages, 1e4, monkeypatch, leaf=True)
    loss.backward()
    assert (logprobs.grad[mask == 0] == 0).all()
    assert (logprobs.grad[mask == 1] != 0).all()  # every generated token is trained


def test_lengths_and_entropy_count_the_model_s_tokens_only():
    items = [trajectory([1, 1, 0, 0, 0, 0, 1], 1.0), trajectory([1, 1, 1], 0.0)]
    for t in items:
        t.info["reward_parts"] = {}
    cfg = grpo.GRPOConfig(env="tools")
    m = grpo.step_metrics(cfg, Trajectories(items), torch.tensor([True, True]), {})
    assert m["completion/length"] == 3.0  # (3 + 3) / 2, not (7 + 3) / 2
    assert m["episode/turns"] == 1.5


@pytest.mark.parametrize("flags, message", [(["--gamma", "1.5"], "--gamma"), (["--lam", "-0.1"], "--lam")])
def test_bad_gamma_or_lambda_is_one_line_and_no_run_dir(tmp_path, flags, message):
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "omnigym", "train", "grpo", "--advantage", "gae", "--run-dir",
                          str(run_dir), *flags], capture_output=True, text=True, timeout=120)
    err = out.stderr.strip()
    assert out.returncode == 2 and len(err.splitlines()) == 1 and err.startswith("omnigym: error:") and message in err
    assert not run_dir.exists()


def test_samples_show_a_tool_call_and_its_result_apart():
    """samples.jsonl's rows of a multi-turn episode: the model's call, the tool's answer and the
    model's final reply, each readable on its own (the plain completion runs them together)."""
    from omnigym.evaluation.text import turn_texts
    from omnigym.generators.text_env import render
    from omnigym.models.lm import load_policy_and_tokenizer

    _, tokenizer = load_policy_and_tokenizer("tiny", 0)
    messages = [{"role": "user", "content": "What is 12 * 34?"},
                {"role": "assistant", "content": '<tool name="calculator">12 * 34</tool>'},
                {"role": "tool", "content": "408"}]
    prompt, before_answer = render(tokenizer, messages[:1]), render(tokenizer, messages)
    call = before_answer[len(prompt):][:len(tokenizer('<tool name="calculator">12 * 34</tool>')["input_ids"])]
    answer = tokenizer("<answer>408</answer>", add_special_tokens=False)["input_ids"]
    response = before_answer[len(prompt):] + answer
    mask = [1] * len(call) + [0] * (len(response) - len(call) - len(answer)) + [1] * len(answer)
    assert turn_texts(tokenizer, response, mask) == {"turns": [{"model": '<tool name="calculator">12 * 34</tool>'},
                                                               {"env": "408"}, {"model": "<answer>408</answer>"}]}
    assert turn_texts(tokenizer, answer, [1] * len(answer)) == {}


def test_the_warm_up_folds_a_turn_into_the_next_and_trains_the_same_loss_and_gradient():
    """A two-turn tool demonstration is one row, not two (the call's row is a prefix of the
    answer's), with the same token-mean loss and gradient as the two rows to float rounding."""
    import functools
    import random

    from omnigym.generators.text_tasks import task_env, text_task
    from omnigym.models.lm import load_policy_and_tokenizer
    from omnigym.models.tokens import local_batch
    from omnigym.pipelines import grpo_warmup

    cfg = grpo.GRPOConfig(run_dir="unused", env="tools", operations="*", digits=2, max_turns=3)
    task, _ = text_task(cfg)
    env, _ = task_env(cfg, task)
    policy, tokenizer = load_policy_and_tokenizer("tiny", 1)
    examples = random.Random(0).sample(task.train, 6)
    assert all("expression" in e for e in examples)  # two turns each: the call, then the answer
    loss_and_grads = {}
    for name, fold in (("per turn", lambda rows: rows), ("folded", grpo_warmup.folded)):
        rows = []
        for e in examples:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(grpo_warmup, "folded", fold)
                rows += grpo_warmup.demonstration(env, tokenizer, e)
        policy.zero_grad()
        batch, share = local_batch(grpo_warmup.make_backend(cfg, policy, lambda m: None), rows, tokenizer.pad_token_id,
                                   "cpu")
        loss, _ = grpo_warmup.warm_up_loss(policy, batch, 0)
        loss.backward()
        loss_and_grads[name] = (len(rows), loss.item(), [p.grad.clone() for p in policy.parameters()])
    (rows_apart, loss_apart, grads_apart), (rows_folded, loss_folded, grads_folded) = loss_and_grads.values()
    assert (rows_apart, rows_folded) == (12, 6)
    assert loss_folded == pytest.approx(loss_apart, rel=1e-6)
    assert max((a - b).abs().max().item() for a, b in zip(grads_apart, grads_folded)) < 1e-6


def test_a_turn_the_next_prompt_renders_differently_stays_a_row_of_its_own():
    from omnigym.pipelines.grpo_warmup import folded

    first, second = ([1, 2, 3], [0, 1, 1]), ([1, 2, 3, 4, 5], [0, 0, 0, 0, 1])
    assert folded([first, second]) == [([1, 2, 3, 4, 5], [0, 1, 1, 0, 1])]
    rewritten = ([1, 9, 3, 4, 5], [0, 0, 0, 0, 1])  # the template rewrote the earlier turn
    assert folded([first, rewritten]) == [first, rewritten]


@pytest.mark.slow
def test_grpo_learns_to_use_the_calculator_over_two_turns(tmp_path):
    """2-digit products (up to 4 digits): a ~1M-parameter model cannot multiply them itself, so
    a right answer is a calculator call, the tool's reply read, and the product copied. The
    warm-up demonstrates the two turns until greedy validation accuracy passes 0.6 (checked every
    25 steps); then GRPO, 8 prompts x 8 episodes a step, learning rate 1e-4. One problem is 0.005
    of the 200 held out; the margin asked is 0.04. Measured, seed 1:
    - on an Intel Xeon with AVX-512 (this test's setting): the warm-up stops at step 450
      (validation 0.90); held-out greedy accuracy 0.92 after it, 0.98 after 30 GRPO steps (the
      sampled reward, mean of the first and last 5 steps, 0.40 -> 0.50). With the target at 0.4 it
      stopped at step 425 (validation 0.51): 0.455 -> 0.48, inside the noise.
    - on an AMD Zen 3, target 0.4: the warm-up stopped at step 325 (validation 0.68); 0.665 -> 0.750
      after 30 steps; stopped at 350 (validation 0.81), GRPO went 0.785 -> 0.765. Where the warm-up
      stops moves with the CPU's float rounding, and the gain with it."""
    from omnigym.track.files import read_metrics

    summary = grpo.train(grpo.GRPOConfig(
        run_dir=str(tmp_path), env="tools", operations="*", digits=2, max_turns=3, max_new_tokens=40, sft_steps=600,
        sft_target_accuracy=0.6, sft_eval_every=25, sft_batch_size=32, steps=30, prompts_per_step=8, group_size=8,
        learning_rate=1e-4, eval_size=200, eval_every=1000, checkpoint_every=1000, seed=1, progress=False, plot=False,
        tensorboard=False))
    rows = [r for r in read_metrics(tmp_path) if "reward/mean" in r]
    assert sum(r["episode/turns"] for r in rows) / len(rows) > 1.7  # nearly every episode calls the calculator
    assert summary["accuracy_before"] >= 0.4  # the warm-up taught the two turns
    assert summary["accuracy_after"] >= summary["accuracy_before"] + 0.04, summary
    shown = [json.loads(line) for line in open(tmp_path / "samples.jsonl")]
    call = next(row for row in shown if row.get("turns") and row["reward"] == 1.0)["turns"]
    assert call[0]["model"].startswith('<tool name="calculator">') and call[1]["env"].isdigit()
    assert call[2]["model"] == f"<answer>{call[1]['env']}</answer>"  # the tool's result, copied
