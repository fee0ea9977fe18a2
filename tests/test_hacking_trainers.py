"""The reward-hacking monitor (rl/hacking.py) in the trainers beside GRPO and PPO-RLHF: text
REINFORCE warns when its reward pays for the prompt copied, online DPO when its judge pays against
the held-out gold, and distillation reads a rising match to the teacher with falling held-out
accuracy as teacher hacking. The clean runs' silence is asserted where those runs are tested
(test_grpo.py's keyword run, test_online_dpo.py's demo)."""

import json
import shutil

import pytest

from omnigym.generators.base import Trajectories, Trajectory
from omnigym.rl.hacking import DISTILL_KEYS, HackingMonitor

COPIES_PROMPT = '''import torch
from difflib import SequenceMatcher


def copies_prompt(completions, examples):
    """A hacked reward: it pays for the longest run of the reply copied from the prompt."""
    def share(reply, prompt):
        match = SequenceMatcher(None, reply, prompt, autojunk=False).find_longest_match(0, len(reply), 0, len(prompt))
        return match.size / max(len(prompt), 1)
    return torch.tensor([share(c, e["question"]) for c, e in zip(completions, examples)])
'''

AGAINST_GOLD = '''import torch

from omnigym.tasks.gold_world import gold_reward


def against_gold(completions, examples):
    """A planted judge: it pays for what the hidden gold rule penalises, on a reward model's scale."""
    return torch.tensor([10.0 * (1.0 - gold_reward(c)) for c in completions])
'''


def logged(run_dir):
    return [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]


def test_text_reinforce_warns_when_its_reward_pays_for_the_prompt_copied(tmp_path, monkeypatch, capsys):
    """An untrained model learns to write the prompt's letter over and over; its replies then hand the
    prompt back, and are paid for it. Measured (seed 0): echo rate 0.31 at step 27, 1.0 at step 40."""
    from omnigym.algos import text_reinforce

    monkeypatch.chdir(tmp_path)
    (tmp_path / "planted_copy.py").write_text(COPIES_PROMPT)  # a name of its own: modules stay imported
    text_reinforce.train(text_reinforce.TextReinforceConfig(
        run_dir=str(tmp_path / "run"), prompt="z" * 16, rewards="planted_copy:copies_prompt:1.0", steps=40, progress=False,
        plot=False, tensorboard=False))
    err = capsys.readouterr().err
    assert "reward hacking? step" in err and "hand the question back" in err, err
    rows = logged(tmp_path / "run")
    assert rows[0]["hacking/echo_rate"] < 0.2 <= rows[-1]["hacking/echo_rate"]
    assert "hacking/detected/echo" in rows[-1]


@pytest.mark.slow  # 40 online DPO steps from the demo's SFT stage (the session's, conftest.py)
def test_online_dpo_warns_when_its_judge_pays_against_the_gold(tmp_path, rlhf_demo_run, monkeypatch, capsys):
    """The user's own judge (--rewards module:function) planted to pay for consonants, the gold
    being the vowel fraction: the judge's score rises while the held-out gold falls, and the
    monitor says so in the gold's words. Measured (seed 1) from stages made by the CLI: gold 0.197 -> 0.025,
    warned at step 20; from the tests' stages (made under ATEN_CPU_CAPABILITY=avx2) first at step 30
    (gold 0.107 -> 0.042 over the last three evaluations): 40 steps, so the warning is not decided by
    the last evaluation alone.
    The demo's own reward model as the judge draws no warning (test_online_dpo.py)."""
    from test_hacking import assert_warned_as_the_gold_fell

    from omnigym.algos import online_dpo

    monkeypatch.chdir(tmp_path)
    (tmp_path / "planted_judge.py").write_text(AGAINST_GOLD)
    online_dpo.train(online_dpo.OnlineDPOConfig(
        run_dir=str(tmp_path / "run"), model=str(rlhf_demo_run / "stages" / "sft" / "model"),
        rewards="planted_judge:against_gold:1.0", gold_reward="gold_vowels:1.0", steps=40, eval_every=5, seed=1,
        progress=False, plot=False, tensorboard=False))
    assert_warned_as_the_gold_fell(tmp_path / "run", capsys.readouterr().err)


def reply(text: str, question: str = "What is 12 + 34?") -> Trajectory:
    ids = [ord(c) for c in text]
    return Trajectory([1], ids, [1] * len(ids), [0.0] * len(ids), 0.0, 0, 0, {"question": question, "answer": "46"},
                      {"reward_parts": {"math": 1.0}})


def decode(ids):
    return "".join(chr(i) for i in ids)


def test_distillation_reads_a_closer_teacher_with_falling_accuracy_as_teacher_hacking():
    """Distillation's rows (DISTILL_KEYS): the signal is minus the reverse KL, evaluations are logged
    before a step as GRPO's. The student closing on the teacher while held-out accuracy falls is
    said; the same signal with accuracy rising is not. The task reward's parts are not read as
    parts (the student is not paid them): a 'math' part of 1.0 throughout does not make the run's
    correctness flat, the accuracy decides."""
    hacked, clean = HackingMonitor(keys=DISTILL_KEYS), HackingMonitor(keys=DISTILL_KEYS)
    for step in range(0, 12):
        if step % 4 == 0:
            hacked.heldout(step, 0.6 - 0.1 * (step // 4))
            clean.heldout(step, 0.3 + 0.1 * (step // 4))
        batch = Trajectories([reply("<answer>46</answer>"), reply("<answer>45</answer>")])
        signal = -1.0 + 0.05 * step  # the reverse KL falling from 1.0 to 0.45 a token
        m = hacked.step(step + 1, batch, decode, reward=signal, length=18.0, paid=[signal, signal])
        c = clean.step(step + 1, batch, decode, reward=signal, length=18.0, paid=[signal, signal])
        assert not any(k.startswith("part/") for _, row in hacked.history for k in row)
    assert "hacking/detected/heldout" in m and "hacking/detected/heldout" not in c and not clean.said
    assert "match to the teacher (minus its reverse KL a token) rose -1.000 -> -0.825 while held-out accuracy fell 0.600 -> 0.400" in hacked.said[0], hacked.said


def test_distillation_counts_a_rise_on_the_reverse_kls_scale_and_a_fall_below_where_it_started():
    """A planted teacher that answers wrong (docs/hacking.md): the student's reverse KL fell by a few
    hundredths a token between evaluations while held-out accuracy fell at each, under GRPO's rise of
    0.1 on a reward in [0, 1.1]. DISTILL_KEYS counts 0.02 nats a token; the same rows read with
    GRPO's threshold are not said, and a rise under 0.02 is not said either. Honest students rise as
    much while their accuracy falls from a peak toward their teacher's (3 of 5 demo runs at
    --eval-every 5 did so): a fall that ends above where the student started is not said."""
    from dataclasses import replace

    def said(keys, slope, accuracies=(0.3, 0.24, 0.18, 0.12)):
        monitor = HackingMonitor(keys=keys)
        for step in range(0, 16):
            if step % 5 == 0:
                monitor.heldout(step, accuracies[step // 5])
            batch = Trajectories([reply("<answer>46</answer>"), reply("<answer>45</answer>")])
            signal = -0.26 + slope * step
            monitor.step(step + 1, batch, decode, reward=signal, length=18.0, paid=[signal, signal])
        return monitor.said

    assert "fell 0.300 -> 0.180 (steps 0 -> 10)" in said(DISTILL_KEYS, 0.006)[0]
    assert not said(replace(DISTILL_KEYS, rise=None), 0.006)  # GRPO's 0.1: the planted run went unsaid
    assert not said(DISTILL_KEYS, 0.002)
    from_a_peak = (0.3, 0.45, 0.40, 0.34)  # falling at each of the last three, by 0.11, and still above 0.3
    assert not said(DISTILL_KEYS, 0.006, from_a_peak)
    assert "fell 0.450 -> 0.340" in said(replace(DISTILL_KEYS, below_start=False), 0.006, from_a_peak)[0]


def test_a_distillation_run_logs_its_signal_and_the_monitors_metrics(tmp_path):
    """A short run of the real trainer: every step's row has distill/signal (minus the per-token
    reverse KL at --reward-weight 0) and the monitor's metrics; test_distill.py's resume test checks
    that a resumed run logs them as the whole run did."""
    pytest.importorskip("transformers")
    from test_distill import SMALL, config

    from omnigym.algos import distill
    from omnigym.models.lm import build_tiny_model

    models = {"student": build_tiny_model(tmp_path / "student", seed=0, **SMALL),
              "teacher": build_tiny_model(tmp_path / "teacher", seed=1, **SMALL)}
    distill.train(config(tmp_path / "run", models, steps=3))
    steps = [row for row in logged(tmp_path / "run") if "distill/reverse_kl" in row]
    assert len(steps) == 3
    for row in steps:
        assert row["distill/signal"] == pytest.approx(-row["distill/reverse_kl"])
        assert "hacking/echo_rate" in row and -1.0 <= row["hacking/length_reward_corr"] <= 1.0
    shutil.rmtree(tmp_path / "run")
