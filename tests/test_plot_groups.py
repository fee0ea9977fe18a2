"""``omnigym plot`` on runs of different kinds and settings: every algorithm's own headline
metric by default (an offline run's normalized score, a PRM's step accuracy), no run dropped
without a line saying why, seeds averaged only with runs whose config.json differs in nothing
but the seed (and the legend says what differs), bad input one line with nothing written.
Before: an offline run alone exited with "no metric to plot by default", an offline run beside
a PPO run was left out silently, and an agent run and a verifiers run (or two FetchReach runs
with different --hidden) were averaged as seeds of one curve."""

import json

import numpy as np
import pytest

import test_bad_input
from omnigym.algos import ALGORITHMS
from omnigym.cli import main
from omnigym.track.plot import HEADLINES, figure
from test_plot import lines, write_run


def returns(seed, steps=(100, 200, 300)):
    return [{"global_step": s, "charts/episodic_return": float(s + seed)} for s in steps]


def offline_rows(score=10.0):
    return [{"global_step": s, "losses/actor": 1.0 / s, "eval/episodic_return": -1000.0 + s,
             "eval/normalized_score": score + s / 10} for s in (30, 60, 90)]


def offline_run(root, name="iql"):
    return write_run(root / name, {"algo": "iql", "env_id": "Pendulum-v1", "dataset": "pendulum/random-v0",
                                   "seed": 1}, offline_rows())


def test_every_algorithm_has_a_headline_metric():
    assert sorted(ALGORITHMS) == sorted(HEADLINES)


def test_an_offline_run_plots_its_normalized_score_as_its_curve_png_does(tmp_path, capsys):
    run = offline_run(tmp_path)
    assert main(["plot", str(run), "--out", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").stat().st_size > 5_000
    (ax,) = figure([run]).axes
    assert ax.get_ylabel() == "eval/normalized_score"
    (steps, values), = lines(ax).values()
    assert steps.tolist() == [30, 60, 90] and values.tolist() == [13.0, 16.0, 19.0]


@pytest.mark.parametrize("algo, logged, expected", [
    ("bc", ["eval/episodic_return"], "eval/episodic_return"),  # a dataset without reference returns
    ("prm", ["eval/step_accuracy", "train/loss"], "eval/step_accuracy"),
    ("online_dpo", ["eval/judge_score", "eval/kl", "reward/score"], "eval/judge_score"),
    ("rlhf", ["eval/rm_score", "eval/gold_reward"], "eval/gold_reward"),
    ("dpo", ["eval/accuracy", "reward/mean"], "eval/accuracy"),
    ("sft", ["eval/loss", "sft/loss"], "eval/loss"),
])
def test_each_algorithm_defaults_to_its_own_headline(tmp_path, algo, logged, expected):
    run = write_run(tmp_path / algo, {"algo": algo, "task": "arithmetic"},
                    [{"global_step": s, **{m: float(s) for m in logged}} for s in (1, 2, 3)])
    assert figure([run]).axes[0].get_ylabel() == expected


def test_a_mix_of_kinds_draws_each_in_its_own_metric_and_drops_none(tmp_path):
    ppo = write_run(tmp_path / "ppo", {"algo": "ppo", "env_id": "Pendulum-v1", "seed": 1}, returns(1))
    iql = offline_run(tmp_path)
    said = []
    panels = figure([ppo, iql], say=said.append).axes
    assert [ax.get_ylabel() for ax in panels] == ["charts/episodic_return", "eval/normalized_score"]
    assert list(lines(panels[0])) == ["ppo Pendulum-v1 (1 run)"]
    assert list(lines(panels[1])) == ["iql Pendulum-v1 (1 run)"]
    assert said == []


def test_a_run_without_the_named_metric_is_skipped_with_one_line(tmp_path, capsys):
    ppo = write_run(tmp_path / "ppo", {"algo": "ppo", "env_id": "Pendulum-v1"}, returns(1))
    iql = offline_run(tmp_path)
    assert main(["plot", str(ppo), str(iql), "--metric", "charts/episodic_return",
                 "--out", str(tmp_path / "p.png")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"omnigym plot: skipped {iql}: it logged none of charts/episodic_return (it logged: "
                   "eval/episodic_return, eval/normalized_score, losses/actor)"]
    assert (tmp_path / "p.png").exists()


def test_runs_that_differ_in_a_setting_are_not_averaged_and_the_legend_says_how(tmp_path):
    runs = [write_run(tmp_path / f"h{hidden}-s{seed}",
                      {"algo": "sac", "env_id": "FetchReach-v4", "her": True, "hidden": [hidden, hidden],
                       "seed": seed, "run_dir": f"runs/h{hidden}-s{seed}", "progress": seed == 1},
                      returns(seed + hidden))
            for hidden in (64, 256) for seed in (1, 2)]
    (ax,) = figure(runs).axes
    drawn = lines(ax)
    assert sorted(drawn) == ["sac FetchReach-v4, hidden=256 256 (2 runs)", "sac FetchReach-v4, hidden=64 64 (2 runs)"]
    steps, values = drawn["sac FetchReach-v4, hidden=64 64 (2 runs)"]
    assert values.tolist() == [s + 65.5 for s in (100, 200, 300)]  # the mean of its own two seeds only


def test_an_agent_run_and_a_verifiers_run_on_one_task_are_two_curves(tmp_path):
    agent = write_run(tmp_path / "agent", {"algo": "grpo", "task": "arithmetic", "agent": "my_agent:play",
                                           "env": None},
                      [{"global_step": s, "eval/accuracy": 0.1 * s} for s in (1, 2, 3)])
    verifiers = write_run(tmp_path / "vf", {"algo": "grpo", "task": "arithmetic", "agent": None,
                                            "env": "vf:arithmetic"},
                          [{"global_step": s, "eval/accuracy": 0.2 * s} for s in (1, 2, 3)])
    (ax,) = figure([agent, verifiers]).axes
    assert sorted(lines(ax)) == ["grpo arithmetic, agent=None, env=vf:arithmetic (1 run)",
                                 "grpo arithmetic, agent=my_agent:play, env=None (1 run)"]


def test_many_differing_settings_are_cut_short_and_stay_distinct(tmp_path):
    runs = [write_run(tmp_path / f"r{i}", {"algo": "ppo", "env_id": "CartPole-v1", "a": i, "b": i, "c": i, "d": i,
                                           "e": i, "f": i}, returns(i)) for i in range(2)]
    (ax,) = figure(runs).axes
    labels = sorted(lines(ax))
    assert len(set(labels)) == 2 and all("+2 more settings" in label for label in labels), labels


def test_the_same_run_named_twice_is_drawn_once_and_said(tmp_path):
    run = write_run(tmp_path / "ppo", {"algo": "ppo", "env_id": "CartPole-v1"}, returns(0))
    said = []
    (ax,) = figure([run, tmp_path / "ppo"], say=said.append).axes
    assert said == [f"omnigym plot: skipped {tmp_path / 'ppo'}: named twice, drawn once"]
    assert len(lines(ax)) == 1


def bad_runs(tmp_path):
    write_run(tmp_path / "empty", {"algo": "ppo", "env_id": "CartPole-v1"}, [])
    write_run(tmp_path / "ok", {"algo": "ppo", "env_id": "CartPole-v1"}, returns(0))
    write_run(tmp_path / "losses", {"algo": "ppo", "env_id": "CartPole-v1"}, [{"global_step": 5, "losses/v": 1.0}])


@pytest.mark.parametrize("runs, message", [
    (["ok", "missing"], "missing is not a run directory (no config.json)"),
    (["empty"], "empty logged no metrics yet (its metrics.jsonl is empty)"),
    (["ok", "empty"], "empty logged no metrics yet"),
    (["losses"], "logged a metric to plot by default (charts/episodic_return); name one with --metric: losses/v"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, monkeypatch, capsys, runs, message):
    bad_runs(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = test_bad_input.snapshot(tmp_path)
    assert main(["plot", *runs, "--out", str(tmp_path / "new" / "p.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("omnigym: error: ") and message in err[0], err
    assert test_bad_input.snapshot(tmp_path) == before
    assert not (tmp_path / "new").exists()


def test_settings_leave_out_the_seed_paths_and_what_was_printed(tmp_path):
    from omnigym.track.plot import settings

    cfg = json.loads(json.dumps({"algo": "ppo", "seed": 3, "run_dir": "runs/x", "progress": False, "plot": True,
                                 "data_files": {"x": "/abs"}, "video_dir": "v", "started_at": "2026",
                                 "total_timesteps": 10, "hidden": [64, 64]}))
    assert settings(cfg) == {"algo": "ppo", "total_timesteps": 10, "hidden": [64, 64]}


def test_curves_whose_shown_settings_read_alike_are_numbered(tmp_path):
    runs = [write_run(tmp_path / f"r{i}", {"algo": "sft", "task": "chain", "model": "m" * 40 + str(i)},
                      [{"global_step": 1, "eval/loss": float(i)}]) for i in range(2)]
    labels = sorted(lines(figure(runs).axes[0]))
    assert labels[0].endswith("[#1] (1 run)") and labels[1].endswith("[#2] (1 run)"), labels
    assert all(np.char.count(label, "model=mmm") == 1 for label in labels)
