"""A stateful Python interpreter over several turns (rStar2-Agent's setting): the model runs
code in ``<tool name="python">…</tool>``, reads what it printed (or its error), may run more
code that uses the variables it defined before, and ends the episode by answering
``<answer>…</answer>``; the answer is scored by the task's verifier (the math reward).

State across turns is kept by *replay*: each turn runs the episode's earlier cells again,
with their output thrown away, then the new cell, in one fresh sandbox
(``rewards/sandbox.py``, the code reward's own). Measured here (bubblewrap, 2 shared cores,
load 3-5, median of 6 episodes of 4 small cells): turns 1 to 4 took 122, 106, 117 and 108 ms,
a bare sandboxed ``print(1)`` 87 ms: starting the sandbox is the cost, and replaying 3 earlier
cells adds nothing measurable. A process kept alive per episode would save
those milliseconds but would need a life cycle the generator does not have (episodes are
copied and dropped, never closed: a leaked process per episode), a protocol through the
sandbox's walls, and one program's hostile state (a closed stdin, a signal handler, a
fork) would outlive its turn. Replay keeps every turn under the sandbox's full guarantees.
What replay changes: earlier cells run again, so ``random`` is seeded the same way before
each replay (their values stay the same) and a cell that timed out is not kept (it would
time out on every later turn), nor one that did not finish (killed by a limit or a signal,
or an exit); time, files written and anything else a cell reads from
outside are what they are on the later run.

The built-in task (``python-v0``) is procedural: products of large numbers and sums over a
generated list, answers a model cannot produce without running code.
"""

from __future__ import annotations

import json
import random

from omnigym.envs.text import ToolEnv

REPLAY = """\
import json, os, sys, traceback
fd, done, MAIN = int(sys.argv[1]), int(sys.argv[2]), os.getpid()
cells = json.loads(os.read(fd, 1 << 26).decode())
os.close(fd)


def run(cell, namespace):
    try:
        exec(compile(cell, '<cell>', 'exec'), namespace)
    except SystemExit:
        pass
    except BaseException as exc:  # the model reads its own error, as at a REPL
        report(exc)
    if os.getpid() != MAIN:  # a process the cell forked ends with its cell, not in the runner
        os._exit(0)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # a full file, a closed descriptor: the cell's own doing
            pass


def report(exc):
    try:
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
    except BaseException:
        try:
            print(type(exc).__name__, file=sys.stderr)
        except BaseException:
            pass


import random, tempfile
random.seed(0)
namespace = {'__name__': '__main__'}
real = sys.stdout, sys.stderr
out, err = os.dup(1), os.dup(2)
for cell in cells[:-1]:  # the earlier turns' cells: their state, not their output
    # into a file like the first run's (the same size limit), so a cell that stopped at a full
    # file stops the same way again; its own stream objects, so nothing it left unwritten
    # reaches the new cell's output
    sink = tempfile.TemporaryFile('w', errors='backslashreplace')
    os.dup2(sink.fileno(), 1)
    os.dup2(sink.fileno(), 2)
    sys.stdout = sys.stderr = sink
    run(cell, namespace)
    try:
        sink.close()
    except BaseException:
        pass
sys.stdout, sys.stderr = real
os.dup2(out, 1)
os.dup2(err, 2)
os.close(out)
os.close(err)
os.write(done, b'r')  # the earlier cells ran again
run(cells[-1], namespace)
os.write(done, b'd')  # the new cell ran to its end (or raised): keep it for the next turn
"""
"""What runs in the sandbox: the episode's cells (JSON, on a descriptor) in one namespace."""

SYSTEM_PROMPT = ("You can run Python: write <tool name=\"python\">code</tool> and you get back what it printed. "
                 "Variables stay defined between your calls. When you know the result, reply with only "
                 "<answer>NUMBER</answer>.")


class PythonEnv(ToolEnv):
    """``ToolEnv`` whose one tool is a Python session kept across the episode's turns."""

    TOOLS = ("python",)

    def __init__(self, examples, reward, system_prompt=None, max_turns: int = 4, output_chars: int = 1000,
                 cpu_seconds: int = 2, wall_seconds: float = 5.0):
        super().__init__(examples, reward, system_prompt, max_turns, tools=("python",))
        self.output_chars, self.cpu_seconds, self.wall_seconds = output_chars, cpu_seconds, wall_seconds
        self.cells: list[str] = []
        """this episode's cells that ran to the end (or failed), replayed before the next one"""

    def reset(self, seed=None, options=None):
        self.cells = []  # a new list: the per-episode copies of this env must not share one
        return super().reset(seed, options)

    def demonstration(self, example: dict) -> list[dict] | None:
        """The example's scripted solution as the turns after the prompt (GRPO's warm-up)."""
        if "cells" not in example:
            return None
        turns = []
        for cell, output in zip(example["cells"], example["outputs"]):
            turns += [{"role": "assistant", "content": f'<tool name="python">{cell}</tool>'},
                      {"role": "tool", "content": output}]
        return turns + [{"role": "assistant", "content": f"<answer>{example['answer']}</answer>"}]

    def use_tool(self, name: str, arg: str) -> str:
        if name not in self.tools:
            return f"error: unknown tool {name}; the tool is python"
        return self.run_cell(arg)

    def run_cell(self, code: str) -> str:
        """Run ``code`` after this episode's earlier cells; its output (stdout then stderr),
        at most ``output_chars`` of it, or a one-line error."""
        from omnigym.rewards.sandbox import SandboxLimits

        limits = SandboxLimits(cpu_seconds=self.cpu_seconds, wall_seconds=self.wall_seconds, memory_mb=512,
                               max_processes=16, max_file_mb=8, max_output_bytes=4 * self.output_chars + 4096)
        cells = self.cells + [code]
        # ensure_ascii: a lone surrogate the model wrote crosses as an escape, and compiling it is
        # the cell's own error inside the sandbox
        payload = json.dumps(cells, ensure_ascii=True).encode()
        result = self.sandbox.run(self.sandbox.python_argv(REPLAY), limits, "", (payload,), writable=1)
        output = (result.stdout + result.stderr).strip()
        if result.channels[0] == b"rd":
            self.cells = cells
            return truncate(output, self.output_chars) if output else "(no output)"
        why = f"timed out after {self.wall_seconds:g} s" if result.timed_out else \
            "did not finish (a CPU, memory or process limit, a signal, or an exit)"
        if not result.channels[0].startswith(b"r"):  # the earlier cells no longer run to their end: start afresh
            self.cells = []
            return f"error: your earlier cells {why} when run again; the session was reset, nothing is defined now"
        # killed, timed out or exited: replaying it would end every later turn the same way
        return truncate(f"{output}\nerror: the cell {why}; it is not kept".strip(), self.output_chars)


def truncate(text: str, budget: int) -> str:
    """``text`` cut to ``budget`` characters, saying how much was cut."""
    if len(text) <= budget:
        return text
    return text[:budget] + f"\n... (output cut at {budget} characters)"


def compute_examples(n: int, seed: int, kinds: tuple[str, ...] = ("product", "list")) -> list[dict]:
    """Procedural questions whose answers need code: (``product``) two 5-6 digit numbers
    multiplied, plus a third, or (``list``) a sum over a generated list. ``cells`` is a
    two-turn solution (the data, then the computation that uses it) and ``outputs`` what each
    prints: the warm-up's demonstration and the tests' scripted policy."""
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        if rng.choice(kinds) == "product":
            a, b, c = rng.randrange(10_000, 1_000_000), rng.randrange(10_000, 1_000_000), rng.randrange(1, 100_000)
            question = f"What is {a} * {b} + {c}?"
            cells = [f"a, b, c = {a}, {b}, {c}", "print(a * b + c)"]
            answer = a * b + c
        else:
            xs = [rng.randrange(-500, 1000) for _ in range(rng.randrange(12, 20))]
            k = rng.choice((2, 3, 5))
            question = f"xs = {xs}. What is the sum of the squares of the numbers in xs that are divisible by {k}?"
            cells = [f"xs = {xs}", f"print(sum(x * x for x in xs if x % {k} == 0))"]
            answer = sum(x * x for x in xs if x % k == 0)
        examples.append({"question": question, "answer": str(answer), "cells": cells,
                         "outputs": ["(no output)", str(answer)]})
    return examples


def python_env(n: int = 5000, seed: int = 0, kinds: tuple[str, ...] = ("product", "list"),
               system_prompt: str | None = SYSTEM_PROMPT, **kwargs) -> PythonEnv:
    """``python-v0``: the interpreter env on the procedural compute task, scored by
    correctness + 0.1 x format (``kinds=("product",)``: the short questions only, which fit a
    256-position model such as the tiny one)."""
    from omnigym.errors import OmnigymError
    from omnigym.rewards import WeightedSum

    unknown = set(kinds) - {"product", "list"}
    if not kinds or unknown:
        raise OmnigymError(f"python-v0 kinds must be product and/or list, got {', '.join(map(str, kinds)) or 'none'}")
    return PythonEnv(compute_examples(n, seed, tuple(kinds)), WeightedSum({"math": 1.0, "format": 0.1}), system_prompt,
                     **kwargs)
