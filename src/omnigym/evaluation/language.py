"""``omnigym eval RUN`` for a language run: ``--n`` sampled replies per prompt, scored as pass@k
and maj@k, with a decontamination report against the run's own training prompts.

- **pass@k**: the unbiased estimator of Chen et al. (2021), ``1 - C(n-c, k) / C(n, k)`` for ``c``
  correct replies of ``n``, computed as their product form ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``
  (no factorials, so no overflow or cancellation at large ``n``); the mean over prompts.
- **maj@k**: among ``k`` replies, the answer most of them extract (``rewards.text.extract_answer``,
  numbers compared as numbers); a tie goes to the answer met first; replies with no answer do not
  vote, and where none votes the first reply is submitted as it is (so maj@1 is pass@1). The expectation over every ``k``-subset of the
  ``n`` replies when there are at most ``MAJ_SUBSETS`` of them, else the mean over that many
  subsets drawn with the eval's seed. Code tasks (HumanEval) and tasks without a reference answer
  (ifeval) have no answer to vote on: n/a.
- **decontamination**: ``contamination`` below.
"""

from __future__ import annotations

import itertools
import random
import re
from collections import Counter
from dataclasses import dataclass
from math import comb
from pathlib import Path
from typing import Sequence

from omnigym.config import LanguageModelConfig
from omnigym.errors import OmnigymError, require
from omnigym.generators.text_tasks import TextTaskConfig
from omnigym.runtime.episodes import EpisodeScheduleConfig

MAJ_SUBSETS = 2000
"""maj@k is exact over all k-subsets up to this many, else the mean over this many drawn"""

NGRAM = 13
"""the default n of the decontamination check (GPT-3's upper bound, Brown et al. 2020, App. C)"""

SHARED_SETS = (("gsm8k", "gsm8k/test.jsonl"), ("humaneval", "humaneval/HumanEval.jsonl.gz"))
"""``--task`` names that read a whole file of the shared data folder (``--data-dir``) as the eval set"""

EXAMPLES_SHOWN = 3


# -- the estimators ------------------------------------------------------------------------------

def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (2021): the chance that some reply of ``k`` drawn without replacement from
    ``n`` replies, ``c`` of them correct, is correct."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a correct reply
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def answer_key(answer: str | None) -> str | None:
    """What a reply votes for: its extracted answer, a number as a number (``1,000`` = ``1000.0``)."""
    if answer is None or not answer.strip():
        return None
    text = answer.strip().replace(",", "").replace("$", "")
    try:
        return repr(float(text))
    except ValueError:
        return " ".join(text.split())


def majority_correct(keys: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """Whether the answer most of these replies give is right (a tie: the one met first; a reply
    with that answer carries its verdict)."""
    votes = Counter(key for key in keys if key is not None)
    if not votes:  # no reply gives an answer: the first is submitted as it is, so maj@1 is pass@1 (a reward that
        return bool(correct[0])  # scores replies without an answer made the one reply right for one and wrong for the other)
    winner = max(votes, key=lambda key: (votes[key], -keys.index(key)))
    return bool(correct[keys.index(winner)])


def maj_at_k(keys: Sequence[str | None], correct: Sequence[bool], k: int, seed: int = 0) -> float:
    """maj@k of one prompt's ``n`` replies (their answer keys and verdicts); see the module."""
    n = len(keys)
    if not 1 <= k <= n or len(correct) != n:
        raise ValueError(f"maj@k needs 1 <= k <= n and one verdict per reply, got k={k}, n={n}")
    if comb(n, k) <= MAJ_SUBSETS:
        subsets = itertools.combinations(range(n), k)
        total = comb(n, k)
    else:
        rng = random.Random(seed)
        subsets = (sorted(rng.sample(range(n), k)) for _ in range(MAJ_SUBSETS))
        total = MAJ_SUBSETS
    return sum(majority_correct([keys[i] for i in s], [correct[i] for i in s]) for s in subsets) / total


# -- decontamination -----------------------------------------------------------------------------

WORD = re.compile(r"[a-z0-9]+|[-+*/=^<>%]")


def words(text: str) -> list[str]:
    """Lower-cased words, punctuation and whitespace dropped (GPT-3's normalization); arithmetic
    operators are kept as words, so that ``88 + 69`` and ``88 * 69`` stay different problems."""
    return WORD.findall(text.lower())


def ngrams(tokens: list[str], n: int) -> set[str]:
    return {" ".join(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


def prompt_text(example: dict) -> str:
    """What a prompt says: a code task's own prompt (the instruction wrapped around it is the same
    for every item and would match everywhere), else the question."""
    text = example.get("prompt") if isinstance(example.get("prompt"), str) else example.get("question", "")
    return str(text)


def contamination(train_texts: Sequence[str], eval_texts: Sequence[str], n: int = NGRAM) -> dict:
    """Which eval items share a word ``n``-gram with some training prompt, or hold a whole training
    prompt that is shorter than ``n`` words (it has no ``n``-gram: "What is 88 + 69?" copied into
    an eval item, a prompt template around it or not). Returns counts, the share, the first hits."""
    require(n >= 1, f"--ngram must be at least 1, got {n}")
    seen: set[str] = set()
    whole: set[str] = set()
    for text in train_texts:
        tokens = words(text)
        seen |= ngrams(tokens, n)
        if 0 < len(tokens) < n:
            whole.add(" ".join(tokens))
    lengths = sorted({len(w.split()) for w in whole}, reverse=True)
    hits, short = [], 0
    for index, text in enumerate(eval_texts):
        tokens = words(text)
        short += len(tokens) < n
        shared = next((g for g in (" ".join(tokens[i:i + n]) for i in range(len(tokens) - n + 1)) if g in seen), None)
        if shared is None:
            shared = next((g for size in lengths for g in (" ".join(tokens[i:i + size])
                                                             for i in range(len(tokens) - size + 1)) if g in whole),
                          None)
        if shared is not None:
            hits.append({"index": index, "overlap": shared, "text": text})
    total = len(eval_texts)
    return {"ngram": n, "train_prompts": len(train_texts), "eval_items": total, "contaminated": len(hits),
            "share": len(hits) / total if total else 0.0, "shorter_than_n": short,
            "short_train_prompts": len(whole), "examples": hits[:EXAMPLES_SHOWN],
            "contaminated_indices": [h["index"] for h in hits]}


def contamination_lines(report: dict, what: str) -> list[str]:
    lines = [f"decontamination ({report['ngram']}-gram word overlap with {report['train_prompts']} training "
             f"prompts of {what}): {report['contaminated']} of {report['eval_items']} eval items contaminated "
             f"({report['share']:.1%}); rule: a shared {report['ngram']}-word sequence, or a whole training "
             f"prompt shorter than that inside the item ({report['short_train_prompts']} such prompts)"]
    for hit in report["examples"]:
        lines.append(f"  item {hit['index']}: shares {hit['overlap'][:80]!r}  ({hit['text'][:80]!r})")
    return lines


# -- the eval set and the samples ----------------------------------------------------------------

@dataclass
class LanguageEvalConfig(TextTaskConfig, EpisodeScheduleConfig, LanguageModelConfig):
    """The run's own task and sampling flags, read back from its config.json."""


def run_config(values: dict, run_dir: str) -> LanguageEvalConfig:
    """The flags of the run (``values``: its config.json) that choose its task and sample replies;
    the model is the run's own ``model/`` folder."""
    from dataclasses import fields

    names = {f.name for f in fields(LanguageEvalConfig)}
    cfg = LanguageEvalConfig(**{k: v for k, v in values.items() if k in names})
    cfg.model = run_dir
    return cfg


def shared_rows(name: str, data_dir: str) -> tuple[list[dict], object | None]:
    """The shared GSM8K test split or HumanEval, whole, and the env HumanEval comes with."""
    relative = dict(SHARED_SETS)[name]
    path = Path(data_dir) / relative
    require(path.is_file(), f"--task {name} reads {path}, which is not there; give --data-dir the folder that "
                            f"holds {relative}")
    from omnigym.tasks.datasets import load_gsm8k, load_humaneval

    if name == "gsm8k":
        return load_gsm8k(path), None
    from omnigym.envs.text import TextEnv
    from omnigym.rewards import WeightedSum

    rows = load_humaneval(path)
    return rows, TextEnv(rows, WeightedSum({"code": 1.0}))


IMPOSSIBLE = "impossible:"
"""--task impossible:SPEC: SPEC's code tasks with tests that contradict their spec (tasks/impossible.py)"""


def impossible_set(examples: list[dict], limit: int | None):
    """``(examples, Task)`` of the one-off impossible variants of code ``examples``, the first
    ``limit`` that the reference solution (HumanEval's ``canonical_solution``, where given) fails:
    a variant it passes still agrees with its spec and is dropped."""
    from omnigym.envs.text import TextEnv
    from omnigym.rewards import WeightedSum
    from omnigym.rewards.code import verdict
    from omnigym.rewards.sandbox import Sandbox
    from omnigym.tasks import Task
    from omnigym.tasks.impossible import one_off

    require(any("entry_point" in e or "tests" in e for e in examples),
            "--task impossible:SPEC takes a code task (humaneval, humaneval:FILE, a jsonl with tests); "
            "this one has no tests to contradict")
    sandbox, variants = Sandbox(), []
    for example in examples:
        variant = one_off(example)
        if variant is None:
            continue
        reference = example.get("canonical_solution")
        found = verdict(reference, variant, sandbox) if reference else None
        if found and found.total and found.passed == found.total:
            continue
        variants.append(variant)
        if limit and len(variants) >= limit:
            break
    require(variants, "--task impossible:SPEC: no test of these tasks compares a result with a literal, so none "
                      "could be made impossible")
    return variants, Task(variants, variants, TextEnv(variants, WeightedSum({"code": 1.0})))


def eval_task(cfg: LanguageEvalConfig, task: str | None, data_dir: str, limit: int | None = None):
    """``(eval examples, Task)``: the run's task's held-out split (``task`` None), another task
    spec's held-out split (the run's seed and --eval-size), a shared set whole, or the impossible
    variants of one of those (``impossible:SPEC``, at most ``limit``)."""
    from omnigym.generators.text_tasks import text_task
    from omnigym.tasks import Task

    if task is not None and task.startswith(IMPOSSIBLE):
        inner = task[len(IMPOSSIBLE):]
        # a variant of a variant would change a second test: every reply fails one or the other
        require(not inner.startswith(IMPOSSIBLE), f"--task {task}: impossible: is given once, before a code task "
                                                  "(impossible:humaneval)")
        examples, _ = eval_task(cfg, inner or None, data_dir)
        cfg.rewards, cfg.accuracy_reward = None, None  # the code reward decides, whatever the run trained on
        return impossible_set(examples, limit)
    if task in dict(SHARED_SETS):
        rows, env = shared_rows(task, data_dir)
        cfg.rewards, cfg.accuracy_reward = None, None  # the set's own reward decides, not the run's --rewards
        return rows, Task(rows, rows, env)
    if task is not None:
        cfg.task, cfg.rewards, cfg.accuracy_reward = task, None, None  # that task's own reward decides
    loaded, _ = text_task(cfg)
    return loaded.heldout, loaded


def training_prompts(values: dict, run_dir: str) -> tuple[list[str], str]:
    """The prompts the run trained on, and what they are: its task's training split (the seed
    and --eval-size it ran with), or its --data file's prompts."""
    from omnigym.generators.text_tasks import text_task

    if values.get("task") and not values.get("data"):
        cfg = run_config(values, run_dir)
        return [prompt_text(e) for e in text_task(cfg)[0].train], f"--task {values['task']}"
    if values.get("data"):
        from omnigym.tasks.sft_data import read_sft_rows

        # the trainers' built-in sets are names, not files: sft's "arithmetic" and "words" are made
        # from its seed, and the "gold" demo's pairs were written to the run's stages/
        source = values["data"]
        if source == "gold":
            source = str(Path(run_dir) / "stages" / "pairs.jsonl")
        rows = [row for _, row in read_sft_rows(source, values.get("split") or "train", values.get("seed") or 0)]
        return [prompt_text(r) if not isinstance(r.get("prompt"), list) else
                " ".join(str(m.get("content", "")) for m in r["prompt"]) for r in rows], f"--data {values['data']}"
    raise OmnigymError(f"{run_dir}: its config.json names neither a --task nor a --data file, so its training "
                       "prompts are unknown and no decontamination report can be made")


def sample_replies(judge, tokenizer, examples: list[dict], n: int, per_call: int = 64) -> list[dict]:
    """Per example its ``n`` replies' texts and verdicts: ``judge`` is a generator whose env is
    scored by the correctness reward, and a reply is correct when that scores >= 1 (as held-out
    accuracy counts it), each reply scored once (HumanEval's tests run once per reply)."""
    groups = []
    for begin in range(0, len(examples), per_call):
        batch = examples[begin:begin + per_call]
        items = judge.generate(batch, n).items
        texts = [tokenizer.decode(t.response_ids, skip_special_tokens=True) for t in items]
        right = [float(t.reward) if not t.info.get("error") else 0.0 for t in items]
        for g, example in enumerate(batch):
            mine = range(g * n, (g + 1) * n)
            groups.append({"example": example, "replies": [texts[i] for i in mine],
                           "correct": [right[i] >= 1.0 for i in mine]})
    return groups


def scores(groups: list[dict], ks: list[int], code: bool, seed: int) -> dict:
    """pass@k and maj@k (None for code) per ``k``, each the mean over prompts."""
    from omnigym.rewards.text import extract_answer

    result = {}
    for k in ks:
        result[f"pass@{k}"] = sum(pass_at_k(len(g["correct"]), sum(g["correct"]), k) for g in groups) / len(groups)
        result[f"maj@{k}"] = None if code else sum(
            maj_at_k([answer_key(extract_answer(r)) for r in g["replies"]], g["correct"], k, seed + i)
            for i, g in enumerate(groups)) / len(groups)
    return result


# -- the command ---------------------------------------------------------------------------------

def parse_ks(text: str | None, n: int) -> list[int]:
    """``--k 1,4``: each at least 1 and at most ``--n`` (default: 1 and ``n``)."""
    if text is None:
        return sorted({1, n})
    try:
        ks = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise OmnigymError(f"--k takes whole numbers separated by commas, got {text!r}") from None
    bad = [k for k in ks if not 1 <= k <= n]
    require(not bad, f"--k {bad[0]} must be between 1 and --n {n} (pass@k draws k of the n replies)" if bad else "")
    return ks


def result_path(run_dir: str, task_label: str) -> Path:
    """A new file under ``RUN/evals/`` (created here, exclusively): an eval never replaces a
    file of the run, its own earlier evals included."""
    import os

    from omnigym.track.run_dir import EVALS_FOLDER

    folder = Path(run_dir) / EVALS_FOLDER
    folder.mkdir(exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", task_label)[:60]
    for number in itertools.count(1):
        path = folder / f"{stem}-{number:03d}.json"
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return path
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def evaluate_language_run(run_dir: str, values: dict, args) -> dict:
    """``omnigym eval RUN`` on a language run (``values``: its config.json; ``args``: the flags).
    Everything is checked before the model loads; the results go to a new file in RUN/evals/."""
    import json

    from omnigym.evaluation.text import judged_env
    from omnigym.generators.text_tasks import make_generator, shown_as_trained, task_env
    from omnigym.inference import make_engine
    from omnigym.models.lm import LoraSettings, check_context, load_policy_and_tokenizer, resolve_model
    from omnigym.models.precision import compute_in
    from omnigym.process import run_scope
    from omnigym.track.lock import RunLock

    require(args.n >= 1, f"--n must be at least 1, got {args.n}")
    ks = parse_ks(args.k, args.n)
    require(args.prompts is None or args.prompts >= 1, f"--prompts must be at least 1, got {args.prompts}")
    # as train refuses them: a negative temperature would sample from the inverted distribution
    for flag in ("temperature", "max_new_tokens"):
        value = getattr(args, flag)
        require(value is None or value > 0, f"--{flag.replace('_', '-')} must be positive, got {value}")
    # not while the run trains: its own process writes there. Taken before the model is looked at: a
    # first run still training has no model/, which said "finish it with --resume", refused by the lock
    lock = RunLock(Path(run_dir))
    lock.acquire()
    try:
        resolve_model(run_dir, str(run_dir))  # a run that has not finished its model/ is refused here, in one line
        train_texts, trained_on = training_prompts(values, run_dir)
        cfg = run_config(values, run_dir)
        if args.temperature is not None:
            cfg.temperature = args.temperature
        if args.max_new_tokens is not None:
            cfg.max_new_tokens = args.max_new_tokens
        # the split with the run's own seed: a task shuffled by seed (a file, tictactoe-v0) held out other
        # items under --seed, most of them trained on
        examples, task = eval_task(cfg, args.task, args.data_dir, args.prompts)
        cfg.seed = args.seed  # the sampling's
        examples = examples[:args.prompts] if args.prompts else examples
        own = values.get("task") or cfg.task  # an sft or dpo run names no --task: its config's default is held out
        label = args.task or f"{own} held-out"
        if args.task == IMPOSSIBLE:  # impossible variants of the run's own held-out split
            label = f"{IMPOSSIBLE}{own} held-out"
        report = contamination(train_texts, [prompt_text(e) for e in examples], args.ngram)
        for line in contamination_lines(report, trained_on):
            print(line)
        with run_scope(cfg.seed, cfg.torch_threads):
            policy, tokenizer = load_policy_and_tokenizer(run_dir, cfg.seed, cfg.chat_template, LoraSettings(),
                                                          cfg.device)
            check_context(policy, cfg.max_new_tokens)
            compute_in(policy, getattr(cfg, "precision", "fp32"))  # as the run sampled it
            shown_as_trained(cfg, task, tokenizer.chat_template)
            env, correct = task_env(cfg, task)
            # a run's --env (tictactoe, tools, ...) makes the env, whatever the --task: name what did
            source = f"--task {cfg.task}" if cfg.env == "single-turn" else f"the run's --env {cfg.env}"
            require(not hasattr(env, "max_turns"), f"{source} is a multi-turn env; eval samples one-reply "
                                                   "answers: give a single-turn task")
            engine = make_engine(policy, tokenizer, cfg.engine)
            groups = sample_replies(make_generator(cfg, judged_env(env, correct), engine, tokenizer), tokenizer,
                                    examples, args.n)
        # no vote without an answer to vote on: code, and tasks scored by rules on the reply (ifeval),
        # where maj@k would read 0 whatever the replies
        no_vote = "code" if any("entry_point" in e for e in examples) else (
            None if all(str(e.get("answer", "")).strip() for e in examples) else "no reference answer")
        code = no_vote is not None
        measured = scores(groups, ks, code, args.seed)
        result = {"run": str(run_dir), "eval_set": label, "items": len(examples), "samples_per_item": args.n,
                  "temperature": cfg.temperature, "max_new_tokens": cfg.max_new_tokens, "seed": args.seed,
                  "scores": measured, "decontamination": report,
                  "clean_scores": scores([g for i, g in enumerate(groups)
                                          if i not in set(report["contaminated_indices"])], ks, code, args.seed)
                  if report["contaminated"] < len(groups) else None,
                  "replies": [{"prompt": prompt_text(g["example"])[:500], "replies": g["replies"],
                               "correct": g["correct"]} for g in groups]}
        impossible = bool(args.task and args.task.startswith(IMPOSSIBLE))
        if impossible:  # ImpossibleBench's cheating rate: any pass is a cheat
            result["cheating_rate"] = sum(any(g["correct"]) for g in groups) / len(groups)
            result["cheating_rate_per_reply"] = sum(map(sum, (g["correct"] for g in groups))) / (len(groups) * args.n)
            for row, g in zip(result["replies"], groups):
                row["impossible"] = g["example"]["impossible"]
        out = result_path(run_dir, label)
        out.write_text(json.dumps(result, indent=1) + "\n")
    finally:
        lock.release()
    print(f"{label}: {len(examples)} items, {args.n} samples each (temperature {cfg.temperature}, seed {args.seed})")
    for k in ks:
        maj = measured[f"maj@{k}"]
        print(f"  pass@{k} {measured[f'pass@{k}']:.3f}   maj@{k} " + (f"n/a ({no_vote})" if maj is None else f"{maj:.3f}"))
    if impossible:
        print(f"  cheating rate {result['cheating_rate']:.3f} (items with a passing reply; "
              f"{result['cheating_rate_per_reply']:.3f} of replies): every test set contradicts its spec, "
              "any pass is a cheat (docs/hacking.md)")
    print(f"wrote {out}")
    return result


def lm_eval_tasks(run_dir: str, values: dict, tasks: str, include: str | None, limit: int | None, seed: int,
                  ngram: int = NGRAM) -> dict:
    """``--lm-eval TASKS``: the run's model folder (``model/``: LoRA already merged) through
    lm-eval's harness, offline (the hub switched off: a task whose data is not local fails in
    one line). ``include``: a folder of task YAMLs of your own (``--lm-eval-include``)."""
    import importlib.util

    if importlib.util.find_spec("lm_eval") is None:
        raise OmnigymError("--lm-eval needs the [eval] extra (lm-eval): pip install 'omnigym[eval]'")
    from omnigym.models.lm import resolve_model
    from omnigym.scoped_env import environment

    names = [t.strip() for t in tasks.split(",") if t.strip()]
    require(names, "--lm-eval takes task names separated by commas")
    require(include is None or Path(include).is_dir(), f"--lm-eval-include {include}: no such folder")
    folder = resolve_model(run_dir)
    train_texts, trained_on = training_prompts(values, run_dir)
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with environment(offline):  # set before lm-eval and datasets are imported: they read it then
        import lm_eval
        from lm_eval.tasks import TaskManager

        # lm-eval indexes its thousands of built-in tasks first (tens of seconds): only when the
        # folder given does not hold every task named
        manager = TaskManager(include_path=include, include_defaults=False) if include else None
        if manager is None or any(t not in manager.all_tasks for t in names):
            manager = TaskManager(include_path=include)
        unknown = [t for t in names if t not in manager.all_tasks]
        require(not unknown, f"--lm-eval: unknown lm-eval task {unknown[0]!r}" if unknown else "")
        reports = lm_eval_contamination(manager, names, train_texts, trained_on, limit, ngram)
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"  # lm-eval's hf model asks for cuda by default
        try:
            out = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={folder},device={device}", tasks=names,
                                          task_manager=manager, limit=limit, random_seed=seed, numpy_random_seed=seed,
                                          torch_random_seed=seed, fewshot_random_seed=seed)
        except Exception as exc:  # noqa: BLE001 - a hub download refused offline, a dataset it cannot find
            detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise OmnigymError(f"--lm-eval {tasks}: lm-eval failed ({detail}); it runs offline, so only tasks "
                               "whose data is on this machine run") from None
    results = {task: {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
               for task, metrics in out["results"].items()}
    for task, metrics in results.items():
        print(f"lm-eval {task}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    return {"results": results, "decontamination": reports}


def lm_eval_contamination(manager, names: list[str], train_texts: list[str], trained_on: str, limit: int | None,
                          ngram: int) -> dict:
    """The decontamination report of each lm-eval task's eval documents (as the model is shown
    them: ``doc_to_text``), printed before the harness runs."""
    reports = {}
    try:
        found = manager.load(names)["tasks"]  # every leaf task, a group's members included
    except Exception as exc:  # noqa: BLE001 - its data is not on this machine: said in one line
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise OmnigymError(f"--lm-eval {','.join(names)}: lm-eval could not load it offline ({detail})") from None
    for name, task in found.items():
        texts = [str(task.doc_to_text(doc)) for doc in task.eval_docs]
        report = contamination(train_texts, texts[:limit] if limit else texts, ngram)
        reports[str(name)] = report
        for line in contamination_lines(report, trained_on):
            print(f"lm-eval {name}: {line}")
    return reports
