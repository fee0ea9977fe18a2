"""Prompt sources: procedural tasks that need no download, and dataset loaders.

``load_task`` turns ``--task`` into training and held-out examples (each a dict with at
least ``question`` and ``answer``), trying in this order:

1. ``arithmetic`` and ``chain`` (built in, procedural; ``chain`` is worked one checkable step a
   line: ``omnigym.tasks.steps``), ``reasoning_gym:<task>``, ``gsm8k:<file.jsonl>``,
   ``humaneval:<file.jsonl[.gz]>`` (scored by the ``code`` reward: its tests, in the sandbox);
2. a registered text env id (``arithmetic-tools-v0``): its examples, and the env itself
   (its class and reward) to train in;
3. a ``.jsonl`` file with ``question`` and ``answer`` fields;
4. ``module:name`` from your own code: a text env id the module registers, or a function
   that returns a list of examples or a ``TextEnv``;
5. a Hugging Face dataset id, when the dataset is available offline.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from omnigym.errors import OmnigymError


@dataclass
class Task:
    train: list[dict]
    heldout: list[dict]
    env: object | None = None
    """the text env the task comes with (a registered env), else None: the trainer builds one"""


def load_task(spec: str, seed: int, eval_size: int, digits: int = 2, terms: int = 2, operations: str = "+") -> Task:
    """``spec``'s examples: ``eval_size`` held out (never trained on), the rest to train on."""
    from omnigym.envs.text import TEXT_ENVS, TextEnv, make_text_env
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
        from omnigym.tasks.datasets import load_prompt_answer

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

    from omnigym.envs.text import TEXT_ENVS
    from omnigym.tasks.datasets import load_prompt_answer

    close = difflib.get_close_matches(spec, ["arithmetic", "chain", *TEXT_ENVS], n=3, cutoff=0.6)
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
    missing = next((r for r in rows if "question" not in r or "answer" not in r), None)
    if missing is not None:
        raise OmnigymError(f"--task {spec}: every example needs 'question' and 'answer'; one has "
                           f"{', '.join(missing) or 'no fields'}")
    if not rows:
        raise OmnigymError(f"--task {spec} has no examples")
    if len(rows) <= eval_size:
        raise OmnigymError(f"--task {spec} has {len(rows)} examples, and --eval-size {eval_size} holds out that many "
                           f"or more; use --eval-size below {len(rows)}")
    rows = list(rows)
    random.Random(seed).shuffle(rows)
    return Task(rows[eval_size:], rows[:eval_size], env)
