"""Code rewards: the model's program run against unit tests in the sandbox.

An example carries either HumanEval's fields (``test`` defining ``check(candidate)`` and
``entry_point``), which give a binary reward, or ``tests``, a list of Python statements
(usually asserts), which give a graded reward: the fraction that passed, counting those
that passed before a limit stopped the program.
"""

from __future__ import annotations

import json
import re

from omnigym.rewards import per_sample, register_reward
from omnigym.rewards.sandbox import SandboxLimits, run_python

FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)
PASS_MARK = "__omnigym_test_passed__"


def extract_code(completion: str) -> str:
    """The last fenced code block, else the completion itself."""
    blocks = FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def _graded_program(code: str, tests: list[str]) -> str:
    runner = (
        f"\nimport sys as _s\nfor _t in {json.dumps(tests)}:\n"
        "    try:\n        exec(_t, globals())\n    except BaseException:\n        continue\n"
        f"    print({PASS_MARK!r}, flush=True)\n"
    )
    return code + "\n" + runner


def code_score(completion: str, example: dict, limits: SandboxLimits | None = None) -> float:
    code = extract_code(completion)
    if "tests" in example:
        tests = list(example["tests"])
        if not tests:
            return 0.0
        result = run_python(_graded_program(code, tests), limits)
        return min(result.stdout.count(PASS_MARK), len(tests)) / len(tests)
    program = f"{example.get('prompt', '') if example.get('prepend_prompt') else ''}{code}\n\n{example['test']}\n\n" \
              f"check({example['entry_point']})\nprint({PASS_MARK!r})\n"
    result = run_python(program, limits)
    return float(result.returncode == 0 and PASS_MARK in result.stdout)


def code_reward(completion: str, example: dict) -> float:
    """1 if the program passes all its tests (binary), else 0."""
    return float(code_score(completion, example) == 1.0)


def code_graded_reward(completion: str, example: dict) -> float:
    """Fraction of the tests that pass."""
    return code_score(completion, example)


register_reward("code")(per_sample(code_reward))
register_reward("code_graded")(per_sample(code_graded_reward))
