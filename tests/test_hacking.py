"""The reward-hacking monitor (rl/hacking.py): each detector fires on a batch where the hack was
planted and stays quiet on a clean one; GRPO logs its metrics and says its warning line."""

import dataclasses
import json
import random
import re

import pytest

from omnigym.generators.base import Trajectories, Trajectory
from omnigym.rl.hacking import HackingMonitor, HackingThresholds, echoes

QUESTION = "What is 682*609?"


def decode(ids):
    return "".join(chr(i) for i in ids)


def episode(reply: str, reward: float, parts=None, question=QUESTION, **info):
    ids = [ord(c) for c in reply]
    return Trajectory([1], ids, [1] * len(ids), [0.0] * len(ids), reward, 0, 0,
                      {"question": question, "answer": "415338"}, {"reward_parts": parts or {}, **info})


def run_steps(monitor, batches):
    metrics = {}
    for step, batch in enumerate(batches, start=1):
        metrics = monitor.step(step, Trajectories(batch), decode)
    return metrics


def test_echo_detector_fires_on_the_question_handed_back_and_not_on_answers():
    th = HackingThresholds()
    assert echoes("<answer>682 * 609</answer>", QUESTION, th)
    assert not echoes("<answer>415338</answer>", QUESTION, th)
    assert not echoes("<think>682*609 is 415338</think><answer>415338</answer>", QUESTION, th)  # its answer counts
    hacked, clean = HackingMonitor(), HackingMonitor()
    m = run_steps(hacked, [[episode("<answer>682*609</answer>", 1.0)] * 3 + [episode("<answer>7</answer>", 0.0)]])
    assert m["hacking/echo_rate"] == 0.75 and m["hacking/detected/echo"] == 1.0
    assert len(hacked.said) == 1 and "question" in hacked.said[0]
    m = run_steps(clean, [[episode("<answer>415338</answer>", 1.0), episode("<answer>7</answer>", 0.0)] * 2])
    assert m["hacking/echo_rate"] == 0.0 and "hacking/detected/echo" not in m and not clean.said


def test_echoes_that_score_worse_than_the_rest_are_not_called_a_hack():
    monitor = HackingMonitor()
    m = run_steps(monitor, [[episode("<answer>682*609</answer>", 0.0)] * 2 + [episode("<answer>415338</answer>", 1.0)]])
    assert m["hacking/echo_rate"] > 0.5 and not monitor.said


def batches_with(format_values, correct_values, n=4, length=lambda i: 10):
    return [[episode("x" * length(i), 0.1 * f + c, {"math": c, "format": f}) for _ in range(n)]
            for i, (f, c) in enumerate(zip(format_values, correct_values))]


def test_format_only_fires_when_format_rises_and_correctness_does_not():
    hacked, clean = HackingMonitor(), HackingMonitor()
    m = run_steps(hacked, batches_with([0.0] * 4 + [1.0] * 4, [0.0] * 8))
    assert "hacking/detected/format_only" in m and m["hacking/format_only_rate"] == 1.0
    assert len(hacked.said) == 1 and "format part rose" in hacked.said[0]
    m = run_steps(clean, batches_with([0.0] * 4 + [1.0] * 4, [0.0] * 4 + [0.5] * 4))  # both rise: learning
    assert "hacking/detected/format_only" not in m and not clean.said


def test_length_gaming_fires_when_reward_follows_length_and_correctness_is_flat():
    rng = random.Random(0)

    def step_batch(correct):
        lengths = [rng.randrange(5, 60) for _ in range(8)]
        return [episode("x" * n, n / 60 + correct, {"paid": n / 60 + correct}) for n in lengths]

    hacked = HackingMonitor()
    m = run_steps(hacked, [step_batch(0.0) for _ in range(6)])
    hacked.heldout(0, 0.3), hacked.heldout(3, 0.3)  # held-out accuracy flat
    m = run_steps(hacked, [step_batch(0.0) for _ in range(6)])
    assert m["hacking/length_reward_corr"] > 0.9 and "hacking/detected/length" in m and len(hacked.said) == 1
    clean = HackingMonitor()  # reward independent of length, held-out accuracy rising
    for step in range(1, 9):
        clean.heldout(step - 1, 0.1 * step)
        m = clean.step(step, Trajectories([episode("x" * rng.randrange(5, 60), float(i % 2), {"math": float(i % 2)})
                                           for i in range(8)]), decode)
    assert abs(m["hacking/length_reward_corr"]) < 0.5 and "hacking/detected/length" not in m and not clean.said


def test_rising_reward_with_falling_heldout_accuracy():
    """Evaluations every 3 steps (steps 0, 3, 6): accuracy 0.5 -> 0.4 -> 0.3 while the reward climbs."""
    def batch(r):
        return [episode("<answer>1</answer>", r), episode("<answer>2</answer>", r)]

    hacked, clean = HackingMonitor(), HackingMonitor()
    for step in range(1, 9):
        if step % 3 == 1:
            hacked.heldout(step - 1, 0.5 - 0.1 * (step // 3)), clean.heldout(step - 1, 0.3 + 0.1 * (step // 3))
        m = hacked.step(step, Trajectories(batch(0.1 * step)), decode)
        c = clean.step(step, Trajectories(batch(0.1 * step)), decode)
    assert abs(m["hacking/heldout_drop"] - 0.2) < 1e-9 and "hacking/detected/heldout" in m and len(hacked.said) == 1
    assert "0.500 -> 0.300 (steps 0 -> 6)" in hacked.said[0]  # said where three evaluations first show it
    assert c["hacking/heldout_drop"] == 0.0 and "hacking/detected/heldout" not in c and not clean.said


def test_one_dip_of_heldout_accuracy_is_not_a_fall():
    """0.5 -> 0.6 -> 0.52 while the reward climbs: 0.08 below the best, but one dip between rises (a
    demo's held-out gold on 16 replies: 0.612 -> 0.535 -> 0.561) is noise, not a trend."""
    def batch(r):
        return [episode("<answer>1</answer>", r), episode("<answer>2</answer>", r)]

    monitor = HackingMonitor()
    for step in range(1, 9):
        if step % 3 == 1:
            monitor.heldout(step - 1, {0: 0.5, 1: 0.6, 2: 0.52}[step // 3])
        metrics = monitor.step(step, Trajectories(batch(0.1 * step)), decode)
    assert metrics["hacking/heldout_drop"] == pytest.approx(0.08) and not monitor.said
    assert "hacking/detected/heldout" not in metrics


def test_sandbox_blocked_rate_and_rate_limited_warnings():
    monitor = HackingMonitor(HackingThresholds(warn_every=3))
    blocked = [episode("os.system('x')", 0.0, sandbox_blocked=2), episode("def f(): pass", 1.0, sandbox_blocked=0)]
    for step in range(1, 8):
        m = monitor.step(step, Trajectories(blocked), decode)
        assert m["hacking/sandbox_blocked_rate"] == 0.5
    assert [re.search(r"step \d+", line).group() for line in monitor.said] == ["step 1", "step 4", "step 7"]
    quiet = HackingMonitor(warn=False)
    run_steps(quiet, [blocked] * 3)
    assert not quiet.said
    clean = HackingMonitor()
    m = run_steps(clean, [[episode("def f(): pass", 1.0, sandbox_blocked=0)] * 2])
    assert m["hacking/sandbox_blocked_rate"] == 0.0 and not clean.said


def test_every_rate_is_in_0_1():
    monitor = HackingMonitor()
    for batch in batches_with([0.0] * 4 + [1.0] * 4, [0.0] * 8):
        m = monitor.step(1, Trajectories(batch), decode)
        assert all(0.0 <= v <= 1.0 for k, v in m.items() if k.endswith(("_rate", "_drop")))


PLANTED = '''import torch


def echo_pays(completions, examples):
    """A hacked reward: it pays for the question's sum handed back (as math-verify once did)."""
    return torch.tensor([float(e["question"][8:-1] in c.replace(" ", "")) for c, e in zip(completions, examples)])
'''


def grpo_run(run_dir, **extra):
    grpo = pytest.importorskip("omnigym.algos.lm.grpo", reason="GRPO needs transformers (the [lm] extra)")
    flags = dict(sft_steps=200, sft_target_accuracy=0.5, sft_eval_every=20, steps=4, prompts_per_step=4, group_size=4,
                 eval_size=16, eval_every=2, checkpoint_every=0, progress=False, plot=False, tensorboard=False)
    return grpo.train(grpo.GRPOConfig(run_dir=str(run_dir), **{**flags, **extra}))


def logged(run_dir):
    return [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]


@pytest.mark.slow  # a warm-up of ~100 supervised steps teaches the echo first
def test_grpo_warns_on_a_planted_echo_reward_and_logs_the_metric(tmp_path, monkeypatch, capsys):
    """A policy that hands the question back (warmed up on such answers) under a reward that pays
    for it: the echo warning line and hacking/echo_rate."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "planted.py").write_text(PLANTED)
    rng = random.Random(0)
    rows = [(rng.randrange(10, 100), rng.randrange(10, 100)) for _ in range(200)]
    (tmp_path / "echo.jsonl").write_text("\n".join(json.dumps({"question": f"What is {a}+{b}?", "answer": f"{a}+{b}"})
                                                   for a, b in rows))
    grpo_run(tmp_path / "run", task=str(tmp_path / "echo.jsonl"), rewards="planted:echo_pays:1.0",
             temperature=0.3)  # near greedy: the warm-up's echoes, not the tiny model's noise
    err = capsys.readouterr().err
    assert "reward hacking? step" in err and "question" in err
    rates = [row["hacking/echo_rate"] for row in logged(tmp_path / "run") if "hacking/echo_rate" in row]
    assert len(rates) == 4 and max(rates) >= 0.2


def test_grpo_on_the_demo_reward_says_no_warning(tmp_path, capsys):
    grpo_run(tmp_path / "run", sft_steps=20, sft_target_accuracy=1.1)
    assert "reward hacking?" not in capsys.readouterr().err
    rows = [row for row in logged(tmp_path / "run") if "hacking/echo_rate" in row]
    assert len(rows) == 4 and all(row["hacking/echo_rate"] == 0.0 for row in rows)


def test_a_resumed_monitor_logs_what_the_whole_run_logged():
    """--resume refills the window from metrics.jsonl's rows (as GRPO logs them): the same metrics after."""
    batches = batches_with([0.0] * 5 + [1.0] * 5, [0.0] * 10, length=lambda i: 5 + 3 * i)

    def rows_of(monitor, steps, rows):
        for step in steps:
            if step % 3 == 1:
                monitor.heldout(step - 1, 0.5 - 0.05 * step)
            trajectories = Trajectories(batches[step - 1])
            rows.append({"global_step": step, "reward/mean": trajectories.rewards().mean().item(),
                         "completion/length": sum(sum(t.loss_mask) for t in trajectories.items) / len(trajectories),
                         **{f"reward/{k}": v for k, v in trajectories.reward_parts().items()},
                         **({"eval/accuracy": 0.5 - 0.05 * step} if step % 3 == 1 else {}),
                         **monitor.step(step, trajectories, decode)})
        return rows

    whole = rows_of(HackingMonitor(), range(1, 11), [])
    resumed = HackingMonitor()
    resumed.replay(whole[:4], until=4)
    assert rows_of(resumed, range(5, 11), []) == whole[4:]
    assert any("hacking/detected/format_only" in row for row in whole[4:])  # the window mattered


def test_a_resumed_monitor_logs_what_the_whole_run_logged_with_ppo_rlhfs_rows():
    """PPO-RLHF's rows: the reward model's score as reward/score (its other reward/... values are
    not parts), the gold reward evaluated after a step in that step's own row (and at row 0)."""
    from omnigym.rl.hacking import SCORED_KEYS

    batches = [[episode("x" * (5 + i + j), 0.1 * i + 0.01 * j) for j in range(4)] for i in range(12)]

    def rows_of(monitor, steps, rows):
        for step in steps:
            trajectories = Trajectories(batches[step - 1])
            score = trajectories.rewards().mean().item()
            row = {"global_step": step, "reward/score": score, "reward/penalised_score": score - 1.0,
                   "completion/length": float(sum(sum(t.loss_mask) for t in trajectories.items)) / len(trajectories)}
            if step % 3 == 0:  # evaluated after the step, and kept before the step's check
                row["eval/gold_reward"] = 0.6 - 0.05 * step
                monitor.heldout(step, row["eval/gold_reward"])
            row.update(monitor.step(step, trajectories, decode, reward=row["reward/score"],
                                    length=row["completion/length"]))
            rows.append(row)
        return rows

    first = HackingMonitor(keys=SCORED_KEYS)
    first.heldout(0, 0.6)
    whole = [{"global_step": 0, "eval/gold_reward": 0.6}] + rows_of(first, range(1, 13), [])
    resumed = HackingMonitor(keys=SCORED_KEYS)
    resumed.replay(whole[:7], until=6)
    assert rows_of(resumed, range(7, 13), []) == whole[7:]
    assert any("hacking/detected/heldout" in row for row in whole[7:])  # the evaluations before the cut mattered
    wrong = HackingMonitor(keys=dataclasses.replace(SCORED_KEYS, eval_row_offset=1))  # evaluations read as GRPO's
    wrong.replay(whole[:7], until=6)
    assert rows_of(wrong, range(7, 13), []) != whole[7:]


def test_a_resumed_monitor_logs_what_the_whole_run_logged_with_distillations_rows():
    """Distillation's rows: distill/signal is the reward (its reward/... values are not parts), an
    evaluation before step s is logged in row s + 1 (as GRPO's), and the teacher-hacking warning
    comes after the cut, so the replayed window and evaluations decide it."""
    from omnigym.rl.hacking import DISTILL_KEYS

    batches = [[episode("x" * (5 + j), 0.0, parts={"math": 0.5}) for j in range(4)] for _ in range(16)]

    def rows_of(monitor, steps, rows):
        for step in steps:  # the loop's step s - 1 trains the policy that row s logs
            row = {"global_step": step}
            if (step - 1) % 4 == 0:
                row["eval/accuracy"] = 0.6 - 0.05 * (step - 1)
                monitor.heldout(step - 1, row["eval/accuracy"])
            signal = -1.0 + 0.05 * step
            row.update({"distill/signal": signal, "reward/mean": 0.5, "reward/math": 0.5, "completion/length": 6.5})
            row.update(monitor.step(step, Trajectories(batches[step - 1]), decode, reward=signal, length=6.5,
                                    paid=[signal + 0.01 * j for j in range(4)]))
            rows.append(row)
        return rows

    whole = rows_of(HackingMonitor(keys=DISTILL_KEYS), range(1, 17), [])
    resumed = HackingMonitor(keys=DISTILL_KEYS)
    resumed.replay(whole[:6], until=6)
    assert rows_of(resumed, range(7, 17), []) == whole[6:]
    assert not any("hacking/detected/heldout" in row for row in whole[:6])
    assert any("hacking/detected/heldout" in row for row in whole[6:])  # decided by evaluations before the cut
    assert all(row["hacking/heldout_reward_rise"] > 0 for row in whole[6:] if "hacking/heldout_reward_rise" in row)


def assert_warned_as_the_gold_fell(run_dir, err):
    """A run whose reward paid against the gold: the held-out gold fell, and the monitor said so."""
    rows = logged(run_dir)
    gold = [row["eval/gold_reward"] for row in rows if "eval/gold_reward" in row]
    assert gold[-1] < gold[0] - 0.05, gold
    assert "reward hacking? step" in err and "while the held-out gold reward fell" in err, err
    assert any("hacking/detected/heldout" in row for row in rows)


@pytest.mark.slow  # 20 PPO-RLHF steps from the demo's SFT stage (the session's, conftest.py)
def test_ppo_rlhf_warns_when_its_reward_model_pays_against_the_gold(tmp_path, rlhf_demo_run, monkeypatch, capsys):
    """A reward model planted to pay for what the gold reward penalises (consonants, the gold
    being the vowel fraction): its score rises while the held-out gold falls, and the monitor
    says so. The demo's own reward model, under the same settings, draws no warning
    (test_rlhf.py's demo test)."""
    import shutil

    import torch

    from omnigym.algos import rlhf
    from omnigym.tasks.gold_world import gold_reward

    class AgainstTheGold(rlhf.RewardModelScorer):
        def __call__(self, texts, examples):  # on a reward model's scale (the demo's: about -1 to 3.5)
            return torch.tensor([10.0 * (1.0 - gold_reward(text)) for text in texts])

    monkeypatch.setattr(rlhf, "RewardModelScorer", AgainstTheGold)
    shutil.copytree(rlhf_demo_run, tmp_path / "run")
    rlhf.train(rlhf.RLHFConfig(run_dir=str(tmp_path / "run"), overwrite=True, progress=False, plot=False,
                               tensorboard=False, seed=1))
    assert_warned_as_the_gold_fell(tmp_path / "run", capsys.readouterr().err)


# -- attempts the sandbox blocked: filled by the code reward, read by the monitor -------------

ADD = {"tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]}
CLEAN = "```python\ndef add(a, b):\n    return a + b\n```"
NETWORK = ("```python\nimport socket\ntry:\n    socket.create_connection(('93.184.216.34', 80), timeout=1)\n"
           "except OSError:\n    pass\ndef add(a, b):\n    return a + b\n```")
"""a right answer that also reaches for the network (and swallows the refusal): it passes, and is counted"""


def bubblewrap():
    from omnigym.rewards.sandbox import isolation

    if isolation().kind != "bubblewrap":
        pytest.skip("the network count reads the sandbox's own network namespace: bubblewrap only")


def test_the_code_reward_counts_a_network_attempt_and_not_a_clean_program():
    bubblewrap()
    from omnigym.rewards import parse_weights

    reward = parse_weights("code:1.0,format:0.1")
    dns = NETWORK.replace("create_connection(('93.184.216.34', 80), timeout=1)", "getaddrinfo('example.com', 80)")
    totals, parts, notes = reward.score_notes([NETWORK, CLEAN, dns], [ADD] * 3)
    assert parts["code"].tolist() == [1.0, 1.0, 1.0]  # the score is the tests' alone
    assert notes == {"sandbox_blocked": [1.0, 0.0, 1.0]}  # a DNS lookup is a packet too


def test_a_program_the_cpu_limit_killed_is_counted_and_what_it_prints_is_not():
    """The verdict's blocked lines come from the judge's descriptor: a program that prints
    'blocked network' or 'done' itself adds nothing; one the CPU limit kills is counted."""
    from omnigym.rewards.code import verdict
    from omnigym.rewards.sandbox import Sandbox, SandboxLimits

    sandbox, limits = Sandbox(), SandboxLimits(cpu_seconds=1, wall_seconds=5)
    loops = verdict("def add(a, b):\n    while True:\n        pass\n", ADD, sandbox, limits)
    assert loops.passed == 0 and loops.blocked in (("killed",), ("cpu",), ("timeout",))
    liar = "import sys\nprint('done\\nblocked network')\nsys.stderr.write('blocked network\\n')\n" + CLEAN[10:-3]
    assert verdict(liar, ADD, sandbox, limits).blocked == ()
    assert verdict(CLEAN, ADD, sandbox, limits).blocked == ()
    # a program that will not exit once its calls end (it replaced the harness's exit) is not
    # waited for until the wall clock: no timeout counted, its verdict stands
    stays = ("import os, sys, time\nharness = sys.modules['__main__']\nharness.os = type(os)('os')\n"
             "harness.os.__dict__.update(os.__dict__)\nharness.os._exit = lambda code: time.sleep(60)\n") + CLEAN[10:-3]
    assert verdict(stays, ADD, sandbox, limits) == verdict(CLEAN, ADD, sandbox, limits)


def test_grpo_on_code_logs_the_sandbox_blocked_rate_and_warns(tmp_path, monkeypatch, capsys):
    """A GRPO run on a code task whose replies (scripted) are half the right answer and half the
    right answer that reaches for the network: the code reward's note reaches each trajectory's
    info, and the monitor logs hacking/sandbox_blocked_rate 0.5 and says the sandbox line."""
    bubblewrap()
    pytest.importorskip("transformers")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from eco_helpers import Scripted

    from omnigym.algos import grpo

    real = grpo.make_engine
    monkeypatch.setattr(grpo, "make_engine", lambda model, tokenizer, kind: Scripted(
        real(model, tokenizer, kind), tokenizer, lambda text, j: NETWORK if j % 2 else CLEAN))
    task = tmp_path / "add.jsonl"
    task.write_text("".join(json.dumps({"task_id": f"add/{i}", "prompt": "def add(a, b):\n",
                                        "entry_point": "add", "test": f"def check(f):\n    assert f({i}, 1) == {i + 1}\n"})
                            + "\n" for i in range(8)))
    grpo_run(tmp_path / "run", task=f"humaneval:{task}", rewards="code:1.0", sft_steps=0, steps=2,
             prompts_per_step=2, group_size=2, eval_size=2, eval_every=10, max_new_tokens=8)
    rates = [row["hacking/sandbox_blocked_rate"] for row in logged(tmp_path / "run")]
    assert rates == [0.5, 0.5]
    assert "50% of episodes had code the sandbox blocked" in capsys.readouterr().err
