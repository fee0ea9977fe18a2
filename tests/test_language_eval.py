"""``omnigym eval`` on a language run: pass@k (Chen et al. 2021) and maj@k against hand
computations, the decontamination report on planted and disjoint sets, a briefly trained tiny
run evaluated end to end through the CLI, and bad input refused in one line with nothing written."""

import hashlib
import importlib.util
import json
from fractions import Fraction
from math import comb
from pathlib import Path

import pytest

from omnigym.cli import main
from omnigym.evaluation.language import answer_key, contamination, maj_at_k, pass_at_k

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


# -- the estimators ------------------------------------------------------------------------------

@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 1, 2 / 5),            # pass@1 is the share correct
    (5, 2, 2, 1 - 3 / 10),       # 1 - C(3,2)/C(5,2)
    (10, 3, 5, 1 - 21 / 252),    # 1 - C(7,5)/C(10,5)
    (5, 0, 3, 0.0),              # c = 0: never
    (5, 5, 1, 1.0),              # c = n: always
    (4, 1, 4, 1.0),              # k = n: some reply of all n is right
    (4, 0, 4, 0.0),              # k = n, none right
    (6, 4, 3, 1.0),              # n - c < k: every 3-subset holds a right one
    (1, 1, 1, 1.0),
])
def test_pass_at_k_equals_the_hand_computation(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_product_form_is_exact_at_large_n():
    """The product form against exact rationals where factorials run to hundreds of digits."""
    for n, c, k in [(200, 10, 100), (1000, 1, 1), (1000, 999, 500), (500, 37, 20)]:
        exact = 1 - Fraction(comb(n - c, k), comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-9)


def test_pass_at_k_refuses_k_above_n():
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_maj_at_k_hand_case():
    # replies answer 42, 42, 7 and nothing; 42 is right
    keys = [answer_key("42"), answer_key("42.0"), answer_key("7"), answer_key(None)]
    correct = [True, True, False, False]
    assert maj_at_k(keys, correct, 4) == 1.0  # 42 wins 2 votes to 1; the blank does not vote
    assert maj_at_k(keys, correct, 1) == 0.5  # alone, two of four replies are right
    # the 6 pairs: {42,42} {42,7}x2 (a tie: the first met, 42) {42,-}x2 right; {7,-} wrong
    assert maj_at_k(keys, correct, 2) == pytest.approx(5 / 6)
    assert maj_at_k(keys, correct, 3) == 1.0  # every triple holds both 42s or one 42 against 7 first
    assert answer_key("1,000") == answer_key("1000.0") and answer_key("  ") is None


def test_maj_at_1_is_pass_at_1_when_no_reply_gives_an_answer():
    """A reward that scores replies without an answer (--rewards length) made the one reply right for pass@1 and,
    having no vote, wrong for maj@1: 'pass@1 1.000 maj@1 0.000' on the same sample."""
    keys, correct = [None, None, answer_key("3")], [True, False, False]
    assert maj_at_k(keys, correct, 1) == pytest.approx(pass_at_k(3, 1, 1)) == pytest.approx(1 / 3)
    assert maj_at_k(keys, correct, 2) == pytest.approx(1 / 3)  # {-,-}: the first, right; {-,3} {-,3}: 3, wrong


def test_maj_at_k_a_wrong_majority_loses():
    keys = ["a", "b", "b", "b"]
    assert maj_at_k(keys, [True, False, False, False], 4) == 0.0


# -- decontamination -----------------------------------------------------------------------------

TRAIN = [f"Tom has {i} apples and buys {i + 3} more at the market on day {i}, then he gives half of them "
         f"to his sister Mary who lives in town {i}. How many apples does Tom have left?" for i in range(50)]
EVAL = [f"A train leaves station {i} at {i} o'clock travelling at {i * 10} miles per hour towards a city "
        f"that is {i * 7} miles away along the coast. When does it arrive?" for i in range(20)]


def test_decontamination_catches_a_planted_training_prompt():
    planted = EVAL[:7] + [TRAIN[31].upper().replace("?", " ?!")] + EVAL[7:]  # case and punctuation do not hide it
    report = contamination(TRAIN, planted, 13)
    assert report["contaminated"] == 1 and report["contaminated_indices"] == [7]
    assert report["share"] == pytest.approx(1 / 21)
    assert report["examples"][0]["index"] == 7 and len(report["examples"][0]["overlap"].split()) == 13


def test_decontamination_is_quiet_on_disjoint_sets():
    report = contamination(TRAIN, EVAL, 13)
    assert report["contaminated"] == 0 and report["examples"] == [] and report["share"] == 0.0
    assert report["shorter_than_n"] == 0


def test_short_training_prompts_are_found_whole_and_operators_count():
    train = ["What is 88 + 69?", "What is 12 + 30?"]
    evals = ["what is 88+69", "What is 88 * 69?", "What is 12 + 31?", "Question: what is 12 + 30? Answer:",
             TRAIN[0] + " Also, what is 12 + 30?"]  # a template around it, or inside a long item
    report = contamination(train, evals, 13)
    assert report["contaminated_indices"] == [0, 3, 4] and report["shorter_than_n"] == 4


@pytest.mark.skipif(not (SHARED / "gsm8k" / "test.jsonl").is_file(),
                    reason="the shared GSM8K (../shared/data/gsm8k) is absent: it is not part of the package")
def test_decontamination_on_gsm8k_catches_a_planted_question():
    from omnigym.tasks.datasets import load_gsm8k

    train = [r["question"] for r in load_gsm8k(SHARED / "gsm8k" / "train.jsonl")]
    test = [r["question"] for r in load_gsm8k(SHARED / "gsm8k" / "test.jsonl")][:200]
    clean = contamination(train, test, 13)
    planted = contamination(train, test[:50] + [train[1234]] + test[50:], 13)
    assert 50 in planted["contaminated_indices"]
    assert planted["contaminated"] == clean["contaminated"] + 1


# -- end to end ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """The tiny model after a few warm-up and GRPO steps (as test_grpo's CLI test trains it)."""
    run_dir = tmp_path_factory.mktemp("lm") / "run"
    assert main(["train", "grpo", "--run-dir", str(run_dir), "--sft-steps", "10", "--sft-target-accuracy", "1.1",
                 "--steps", "2", "--prompts-per-step", "2", "--group-size", "2", "--eval-size", "8",
                 "--no-progress", "--no-plot", "--no-tensorboard"]) == 0
    return run_dir


def snapshot(root: Path, skip: str = "evals") -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.relative_to(root).parts[0] != skip}


def test_a_trained_tiny_run_evaluated_through_the_cli(lm_run, capsys):
    before = snapshot(lm_run)
    assert main(["eval", str(lm_run), "--n", "3", "--k", "1,3", "--prompts", "4"]) == 0
    out = capsys.readouterr().out
    assert "decontamination (13-gram word overlap with 20000 training prompts of --task arithmetic): " \
           "0 of 4 eval items contaminated" in out  # arithmetic's splits are disjoint by construction
    assert "pass@1 " in out and "maj@3 " in out
    written = lm_run / "evals" / "arithmetic_held-out-001.json"
    result = json.loads(written.read_text())
    assert result["items"] == 4 and all(len(r["replies"]) == 3 for r in result["replies"])
    for k in (1, 3):  # the printed figures are the estimators on the stored verdicts
        expected = sum(pass_at_k(3, sum(r["correct"]), k) for r in result["replies"]) / 4
        assert result["scores"][f"pass@{k}"] == pytest.approx(expected)
    # a second eval gets its own file; the run's files and the first eval stay as they were
    first = written.read_bytes()
    assert main(["eval", str(lm_run), "--n", "2", "--prompts", "2"]) == 0
    assert (lm_run / "evals" / "arithmetic_held-out-002.json").is_file() and written.read_bytes() == first
    assert snapshot(lm_run) == before


def test_the_cli_report_catches_training_prompts_planted_in_the_eval_set(lm_run, tmp_path, capsys):
    from omnigym.envs.task_spec import load_task

    train = load_task("arithmetic", seed=1, eval_size=8).train[:12]  # the run's seed and --eval-size
    planted = tmp_path / "planted.jsonl"
    planted.write_text("".join(json.dumps({"question": e["question"], "answer": e["answer"]}) + "\n" for e in train))
    assert main(["eval", str(lm_run), "--task", str(planted), "--n", "1", "--prompts", "3"]) == 0
    out = capsys.readouterr().out
    assert "3 of 3 eval items contaminated (100.0%)" in out and "  item 0: shares 'what is" in out


@pytest.mark.skipif(not (SHARED / "humaneval" / "HumanEval.jsonl.gz").is_file(),
                    reason="the shared HumanEval (../shared/data/humaneval) is absent: it is not part of the package")
def test_humaneval_is_scored_in_the_sandbox(lm_run, capsys):
    """The eval set's verdict passes the canonical solutions and fails a hostile reply (scored in
    the sandbox), and the tiny run is evaluated on it through the CLI (maj@k: n/a for code)."""
    from omnigym.evaluation.language import LanguageEvalConfig, shared_rows
    from omnigym.generators.text_tasks import task_env
    from omnigym.tasks import Task

    rows, env = shared_rows("humaneval", str(SHARED))
    _, correct = task_env(LanguageEvalConfig(model="tiny"), Task(rows, rows, env))
    good = [f"```python\n{r['prompt']}{r['canonical_solution']}```" for r in rows[:3]]
    hostile = f"```python\nimport os\nos._exit(0)\n```"
    scores = correct(good + [hostile], rows[:3] + rows[:1]).tolist()
    assert scores == [1.0, 1.0, 1.0, 0.0]
    assert main(["eval", str(lm_run), "--task", "humaneval", "--data-dir", str(SHARED), "--n", "2",
                 "--prompts", "2"]) == 0
    assert "maj@2 n/a (code)" in capsys.readouterr().out


@pytest.mark.skipif(not (SHARED / "humaneval" / "HumanEval.jsonl.gz").is_file(),
                    reason="the shared HumanEval (../shared/data/humaneval) is absent: it is not part of the package")
def test_a_shared_set_is_scored_by_its_own_reward_not_the_runs_rewards():
    """A run trained with --rewards format:1.0 and evaluated on HumanEval: before, its format
    reward decided correctness there too (a reply in <answer> tags passed every task)."""
    from omnigym.evaluation.language import LanguageEvalConfig, eval_task
    from omnigym.generators.text_tasks import task_env

    cfg = LanguageEvalConfig(model="tiny", rewards="format:1.0")
    rows, task = eval_task(cfg, "humaneval", str(SHARED))
    _, correct = task_env(cfg, task)
    good = f"```python\n{rows[0]['prompt']}{rows[0]['canonical_solution']}```"
    assert correct([good, "<answer>1</answer>"], rows[:1] * 2).tolist() == [1.0, 0.0]


def test_a_task_file_is_split_with_the_runs_seed_not_the_evals(lm_run, tmp_path, capsys):
    """Before, the held-out split was drawn with --seed (12345): other items than the run held out,
    most of them in its training split."""
    from omnigym.envs.task_spec import load_task

    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(40)))
    heldout = load_task(str(data), 1, 8).heldout  # the run's --seed 1 and --eval-size 8
    before = set((lm_run / "evals").glob("*.json"))
    assert main(["eval", str(lm_run), "--task", str(data), "--n", "1"]) == 0
    [written] = set((lm_run / "evals").glob("*.json")) - before
    result = json.loads(written.read_text())
    assert [r["prompt"] for r in result["replies"]] == [e["question"] for e in heldout]


def test_a_multi_turn_run_is_refused_naming_its_env(lm_run, tmp_path, capsys):
    """Before, a --env tictactoe run was refused as '--task arithmetic is a multi-turn env'."""
    import shutil

    run = tmp_path / "game"
    shutil.copytree(lm_run, run, ignore=shutil.ignore_patterns("evals"))
    values = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**values, "env": "tictactoe", "max_turns": 5}))
    assert main(["eval", str(run), "--n", "1", "--prompts", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the run's --env tictactoe is a multi-turn env" in err[0], err
    assert not (run / "evals").exists() or not list((run / "evals").iterdir())


def test_maj_at_k_is_na_on_a_task_without_a_reference_answer(lm_run, capsys):
    """ifeval's examples have no answer to vote on; before, maj@k printed 0.000 whatever the replies
    (an item all of whose replies passed counted as wrong)."""
    assert main(["eval", str(lm_run), "--task", "ifeval", "--n", "2", "--prompts", "3"]) == 0
    out = capsys.readouterr().out
    assert "maj@1 n/a (no reference answer)" in out and "maj@2 n/a (no reference answer)" in out
    result = json.loads(sorted((lm_run / "evals").glob("ifeval*.json"))[-1].read_text())
    assert result["scores"]["maj@2"] is None and 0.0 <= result["scores"]["pass@2"] <= 1.0


# -- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--n", "2", "--k", "3"], "--k 3 must be between 1 and --n 2"),
    (["--k", "x"], "--k takes whole numbers"),
    (["--task", "arithmetik"], "unknown --task 'arithmetik'"),
    (["--task", "gsm8k", "--data-dir", "/nonexistent"], "--task gsm8k reads /nonexistent/gsm8k/test.jsonl"),
    (["--video"], "--video is for control runs"),
    (["--episodes", "3"], "--episodes is for control runs"),  # was ignored: a full default eval ran
    (["--n", "2", "--temperature", "-1"], "--temperature must be positive, got -1.0"),  # was sampled and written
    (["--n", "2", "--max-new-tokens", "0"], "--max-new-tokens must be positive, got 0"),
    (["--lm-eval", "x", "--n", "2"], "--lm-eval runs lm-eval's own tasks"),
])
def test_bad_input_is_one_line_and_writes_nothing(lm_run, capsys, argv, message):
    before = snapshot(lm_run, skip="")
    assert main(["eval", str(lm_run), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert snapshot(lm_run, skip="") == before


def test_a_folder_that_is_not_a_run_is_refused(tmp_path, capsys):
    assert main(["eval", str(tmp_path), "--n", "2"]) == 2
    assert capsys.readouterr().err.strip() == f"omnigym: error: {tmp_path} is not a run directory (no config.json)"
    assert list(tmp_path.iterdir()) == []


def test_language_flags_on_a_control_run_are_refused(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"algo": "ppo", "env_id": "CartPole-v1"}))
    assert main(["eval", str(tmp_path), "--n", "4"]) == 2
    assert f"--n is for language runs scored by pass@k; {tmp_path} is a ppo run" in capsys.readouterr().err
    # text_reinforce's runs were called control runs
    (tmp_path / "config.json").write_text(json.dumps({"algo": "text_reinforce", "model": "lstm"}))
    assert main(["eval", str(tmp_path), "--n", "4"]) == 2
    assert f"{tmp_path} is a text_reinforce run" in capsys.readouterr().err


def test_lm_eval_without_the_extra_is_one_line(lm_run, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lm_eval" else real(name, *a))
    before = snapshot(lm_run, skip="")
    assert main(["eval", str(lm_run), "--lm-eval", "arc_easy"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["omnigym: error: --lm-eval needs the [eval] extra (lm-eval): pip install 'omnigym[eval]'"]
    assert snapshot(lm_run, skip="") == before


LOCAL_TASK = """task: local_sums
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}} Answer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
"""


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval absent: the [eval] extra")
def test_lm_eval_runs_a_local_task_on_the_run_model(lm_run, tmp_path, capsys):
    """lm-eval's harness on the run's model/ folder, offline, for a task whose data is a local
    file; one of its items is a training prompt, which the report before it names."""
    from omnigym.envs.task_spec import load_task

    planted = load_task("arithmetic", seed=1, eval_size=8).train[0]["question"]
    rows = [{"question": q, "choices": ["1", "2", "3"], "label": 0}
            for q in ["How many legs has a bird?", planted, "How many heads has a cat?"]]
    (tmp_path / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "sums.yaml").write_text(LOCAL_TASK.format(data=tmp_path / "sums.jsonl"))
    before = snapshot(lm_run)
    assert main(["eval", str(lm_run), "--lm-eval", "local_sums", "--lm-eval-include", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1 of 3 eval items contaminated" in out and "  item 1: shares" in out
    written = sorted((lm_run / "evals").glob("lm-eval-*.json"))[-1]
    result = json.loads(written.read_text())["lm_eval"]
    assert 0.0 <= result["results"]["local_sums"]["acc,none"] <= 1.0
    assert snapshot(lm_run) == before



def test_training_prompts_of_builtin_sft_and_dpo_data_are_read_not_opened_as_files(tmp_path):
    # sft's "arithmetic" and dpo's "gold" are names: before, `omnigym eval` on such a run stopped
    # with "no such file: arithmetic" (or "gold") while reading the prompts for decontamination
    from omnigym.evaluation.language import training_prompts
    from omnigym.tasks.sft_data import read_sft_rows

    texts, what = training_prompts({"data": "arithmetic", "split": "train", "seed": 3}, str(tmp_path))
    expected = [row["prompt"][0]["content"] for _, row in read_sft_rows("arithmetic", "train", 3)]
    assert texts == expected and what == "--data arithmetic"
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "pairs.jsonl").write_text('{"prompt": "What is 2 + 2?", "chosen": "4", "rejected": "5"}\n')
    texts, what = training_prompts({"data": "gold", "split": "train", "seed": 1}, str(tmp_path))
    assert texts == ["What is 2 + 2?"] and what == "--data gold"


def test_a_run_training_now_is_named_as_in_use(lm_run, tmp_path, capsys):
    """A first run still training has no model/: eval said "finish it with: omnigym train grpo --resume
    RUN", which the run's lock then refused."""
    import shutil
    import subprocess
    import sys

    run = tmp_path / "run"
    shutil.copytree(lm_run, run)
    shutil.rmtree(run / "model")  # as a first run looks while it trains
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from omnigym.track.lock import RunLock; lock = RunLock(Path(sys.argv[1])); "
                               "lock.acquire(); print('held', flush=True); time.sleep(60)", str(run)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["eval", str(run)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{run} is in use by another omnigym process (pid {holder.pid}" in err[0], err
    finally:
        holder.kill()
        holder.wait()
