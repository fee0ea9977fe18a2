"""What a run tells a person: the progress line (no value before it is measured, a finished run at
100%, its last line once), and the closing lines of a control run (a goal env's success rate, a
run that finished no episode in words, the env steps trained when they are not --total-timesteps)."""

import json
import re

import pytest

from omnigym.cli import main
from omnigym.track.progress import ProgressBar


def lines(capsys) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_a_value_not_measured_yet_is_left_out_then_the_last_measured_one_is_shown(capsys):
    bar = ProgressBar(10, "grpo", line_every=0.0)
    bar.update(1, reward=0.25, acc=float("nan"))  # before the first evaluation
    bar.update(2, reward=0.5, acc=0.3)
    bar.update(3, reward=0.75, acc=float("nan"))  # between evaluations
    shown = lines(capsys)
    assert shown[0].startswith("grpo: 1/10 (10%) reward 0.25  [") and "nan" not in shown[0]
    assert shown[1].startswith("grpo: 2/10 (20%) reward 0.5  acc 0.3  [")
    assert shown[2].startswith("grpo: 3/10 (30%) reward 0.75  acc 0.3  [")


def test_a_finished_run_ends_its_line_at_100_percent(capsys, monkeypatch):
    import omnigym.track.progress as progress

    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    bar = ProgressBar(400, "grpo", line_every=30.0)  # a line every 30 s: the last one came at 70%
    now[0] = 30.0
    bar.update(280, reward=0.5)
    now[0] = 45.0
    bar.update(400, reward=0.9)
    bar.close()
    shown = lines(capsys)
    assert shown[0].startswith("grpo: 280/400 (70%)")
    assert shown[-1].startswith("grpo: 400/400 (100%) reward 0.9  [")


def test_a_stage_that_stops_early_ends_at_its_last_step(capsys):
    bar = ProgressBar(270, "warm-up", line_every=1e9)
    bar.update(99, sft_loss=0.125)
    bar.close()  # the target accuracy was reached at step 99 of at most 270
    shown = lines(capsys)
    assert len(shown) == 1 and shown[0].startswith("warm-up: 99/99 (100%) sft_loss 0.125  [")


def test_a_run_stopped_short_keeps_its_total(capsys):
    """An offline run stopped by SIGTERM at step 1815 of 200000 closed its line at '1815/1815 (100%)'."""
    bar = ProgressBar(200_000, "iql", line_every=1e9)
    bar.update(1815, sps=96)
    bar.close(finished=False)
    shown = lines(capsys)
    assert len(shown) == 1 and shown[0].startswith("iql: 1815/200000 (1%) sps 96  [")


@pytest.mark.parametrize("total, last", [(400, 400), (512, 493)])
def test_the_last_line_is_printed_once(capsys, total, last):
    """close() printed the line of the last update again: word for word when the run ended on
    its total (SAC, the offline loop), with only the total changed when an on-policy run counted
    fewer steps than its rollouts stepped (PPO: 493/512, then 493/493)."""
    bar = ProgressBar(total, "ppo", line_every=0.0)
    bar.update(last, sps=100, ret=20.5)
    bar.close()
    shown = lines(capsys)
    assert len(shown) == 1 and shown[0].startswith(f"ppo: {last}/{total} ") and "ret 20.5" in shown[0], shown


def train_lines(capsys, tmp_path, *argv) -> list[str]:
    assert main(["train", *argv, "--run-dir", str(tmp_path / "run"), "--no-plot", "--torch-threads", "1"]) == 0
    return capsys.readouterr().err.strip().splitlines()


def test_a_goal_env_run_reports_its_success_rate(tmp_path, capsys):
    """A goal env's run printed its return (minus the steps short of the goal) where docs/her.md
    reads the success rate."""
    err = train_lines(capsys, tmp_path, "dqn", "--env-id", "omnigym/BitFlip-v0", "--her", "--total-timesteps", "200",
                      "--learning-starts", "100", "--seed", "1")
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])["charts/return_last_20"]
    progress = re.fullmatch(r"dqn: 200/200 \(100%\) sps \d+  success ([\d.]+)  ret (-[\d.]+)  \[\d+ s\]", err[-3])
    assert progress and float(progress[2]) == pytest.approx(last, abs=0.05), err
    assert err[-1] == f"final success rate (last 20 episodes): {float(progress[1]):.2f}  (mean return {last:.2f})", err


@pytest.mark.parametrize("argv", [
    ["ppo", "--env-id", "toy_envs:EndlessEnv", "--num-envs", "2", "--num-steps", "16"],
    ["reinforce", "--env-id", "toy_envs:EndlessEnv", "--num-envs", "2", "--num-steps", "16"],
    ["dqn", "--env-id", "toy_envs:EndlessEnv", "--learning-starts", "10"],
    ["sac", "--env-id", "Pendulum-v1", "--learning-starts", "10", "--hidden", "8", "8"],  # 200-step episodes
    ["td3", "--env-id", "Pendulum-v1", "--learning-starts", "10", "--hidden", "8", "8"],
], ids=lambda argv: argv[0])
def test_a_run_that_finished_no_episode_says_so_in_words(tmp_path, capsys, argv):
    """A short Go2 run ended with 'final mean return (last 0 episodes): nan'."""
    err = train_lines(capsys, tmp_path, *argv, "--total-timesteps", "64")
    envs = "2 envs x 32 steps" if argv[0] in ("ppo", "reinforce") else "1 env"
    assert err[-1] == (f"no episode finished in 64 env steps ({envs}), so there is no return to report; train for "
                       "more steps (--total-timesteps) to finish one"), err
    assert not any("nan" in line for line in err), err


AUTORESETS = ("4 of the 96 stepped were autoresets (the step after an episode ends starts the next one: no transition, "
              "not counted)")


@pytest.mark.parametrize("total, end", [
    # the reviewer's case: a whole number of rollouts, and the count short by the autoresets
    (96, f"trained 92 env steps for --total-timesteps 96: {AUTORESETS}"),
    (100, f"trained 92 env steps for --total-timesteps 100: 3 whole rollouts of 2 envs x 16 steps stepped 96, and "
          f"{AUTORESETS}"),
])
def test_an_on_policy_run_says_what_it_trains_when_it_is_not_the_total(tmp_path, capsys, total, end):
    """--total-timesteps 76800 trained 76,736 steps without a word: rollouts are whole (rounded
    down, at least one), and the autoreset step after each episode's end (20-step episodes here,
    two per env in 48 steps) is stepped but not counted."""
    err = train_lines(capsys, tmp_path, "ppo", "--env-id", "toy_envs:SignChoiceEnv", "--num-envs", "2",
                      "--num-steps", "16", "--total-timesteps", str(total))
    steps = [json.loads(line)["global_step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 92
    assert err[-2] == end and err[-1].startswith("final mean return (last 4 episodes): "), err
