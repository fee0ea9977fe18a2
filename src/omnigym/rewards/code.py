"""Code rewards: the model's program judged against unit tests in the sandbox.

An example carries either HumanEval's fields (``test`` defining ``check(candidate)``,
``entry_point`` and usually ``prompt``), which give a binary reward, or ``tests``, a list of
Python statements (usually asserts) that name the program's functions, which give a graded
reward: the fraction that passed, counting those that passed before a limit stopped it.

The verdict comes from ``judge_harness.py``, run in the sandbox: the tests run in a
process of their own that the program cannot reach, against stubs that call the program's
functions and bring their results back as plain data. docs/rewards.md has the design and
its limits.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from omnigym.errors import OmnigymError
from omnigym.rewards.sandbox import Sandbox, SandboxLimits

FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)
HARNESS = (Path(__file__).with_name("judge_harness.py")).read_text()


def extract_code(completion: str) -> str:
    """The last fenced code block, else the completion itself."""
    blocks = FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def candidate_program(completion: str, example: dict) -> str:
    """The program to judge. HumanEval's usual completion is the function body only: when
    the code does not define the entry point at top level, it is appended to the prompt."""
    code = extract_code(completion)
    prompt, entry = example.get("prompt", ""), example.get("entry_point")
    if not prompt or not entry or _defines(code, entry):
        return code
    return prompt + code if prompt.endswith("\n") or code.startswith("\n") else prompt + "\n" + code


def _defines(code: str, name: str) -> bool:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # nesting too deep for the parser
        return False
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name
               for node in tree.body)


@dataclass(frozen=True)
class Verdict:
    passed: int
    total: int
    reason: str = ""
    """why the program was not run or judged (empty when the judge ran its tests)"""
    blocked: tuple[str, ...] = ()
    """what the sandbox stopped the program doing (``network``, ``cpu``, ``file size``, ``killed``
    from the judge; ``timeout``, ``processes``, ``memory`` from the trainer): docs/hacking.md"""


def verdict(completion: str, example: dict, sandbox: Sandbox, limits: SandboxLimits | None = None) -> Verdict:
    """The tests ``completion``'s program passes, run in ``sandbox``. Nothing a model writes
    makes this raise (a bad example does, in one line): a program that cannot be read scores
    0 with the reason."""
    if "tests" in example:
        tests = example["tests"]
        if not isinstance(tests, (list, tuple)) or not all(isinstance(t, str) for t in tests):
            raise OmnigymError(f"a code example's 'tests' must be a list of Python statements (strings), "
                               f"got {type(tests).__name__}")
        if not tests:
            return Verdict(0, 0, "the example has no tests")
        job = {"tests": list(tests)}
    elif not isinstance(example.get("test"), str) or not isinstance(example.get("entry_point"), str):
        raise OmnigymError("a code example needs 'tests' (a list of statements) or HumanEval's 'test' and "
                           f"'entry_point'; this one has {', '.join(example) or 'no fields'}")
    else:
        tests = ["check"]
        job = {"check": example["test"], "entry_point": example["entry_point"], "prelude": example.get("prompt", "")}
    try:
        program = candidate_program(completion, example).encode()
    except UnicodeEncodeError as exc:  # Python cannot compile it either
        return Verdict(0, len(tests), f"the program is not text: a lone surrogate {exc.object[exc.start]!r} "
                                      f"at character {exc.start}")
    result = sandbox.run(sandbox.python_argv(HARNESS), limits, "", (repr(job).encode(), program), writable=1)
    passed, reason = _count_passed(result.channels[0], len(tests))
    return Verdict(passed, len(tests), "timed out" if result.timed_out and not reason else reason,
                   _blocked(result.channels[0]) + result.blocked)


def judge(completion: str, example: dict, sandbox: Sandbox, limits: SandboxLimits | None = None) -> tuple[int, int]:
    """(tests passed, tests) for one completion, run in ``sandbox``."""
    found = verdict(completion, example, sandbox, limits)
    return found.passed, found.total


def _count_passed(verdict: bytes, tests: int) -> tuple[int, str]:
    """The verdict is one line per test, in order: ``pass i`` or ``fail i TypeName``, or
    ``error TypeName`` when the program gave the judge nothing to test (it did not load).
    Read strictly, stopping at the first line out of place (nothing the candidate says
    reaches it, and a reader that took any line starting with ``pass`` would be one slip
    away). Returns (passed, why the program was not judged: the judge's error line)."""
    passed = 0
    lines = verdict.decode("ascii", errors="replace").split("\n")
    if lines[0].startswith("error "):
        return 0, f"no test ran: {lines[0][6:60]} (the program did not load, or the judge could not read it)"
    for index, line in enumerate(lines[:tests]):
        if line == f"pass {index}":
            passed += 1
        elif not line.startswith(f"fail {index} "):
            break
    return passed, ""


BLOCKED_BY_JUDGE = ("network", "cpu", "file size", "killed")


def _blocked(verdict: bytes) -> tuple[str, ...]:
    """The judge's ``blocked KIND`` lines (after its test lines), known kinds only."""
    lines = verdict.decode("ascii", errors="replace").split("\n")
    return tuple(line[8:] for line in lines if line.startswith("blocked ") and line[8:] in BLOCKED_BY_JUDGE)


def code_score(completion: str, example: dict, sandbox: Sandbox, limits: SandboxLimits | None = None) -> float:
    """The fraction of the example's tests that pass (0 for an example with none)."""
    found = verdict(completion, example, sandbox, limits)
    return found.passed / found.total if found.total else 0.0


class CodeScore:
    """``(completion, example) -> float`` for ``per_sample``: 1 if the program passes all its
    tests, else 0 (``graded``: the fraction that pass), judged in the sandbox it holds."""

    def __init__(self, graded: bool, sandbox: Sandbox | None = None):
        self.graded, self.sandbox = graded, sandbox or Sandbox()
        self.__name__ = "code_graded" if graded else "code"

    def __call__(self, completion: str, example: dict) -> float:
        return self.with_notes(completion, example)[0]

    def with_notes(self, completion: str, example: dict) -> tuple[float, dict[str, float]]:
        """The score and ``{"sandbox_blocked": n}``: how many kinds of attempt the sandbox
        stopped (``Verdict.blocked``), for the trajectory's info (the hacking monitor reads it)."""
        found = verdict(completion, example, self.sandbox)
        score = found.passed / found.total if found.total else 0.0
        return (score if self.graded else float(score == 1.0)), {"sandbox_blocked": float(len(found.blocked))}
