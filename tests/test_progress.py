"""The progress line a person reads: no value before it is measured, a finished run at 100%."""

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
