"""``--task`` resolved: a spec (``arithmetic``, ``chain``, ``gsm8k:FILE``, a registered text env
id, a ``.jsonl`` file, ``module:name``, a Hugging Face dataset id; ``omnigym.tasks`` lists the
order) as training and held-out examples, with the text env the task comes with where it
comes with one. It sits in ``envs/`` because those envs are part of the answer; the example
sources themselves stay in ``tasks/``, below."""

from __future__ import annotations

import random
from pathlib import Path

from omnigym.envs.text import TEXT_ENVS, TextEnv, make_text_env
from omnigym.errors import OmnigymError
from omnigym.tasks import Task
from omnigym.tasks.datasets import INSTRUCTIONS_FIELD, check_example, check_held_out, load_prompt_answer

__all__ = ["Task", "load_task"]


def load_task(spec: str, seed: int, eval_size: int, digits: int = 2, terms: int = 2, operations: str = "+") -> Task:
    """``spec``'s examples: ``eval_size`` held out (never trained on), the rest to train on."""
    from omnigym.user_code import call_user_code, import_object, import_reference, is_reference

    if eval_size < 1:
        raise OmnigymError(f"--eval-size must be positive, got {eval_size}")
    if spec == "arithmetic":
        from omnigym.tasks.arithmetic import ArithmeticTask

        task = ArithmeticTask(digits, terms, operations)
        return Task(task.sample(20_000, seed), task.sample(eval_size, 10_000 + seed, split="heldout"))
    if spec == "chain":
        from omnigym.envs.chain import chain_env
        from omnigym.tasks.steps import ChainTask

        chain = ChainTask(digits, terms, operations)
        train = chain.sample(20_000, seed)
        return Task(train, chain.sample(eval_size, 10_000 + seed, split="heldout"), chain_env(train))
    if spec == "ifeval":  # IFEval-style instructions, scored by the share followed (strict), loose logged beside it
        from omnigym.rewards import WeightedSum
        from omnigym.tasks.instructions import InstructionTask

        task = InstructionTask()
        train = task.sample(20_000, seed)
        reward = WeightedSum({"ifeval": 1.0, "ifeval_loose": 0.0})
        return Task(train, task.sample(eval_size, 10_000 + seed, split="heldout"), TextEnv(train, reward))
    env = None
    if spec.startswith("reasoning_gym:"):
        from omnigym.tasks.reasoning_gym import load_reasoning_gym

        rows = load_reasoning_gym(spec.split(":", 1)[1], size=20_000 + eval_size, seed=seed)
    elif spec.startswith("gsm8k:"):
        from omnigym.tasks.datasets import load_gsm8k

        rows = load_gsm8k(spec.split(":", 1)[1])
    elif spec.startswith("humaneval:"):
        from omnigym.rewards import WeightedSum
        from omnigym.tasks.datasets import load_humaneval

        rows = load_humaneval(spec.split(":", 1)[1])
        env = TextEnv(rows, WeightedSum({"code": 1.0}))
    elif spec in TEXT_ENVS:
        env = make_text_env(spec)
        rows = env.examples
    elif Path(spec).exists():
        if not spec.endswith((".jsonl", ".jsonl.gz")):
            raise OmnigymError(f"--task {spec}: a task file must be JSON lines (.jsonl) with question and answer fields")
        rows = load_prompt_answer(spec, "question", "answer")
    elif is_reference(spec):
        module, name = import_reference(spec, "--task")
        if name in TEXT_ENVS:  # the module registered a text env under that id
            env = make_text_env(name)
            rows = env.examples
        else:
            made = import_object(spec, "--task")
            made = call_user_code(f"--task {spec}", made) if callable(made) else made
            env = made if isinstance(made, TextEnv) else None
            rows = env.examples if env is not None else made
    else:
        rows = _hub_dataset(spec)
    return _split(spec, rows, env, seed, eval_size)


def _hub_dataset(spec: str) -> list[dict]:
    import difflib

    close = difflib.get_close_matches(spec, ["arithmetic", "chain", "ifeval", *TEXT_ENVS], n=3, cutoff=0.6)
    if close:
        raise OmnigymError(f"unknown --task {spec!r}; closest known: {', '.join(close)}")
    try:
        return load_prompt_answer(spec, "question", "answer")
    except OmnigymError:
        raise
    except Exception as exc:  # the hub is unreachable offline; datasets raises many types
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OmnigymError(f"--task {spec} is not a built-in task, a registered text env, a file or module:name, "
                           f"and loading it as a Hugging Face dataset failed ({detail[:200]})") from None


def _split(spec: str, rows, env, seed: int, eval_size: int) -> Task:
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise OmnigymError(f"--task {spec} must give a list of dicts (examples), got {type(rows).__name__}")
    # an IFEval row's answer may be empty or left out, as in a task file (the instruction rewards never read it)
    rows = [{**r, "answer": ""} if INSTRUCTIONS_FIELD in r and r.get("answer") in (None, "") else r for r in rows]
    missing = next((r for r in rows if "question" not in r or "answer" not in r), None)
    if missing is not None:
        raise OmnigymError(f"--task {spec}: every example needs 'question' and 'answer'; one has "
                           f"{', '.join(missing) or 'no fields'}")
    if not rows:
        raise OmnigymError(f"--task {spec} has no examples")
    if env is None:  # a task function's rows get the checks a task file's do
        for i, row in enumerate(rows):
            check_example(f"--task {spec}: example {i}", row["question"], row["answer"],
                          answer_optional=INSTRUCTIONS_FIELD in row)
    check_held_out(f"--task {spec}", len(rows), "examples", eval_size)
    rows = list(rows)
    random.Random(seed).shuffle(rows)
    return Task(rows[eval_size:], rows[:eval_size], env)
