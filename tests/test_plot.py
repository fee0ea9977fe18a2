"""Learning curves draw what was logged, and nothing else."""

import json

import numpy as np
import pytest

from omnigym.cli import main
from omnigym.track.plot import figure, plot_runs


def write_run(run_dir, config: dict, rows: list[dict]):
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(config))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def grpo_run(root):
    """A GRPO demo's run: a warm-up stage of 40 steps (validation accuracy every 10), then 60
    GRPO steps with a reward each and held-out accuracy every 20."""
    run = write_run(root / "grpo", {"algo": "grpo", "task": "arithmetic"},
                    [{"global_step": s, "reward/mean": s / 100, **({"eval/accuracy": s / 200} if s % 20 == 1 else {})}
                     for s in range(1, 61)])
    write_run(run / "stages" / "warmup", {"algo": "grpo-warmup"},
              [{"global_step": s, "sft/loss": 1 / s, **({"sft/val_accuracy": s / 100} if s % 10 == 0 else {})}
               for s in range(1, 41)])
    return run


def lines(ax) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {line.get_label(): (np.asarray(line.get_xdata()), np.asarray(line.get_ydata())) for line in ax.lines
            if not line.get_label().startswith("_")}


def test_a_control_curve_starts_at_its_first_episode_not_at_step_0(tmp_path):
    run = write_run(tmp_path / "ppo", {"algo": "ppo", "env_id": "CartPole-v1"},
                    [{"global_step": 500, "charts/episodic_return": 20.0}, {"global_step": 900, "losses/v": 1.0},
                     {"global_step": 1200, "charts/episodic_return": 60.0}])
    (ax,) = figure([run]).axes
    (steps, values), = lines(ax).values()
    assert steps.tolist() == [500, 1200] and values.tolist() == [20.0, 60.0]


def test_a_grpo_curve_shows_its_warm_up_as_a_phase_then_accuracy_and_reward_as_logged(tmp_path):
    run = grpo_run(tmp_path)
    accuracy, reward = figure([run], ("eval/accuracy", "reward/mean")).axes
    drawn = lines(accuracy)
    warm_steps, warm_values = drawn["warmup: sft/val_accuracy, on training-split problems"]
    assert warm_steps.tolist() == [10, 20, 30, 40] and warm_values.tolist() == [0.1, 0.2, 0.3, 0.4]
    steps, values = drawn["grpo arithmetic"]  # the evaluations only, after the warm-up's 40 steps
    assert steps.tolist() == [41, 61, 81] and values.tolist() == [1 / 200, 21 / 200, 41 / 200]
    steps, values = lines(reward)["grpo arithmetic"]
    assert steps.tolist() == list(range(41, 101)) and values[0] == 0.01
    assert len(accuracy.patches) == 1 and accuracy.patches[0].get_x() == 0  # the shaded warm-up phase
    assert "warmup (shaded), then grpo" in reward.get_xlabel()


def test_seeds_are_averaged_only_where_every_seed_logged(tmp_path):
    runs = [write_run(tmp_path / f"s{seed}", {"algo": "ppo", "env_id": "CartPole-v1"},
                      [{"global_step": s, "charts/episodic_return": float(s + seed)} for s in steps])
            for seed, steps in ((0, [100, 300, 500]), (1, [200, 400, 600]))]
    (ax,) = figure(runs).axes
    steps, values = lines(ax)["ppo CartPole-v1 (2 runs)"]
    assert steps.tolist() == [200, 300, 400, 500]  # not from 0, not past the first run's last episode
    assert values.tolist() == [200.5, 300.5, 400.5, 500.5]


def test_plot_of_a_language_run_defaults_to_its_own_metric_and_writes_the_png(tmp_path, capsys):
    run = grpo_run(tmp_path)
    assert main(["plot", str(run), "--out", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").stat().st_size > 10_000
    accuracy, reward = figure([run]).axes
    assert accuracy.get_ylabel() == "eval/accuracy" and reward.get_ylabel() == "reward/mean"


def test_a_metric_no_run_logged_lists_the_ones_they_did_in_one_line(tmp_path, capsys):
    run = grpo_run(tmp_path)
    assert main(["plot", str(run), "--metric", "charts/episodic_return", "--out", str(tmp_path / "p.png")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"omnigym: error: no run among {run} logged 'charts/episodic_return'; they logged: "
                   "eval/accuracy, reward/mean"]
    assert not (tmp_path / "p.png").exists()


def test_plot_help_says_what_metric_is(capsys):
    with pytest.raises(SystemExit):
        main(["plot", "--help"])
    assert "a name from the runs' metrics.jsonl" in " ".join(capsys.readouterr().out.split())


def test_a_finished_runs_curve_png_has_accuracy_and_reward(tmp_path):
    run = grpo_run(tmp_path)
    plot_runs([run], run / "curve.png", metric=("eval/accuracy", "reward/mean"))
    assert (run / "curve.png").stat().st_size > 10_000


def test_a_damaged_stage_log_leaves_the_stage_out_of_the_curve(tmp_path):
    run = grpo_run(tmp_path)
    log = run / "stages" / "warmup" / "metrics.jsonl"
    log.write_text('{"global_step": 1, "sft/lo\n' + log.read_text())  # damaged at its first line
    accuracy, _ = figure([run]).axes
    steps, _ = lines(accuracy)["grpo arithmetic"]
    assert list(lines(accuracy)) == ["grpo arithmetic"] and steps.tolist() == [1, 21, 41]
