"""``omnigym sample``: best-of-N datasets that ``train sft`` reads, the best-of-N curve and its
estimators, and bad input refused in one line with nothing written."""

import hashlib
import itertools
import json
import random

import pytest

from omnigym.cli import main
from omnigym.evaluation.best_of_n import best_of_k, curve_points, pass_at_k
from omnigym.rewards import REWARDS, per_sample

# The untrained tiny model writes random characters: 48 tokens give most prompts a reply that ends.
SMALL = ["--n", "6", "--prompts", "8", "--max-new-tokens", "48", "--no-progress"]


def digits(completion: str, example: dict) -> float:
    """A test reranker: how many digits the reply holds."""
    return float(sum(ch.isdigit() for ch in completion))


def has_digit(completion: str, example: dict) -> float:
    """A test correctness: the reply holds a digit (about half the tiny model's random replies do)."""
    return float(any(ch.isdigit() for ch in completion))


@pytest.fixture
def test_rewards(monkeypatch):
    monkeypatch.setitem(REWARDS, "bon_digits", per_sample(digits))
    monkeypatch.setitem(REWARDS, "bon_has_digit", per_sample(has_digit))


def read_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- the estimators ---------------------------------------------------------------------------

def by_enumeration(scores, correct, k):
    """Best-of-k and pass@k as the mean over every k-subset, the best of a subset its highest
    score (the earliest sample on a tie)."""
    subsets = list(itertools.combinations(range(len(scores)), k))
    best = [correct[max(s, key=lambda i: (scores[i], -i))] for s in subsets]
    return sum(best) / len(subsets), sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


def test_the_estimators_equal_the_mean_over_all_subsets():
    rng = random.Random(0)
    for _ in range(30):
        n = rng.randint(1, 7)
        scores = [rng.choice([0.0, 0.5, 1.0, 1.1]) for _ in range(n)]  # ties on purpose
        correct = [rng.random() < 0.4 for _ in range(n)]
        for k in range(1, n + 1):
            best, oracle = by_enumeration(scores, correct, k)
            assert best_of_k(scores, correct, k) == pytest.approx(best)
            assert pass_at_k(correct, k) == pytest.approx(oracle)


def test_pass_at_n_never_falls_with_n_and_bounds_any_reranker():
    rng = random.Random(1)
    for _ in range(30):
        correct = [rng.random() < 0.2 for _ in range(16)]
        scores = [rng.random() for _ in range(16)]
        oracle = [pass_at_k(correct, k) for k in range(1, 17)]
        assert oracle == sorted(oracle)
        assert oracle[0] == pytest.approx(sum(correct) / 16) and oracle[-1] == float(any(correct))
        assert all(best_of_k(scores, correct, k) <= oracle[k - 1] + 1e-12 for k in range(1, 17))
        # reranked by correctness itself, best-of-N is the oracle
        assert [best_of_k([float(c) for c in correct], correct, k) for k in range(1, 17)] == pytest.approx(oracle)


def test_curve_points():
    assert curve_points(16) == [1, 2, 4, 8, 16]
    assert curve_points(6) == [1, 2, 4, 6]
    assert curve_points(1) == [1]


# -- the dataset -------------------------------------------------------------------------------

def test_each_row_is_the_best_scored_reply_and_train_sft_reads_the_file(tmp_path, test_rewards):
    out = tmp_path / "best.jsonl"
    assert main(["sample", "tiny", *SMALL, "--rewards", "bon_digits:1.0", "--out", str(out)]) == 0
    rows = read_rows(out)
    assert len(rows) >= 3
    for row in rows:
        record = row["best_of_n"]
        assert len(record["replies"]) == len(record["scores"]) == 6
        assert record["scores"] == [digits(r, {}) for r in record["replies"]]  # the registered reward's scores
        eligible = [i for i in range(6) if record["finished"][i] and record["replies"][i].strip()]
        top = max(record["scores"][i] for i in eligible)
        assert record["chosen"] == min(i for i in eligible if record["scores"][i] == top)  # tie: the earlier
        assert row["completion"] == [{"role": "assistant", "content": record["replies"][record["chosen"]]}]
        assert row["prompt"] == [{"role": "user", "content": record["example"]["question"]}]
    # the round trip: train sft learns from the file as written
    run = tmp_path / "sft"
    assert main(["train", "sft", "--model", "tiny", "--data", str(out), "--eval-size", "1", "--steps", "2",
                 "--run-dir", str(run), "--no-progress", "--no-plot", "--no-tensorboard"]) == 0
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert logged[0]["data/train_examples"] == len(rows) - 1 and (run / "model" / "config.json").is_file()


def test_min_reward_keeps_only_prompts_whose_best_reply_reaches_it(tmp_path, test_rewards):
    everything, kept = tmp_path / "all.jsonl", tmp_path / "kept.jsonl"
    flags = ["sample", "tiny", *SMALL, "--rewards", "bon_digits:1.0"]
    assert main([*flags, "--out", str(everything)]) == 0
    assert main([*flags, "--out", str(kept), "--min-reward", "2"]) == 0
    best = [row["best_of_n"]["score"] for row in read_rows(everything)]
    assert 0 < len(read_rows(kept)) < len(best)  # the seed's replies have some prompts either side of 2
    assert [row for row in read_rows(everything) if row["best_of_n"]["score"] >= 2] == read_rows(kept)


def test_same_seed_same_file_and_another_seed_another(tmp_path):
    paths = [tmp_path / name for name in ("a.jsonl", "b.jsonl", "c.jsonl")]
    for path, seed in zip(paths, ("3", "3", "4")):
        assert main(["sample", "tiny", *SMALL, "--seed", seed, "--out", str(path)]) == 0
    digest = [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    assert digest[0] == digest[1] != digest[2]


def test_overwrite_replaces_the_file(tmp_path):
    out = tmp_path / "best.jsonl"
    out.write_text("old\n")
    assert main(["sample", "tiny", *SMALL, "--out", str(out), "--overwrite"]) == 0
    assert "best_of_n" in read_rows(out)[0]


def test_overwrite_never_replaces_a_runs_own_file(tmp_path, capsys):
    """sample --out RUN/config.json --overwrite replaced a run's config (and RUN/metrics.jsonl its log)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"algo": "ppo"}')
    (run / "metrics.jsonl").write_text('{"global_step": 1}\n')
    for name in ("config.json", "metrics.jsonl"):
        assert main(["sample", "tiny", *SMALL, "--out", str(run / name), "--overwrite"]) == 2
        assert f"own {name}; sample never replaces a run's files" in capsys.readouterr().err
    assert (run / "config.json").read_text() == '{"algo": "ppo"}'


# -- the curve ---------------------------------------------------------------------------------

@pytest.mark.parametrize("weight", ["1.0", "-1.0"])
def test_the_curve_is_the_estimators_on_the_samples(tmp_path, test_rewards, capsys, weight):
    """Reranked by digit count the pick is correct whenever a reply is (best-of-N = pass@N); by
    its negative it avoids them, and best-of-N falls with N while the oracle rises."""
    out = tmp_path / "curve.json"
    assert main(["sample", "tiny", *SMALL, "--n", "8", "--curve", "--rewards", f"bon_digits:{weight}",
                 "--accuracy-reward", "bon_has_digit", "--out", str(out)]) == 0
    curve = json.loads(out.read_text())
    assert [row["n"] for row in curve["curve"]] == [1, 2, 4, 8] and curve["prompts"] == 8
    groups = [(g["scores"], g["correct"]) for g in curve["groups"]]
    for row in curve["curve"]:
        assert row["pass_at_n"] == pytest.approx(sum(pass_at_k(c, row["n"]) for _, c in groups) / 8)
        assert row["best_of_n"] == pytest.approx(sum(best_of_k(s, c, row["n"]) for s, c in groups) / 8)
    oracle = [row["pass_at_n"] for row in curve["curve"]]
    reranked = [row["best_of_n"] for row in curve["curve"]]
    assert oracle == sorted(oracle) and oracle[0] < oracle[-1]
    assert reranked == pytest.approx(oracle) if weight == "1.0" else reranked == sorted(reranked, reverse=True)
    assert reranked[0] == pytest.approx(oracle[0])  # one reply: nothing to choose
    assert "best-of-N" in capsys.readouterr().out


# -- bad input ---------------------------------------------------------------------------------

def snapshot(root):
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else "dir" for p in root.rglob("*")}


@pytest.mark.parametrize("argv, message", [
    (["sample", "tiny", "--rewards", "nope:1.0"], "unknown reward 'nope'"),
    (["sample", "tiny", "--accuracy-reward", "nope"], "unknown reward 'nope'"),
    (["sample", "tiny", "--n", "0"], "--n must be 1 to 1,024 replies a prompt, got 0"),
    (["sample", "tiny", "--n", "100000000"], "--n must be 1 to 1,024 replies a prompt, got 100000000"),  # ran until killed
    (["sample", "tiny", "--prompts", "0"], "--prompts must be at least 1, got 0"),
    (["sample", "tiny", "--temperature", "0"], "--temperature must be positive, got 0"),
    (["sample", "tiny", "--curve", "--prompts", "600"], "--prompts 600 is more than the 500 held-out problems"),
    (["sample", "tiny", "--curve", "--min-reward", "1"], "--min-reward drops dataset rows"),
    (["sample", "tiny", "--min-reward", "nan"], "--min-reward must be a finite number, got nan"),  # kept nothing
    (["sample", "/nonexistent/model"], "/nonexistent/model: no such folder"),
    (["sample", "./ppo-run"], "a ppo run writes no model folder"),  # a control policy, not a language model
    (["sample", "tiny", "--out", "taken.jsonl"], "taken.jsonl already exists; give another --out, or --overwrite"),
    (["sample", "tiny", "--task", "arithmetic-tools-v0"], "--task arithmetic-tools-v0 is a multi-turn env"),
    (["sample", "tiny", *SMALL, "--min-reward", "5"],
     "no prompt kept a reply"),
    (["sample"], "the following arguments are required: model"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken.jsonl").write_text("mine\n")
    (tmp_path / "ppo-run").mkdir()
    (tmp_path / "ppo-run" / "config.json").write_text(json.dumps({"algo": "ppo", "env_id": "CartPole-v1"}))
    before = snapshot(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("omnigym: error: ") and message in err[0], err
    assert snapshot(tmp_path) == before


def test_sample_chooses_the_task_as_grpo_does_without_importing_an_algorithm():
    """``sample`` and ``train grpo`` choose the task, env and generator through one module
    (generators/text_tasks.py), from flags with the same defaults; ``sample`` is not built on an
    algorithm file."""
    import ast
    import dataclasses
    from pathlib import Path

    from omnigym.algos.lm.grpo import GRPOConfig
    from omnigym.generators.text_tasks import TextTaskConfig
    from omnigym.rejection_sampling import SampleConfig

    source = Path(__file__).parents[1] / "src" / "omnigym" / "rejection_sampling.py"
    imported = {node.module for node in ast.walk(ast.parse(source.read_text())) if isinstance(node, ast.ImportFrom)}
    assert "omnigym.generators.text_tasks" in imported
    assert not [name for name in imported if name and name.startswith("omnigym.algos")]
    shared = [f.name for f in dataclasses.fields(TextTaskConfig)]
    assert {"task", "env", "rewards", "system_prompt", "max_new_tokens", "temperature", "eval_size"} <= set(shared)
    grpo, sample = GRPOConfig(), SampleConfig()
    assert [getattr(grpo, name) for name in shared] == [getattr(sample, name) for name in shared]


def test_sample_of_a_language_run_still_training_names_its_process(tmp_path, capsys):
    """A running sft run has no model/ yet: sample told the user to --resume it, which the run's lock refused."""
    import json

    from omnigym.track.lock import RunLock

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"algo": "sft", "training_backend": "local"}))
    holder = RunLock(run)
    holder.acquire()
    try:
        assert main(["sample", str(run), *SMALL, "--out", str(tmp_path / "s.jsonl")]) == 2
        err = capsys.readouterr().err
        assert "is in use by another omnigym process" in err and "--resume" not in err
    finally:
        holder.release()
    assert main(["sample", str(run), *SMALL, "--out", str(tmp_path / "s.jsonl")]) == 2  # stopped: finish it
    assert "finish it with: omnigym train sft --resume" in capsys.readouterr().err
