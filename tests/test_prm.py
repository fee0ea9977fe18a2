"""Process rewards: the chain task's step checker, train prm, the prm: reward, GRPO's step
rewards (the seam: a step's reward on the token that ends it) and --advantage process."""

import json
import random

import pytest
import torch

from omnigym.algos import grpo, prm
from omnigym.cli import main
from omnigym.rl.advantages import get_advantage
from omnigym.envs.task_spec import load_task
from omnigym.tasks.steps import ChainTask, check_steps, labelled_replies, reply_steps

EXAMPLE = {"question": "Start at 7, then +5, *3, -4.", "answer": "32", "start": 7,
           "chain": [["+", 5], ["*", 3], ["-", 4]], "steps": ["7+5=12", "12*3=36", "36-4=32"]}


def quiet(run_dir, **kw):
    return {"run_dir": str(run_dir) if run_dir else None, "progress": False, "plot": False, "tensorboard": False, **kw}


def metrics(run_dir):
    return [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]


def strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("perf", "time"))} for r in rows]


@pytest.mark.parametrize("reply, verdicts", [
    ("7+5=12\n12*3=36\n36-4=32\n<answer>32</answer>", [True, True, True, True]),
    (" 7 + 5 = 12 \n\n12 * 3 = 36\n36-4=32\n<answer> 32 </answer>\n", [True, True, True, True]),  # spaces, a blank line
    ("7+5=12\n12*3=35\n35-4=31\n<answer>31</answer>", [True, False, False, False]),  # a slip carries on wrong
    ("7+5=12\n12*4=48\n48-4=44\n<answer>44</answer>", [True, False, False, False]),  # a wrong operand
    ("7+5=12\n12+3=15\n15-4=11\n<answer>11</answer>", [True, False, False, False]),  # a wrong operator
    ("7+5=12\n12*3=36\n36-4=32\n<answer>33</answer>", [True, True, True, False]),   # a wrong answer
    ("7+5=12\n12*3=36\n<answer>36</answer>", [True, True, False]),                   # a step left out
    ("7+5=12\n12*3=36\n36-4=32\n<answer>32</answer>\nmore", [True, True, True, True, False]),
    ("<answer>32</answer>", [False]),  # the answer without the steps: the first step is missing
    ("twelve", [False]),
    ("", []),
])
def test_the_checker_judges_each_step_of_hand_written_replies(reply, verdicts):
    assert check_steps(reply, EXAMPLE) == verdicts
    assert len(reply_steps(reply)) == len(verdicts)


def test_steps_are_the_non_empty_lines_with_their_character_spans():
    reply = "  1+2=3  \n\n3+4=7\n<answer>7</answer>"
    spans = reply_steps(reply)
    assert [reply[a:b] for a, b in spans] == ["1+2=3", "3+4=7", "<answer>7</answer>"]
    assert spans[0] == (2, 7) and spans[-1][1] == len(reply)


def test_the_chain_task_solves_itself_and_its_perturbations_are_labelled_by_the_checker():
    task = load_task("chain", seed=3, eval_size=20, digits=1, terms=4, operations="+-*")
    assert task.env is not None and len(task.train[0]["steps"]) == 3
    assert not {e["question"] for e in task.train} & {e["question"] for e in task.heldout}
    rng, labels = random.Random(0), []
    for example in task.train[:200]:
        demonstration = task.env.demonstration(example)[0]["content"]
        assert check_steps(demonstration, example) == [True] * 4
        assert task.env.reward([demonstration], [example]).item() == 1.0  # the outcome reward: the answer tag
        replies = labelled_replies(example, rng, wrong=3)
        assert replies[0][1] == [True] * 4
        for reply, reply_labels in replies[1:]:
            assert reply_labels == check_steps(reply, example) and not all(reply_labels)
            changed = next(k for k, (a, b) in enumerate(zip(reply.split("\n"), replies[0][0].split("\n"))) if a != b)
            assert reply_labels[:changed + 1] == [True] * changed + [False]  # right up to the mistake, which is wrong
            labels += reply_labels
    assert 0.3 < sum(labels) / len(labels) < 0.7
    with pytest.raises(Exception, match="digits >= 1"):
        ChainTask(digits=0)


def test_verification_figures_by_hand():
    """Two problems of 1 right + 2 wrong replies. Problem 1: the right reply's weakest step (1.0)
    beats the others' (-2.0, 0.5); problem 2: a tie (0.0 and 0.0) is not a win. First mistakes:
    -2.0 and 0.5 (called right) in problem 1, -1.0 and 3.0 in problem 2: 2 of 4 called wrong."""
    t = torch.tensor
    scored = [([True, True], t([2.0, 1.0])), ([True, False], t([1.5, -2.0])), ([False, False], t([0.5, 0.7])),
              ([True, True], t([0.0, 4.0])), ([False, True], t([-1.0, 2.0])), ([True, False], t([0.0, 3.0]))]
    figures = prm.verification(scored, group=3)
    assert figures == {"eval/first_mistake_accuracy": 2 / 4, "eval/right_ranked_first": 1 / 2}
    alike = [(labels, torch.zeros(len(labels))) for labels, _ in scored]  # a PRM that scores everything alike
    assert prm.verification(alike, group=3)["eval/right_ranked_first"] == 0.0


@pytest.fixture(scope="module")
def process_model(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("prm") / "run"
    summary = prm.train(prm.PRMConfig(**quiet(run_dir), operations="+-", steps=30, batch_size=8, eval_size=40,
                                      eval_every=15, learning_rate=1e-3))
    return run_dir, summary


def test_prm_learns_step_labels_above_the_base_rate(process_model):
    run_dir, summary = process_model
    rows = metrics(run_dir)
    assert rows[0]["eval/step_accuracy"] == summary["initial_step_accuracy"]
    assert summary["step_accuracy"] > summary["base_rate"] > 0.5  # better than always guessing the commoner label
    assert summary["step_accuracy"] > summary["initial_step_accuracy"]
    info = json.loads((run_dir / "model" / "omnigym_reward.json").read_text())
    assert info["kind"] == "process" and info["heldout_step_accuracy"] == summary["step_accuracy"]
    from safetensors.torch import load_file

    from omnigym.models.lm import build_tiny_model

    before = load_file(str(build_tiny_model(run_dir.parent / "base", seed=1) / "model.safetensors"))  # its backbone
    after = load_file(str(run_dir / "model" / "model.safetensors"))
    assert not torch.equal(before["model.embed_tokens.weight"], after["model.embed_tokens.weight"])


def test_prm_reward_scores_each_step_at_its_end_and_a_reply_by_its_weakest_step(process_model):
    from omnigym.rewards import parse_weights

    run_dir, _ = process_model
    reward = parse_weights(f"prm:{run_dir}:1.0")
    scorer = reward.parts[f"prm:{run_dir}"]
    replies = ["7+5=12\n12*3=36\n36-4=32\n<answer>32</answer>", "7+5=13\n<answer>13</answer>", ""]
    steps = scorer.step_scores(replies, [EXAMPLE] * 3)
    assert [[end for end, _ in s] for s in steps] == [[b for _, b in reply_steps(r)] for r in replies]
    assert all(0 < p < 1 for s in steps for _, p in s)
    scores = reward(replies, [EXAMPLE] * 3)
    assert scores.shape == (3,) and scores.dtype == torch.float64
    assert scores[:2].tolist() == pytest.approx([min(p for _, p in s) for s in steps[:2]]) and scores[2] == 0
    # scored one at a time or together, a reply's steps score the same
    alone = scorer.step_scores(replies[1:2], [EXAMPLE])[0]
    assert [end for end, _ in alone] == [end for end, _ in steps[1]]
    assert [p for _, p in alone] == pytest.approx([p for _, p in steps[1]], abs=1e-5)


def test_prm_same_seed_same_metrics(tmp_path):
    cfg = dict(operations="+-", steps=4, batch_size=4, eval_size=10, eval_every=2, checkpoint_every=2)
    prm.train(prm.PRMConfig(**quiet(tmp_path / "a"), **cfg))
    prm.train(prm.PRMConfig(**quiet(tmp_path / "b"), **cfg))
    assert strip(metrics(tmp_path / "a")) == strip(metrics(tmp_path / "b"))


class KnownSteps:
    """A step reward of known values: step k of any reply scores (k + 1) / 10."""

    def step_scores(self, completions, examples):
        return [[(end, (k + 1) / 10) for k, (_, end) in enumerate(reply_steps(c))] for c in completions]


def test_a_step_reward_lands_on_the_token_that_ends_its_step():
    from omnigym.generators.base import Trajectories, Trajectory
    from omnigym.models.lm import build_tiny_model, load_tokenizer
    from omnigym.rewards import WeightedSum
    from omnigym.rl.step_rewards import place_step_rewards, token_ending

    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        tokenizer = load_tokenizer(str(build_tiny_model(folder)))
    reply = "1+2=3\n3+4=7\n<answer>7</answer>"
    ids = tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]  # one token a character
    items = [Trajectory([1, 2], ids, [1] * len(ids), [0.0] * len(ids), 1.0, 0, 0, EXAMPLE, {}),
             Trajectory([1, 2], ids[-1:], [1], [0.0], 0.0, 0, 0, EXAMPLE, {})]  # an empty reply: no step
    trajectories = Trajectories(items)
    reward = WeightedSum.__new__(WeightedSum)
    reward.weights, reward.parts = {"known": 2.0}, {"known": KnownSteps()}
    stats = place_step_rewards(reward, trajectories, tokenizer)
    assert items[0].info["step_rewards"] == [(4, pytest.approx(0.2)), (10, pytest.approx(0.4)), (29, pytest.approx(0.6))]
    assert reply[4] == "3" and reply[10] == "7" and reply[29] == ">"  # each the last character of its step
    assert items[1].info["step_rewards"] == [] and stats["reward/steps_per_reply"] == 1.5

    masks = torch.tensor([[1.0] * len(ids), [1.0] + [0.0] * (len(ids) - 1)])
    rewards = grpo.token_rewards(trajectories, masks)
    expected = torch.zeros(masks.shape)
    expected[0, [4, 10, 29]] = torch.tensor([0.2, 0.4, 0.6])
    expected[0, len(ids) - 1] = 1.0  # the outcome on the last token (the end of sequence)
    assert torch.allclose(rewards, expected)
    # a token that holds several characters: the step ends on the token that reaches its last one
    assert token_ending(4, [3, 5, 9]) == 1 and token_ending(3, [3, 5, 9]) == 0 and token_ending(9, [3, 5, 9]) == 2


def test_process_advantage_is_grpo_for_the_outcome_plus_centred_step_rewards_to_go():
    nan = float("nan")
    mask = torch.ones(2, 4)
    steps = torch.tensor([[0.9, nan, 0.7, nan], [nan, 0.1, nan, nan]])
    outcome = torch.tensor([[0, 0, 0, 1.0], [0, 0, 0, 0.0]])
    rewards = outcome + steps.nan_to_num(nan=0.0)
    group = torch.tensor([0, 0])
    advantages, _ = get_advantage("process")(rewards, mask, group, steps=steps)
    grpo_part, _ = get_advantage("grpo")(outcome, mask, group)
    mean = (0.9 + 0.7 + 0.1) / 3
    to_go = torch.tensor([[0.9 + 0.7 - 2 * mean, 0.7 - mean, 0.7 - mean, 0.0], [0.1 - mean, 0.1 - mean, 0.0, 0.0]])
    assert torch.allclose(advantages, grpo_part + to_go, atol=1e-6)
    without, _ = get_advantage("process")(outcome, mask, group)
    assert torch.allclose(without, grpo_part)


def test_grpo_trains_with_step_rewards_and_the_same_seed_gives_the_same_metrics(tmp_path, process_model):
    run_dir, _ = process_model
    cfg = dict(task="chain", operations="+-", max_new_tokens=40, sft_steps=0, steps=2, prompts_per_step=4,
               group_size=4, eval_size=8, eval_every=100, step_rewards=f"prm:{run_dir}:1.0", advantage="process")
    grpo.train(grpo.GRPOConfig(**quiet(tmp_path / "a"), **cfg))
    grpo.train(grpo.GRPOConfig(**quiet(tmp_path / "b"), **cfg))
    rows = [r for r in metrics(tmp_path / "a") if "reward/step_mean" in r]
    assert len(rows) == 2 and all(0 < r["reward/step_mean"] < 1 and r["reward/steps_per_reply"] > 0 for r in rows)
    assert all(r["groups/kept_fraction"] > 0 for r in rows)  # step scores differ where outcomes are all 0
    assert strip(metrics(tmp_path / "a")) == strip(metrics(tmp_path / "b"))


@pytest.fixture(scope="module")
def whole_reply_model(tmp_path_factory):
    """A reward model folder of `train rm` (a scalar head, no kind): scores whole replies."""
    from omnigym.models.lm import build_tiny_model, load_tokenizer
    from omnigym.models.scalar_head import load_scalar_model, save_reward_model

    base = build_tiny_model(tmp_path_factory.mktemp("base"))
    tokenizer = load_tokenizer(str(base))
    run_dir = tmp_path_factory.mktemp("rm")
    save_reward_model(run_dir / "model", load_scalar_model(str(base), tokenizer.pad_token_id), tokenizer,
                      {"conversational": True, "max_length": 256})
    return run_dir


@pytest.mark.parametrize("argv, message", [
    (["train", "grpo", "--task", "chain", "--step-rewards", "prm:{rm}:1.0"], "scores whole replies (a reward model of "
                                                                              "`omnigym train rm`), not steps"),
    (["train", "grpo", "--task", "chain", "--rewards", "prm:{tmp}:1.0"], "is not a reward model (no model/"),
    (["train", "grpo", "--task", "chain", "--step-rewards", "prm:{tmp}/none:1.0"], "no such folder; give the run "
                                                                                    "directory of `omnigym train prm`"),
    (["train", "grpo", "--task", "chain", "--step-rewards", "math:1.0"], "--step-rewards: math scores whole replies"),
    (["train", "grpo", "--env", "tools", "--step-rewards", "prm:{tmp}:1.0"], "--step-rewards reads the steps of one "
                                                                              "reply"),
    (["train", "prm", "--task", "arithmetic"], "--task arithmetic has no steps to label"),
    (["train", "prm", "--wrong-per-problem", "-1"], "--wrong-per-problem must be at least 1 (with none"),
    (["train", "prm", "--wrong-per-problem", "0"], "nothing to learn to tell apart), got 0"),
    (["train", "grpo", "--advantage", "procss"], "unknown advantage estimator 'procss'"),
])
def test_bad_input_is_one_line_and_no_run_dir(tmp_path, capsys, whole_reply_model, argv, message):
    run_dir = tmp_path / "run"
    argv = [a.format(tmp=tmp_path, rm=whole_reply_model) for a in argv] + ["--run-dir", str(run_dir)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not run_dir.exists()
