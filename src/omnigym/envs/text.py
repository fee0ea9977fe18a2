"""Language as an action space: an env whose observation is a conversation and whose
action is the model's text.

``reset()`` returns ``(messages, info)`` with the task's example in ``info["example"]``;
``step(text)`` returns ``(messages, reward, terminated, truncated, info)`` like gymnasium.
Single-turn envs end after one reply, scored by a reward. Tool envs answer tool calls (a
Python tool run in the sandbox, a calculator) until the model gives a final reply or the
turn limit truncates the episode.

``step`` is ``respond`` (the env's side of the conversation) plus the reward of a final
reply. The reward is a batched ``omnigym.rewards.Reward``, so a generator that plays many
episodes at once calls ``respond`` on each and scores all final replies in one call
(``generators/text_env.py``); a reward model then scores a whole batch at once.

Envs are registered by id; the built-in ids are always there, whatever a user registers.
"""

from __future__ import annotations

import ast
import difflib
import operator
import random
import re
from typing import Callable

from omnigym.errors import OmnigymError

TEXT_ENVS: dict[str, Callable[..., "TextEnv"]] = {}
TOOL_CALL = re.compile(r"<tool name=\"(\w+)\">(.*?)</tool>", re.DOTALL)


def register_text_env(env_id: str, factory: Callable[..., "TextEnv"]) -> None:
    TEXT_ENVS[env_id] = factory


def make_text_env(env_id: str, **kwargs) -> "TextEnv":
    if env_id not in TEXT_ENVS:
        close = difflib.get_close_matches(env_id, list(TEXT_ENVS), n=3, cutoff=0.4)
        hint = f"; closest known ids: {', '.join(close)}" if close else f"; known: {', '.join(sorted(TEXT_ENVS))}"
        raise OmnigymError(f"unknown text env id {env_id!r}{hint}")
    return TEXT_ENVS[env_id](**kwargs)


class TextEnv:
    """Single-turn: the conversation is a system prompt and the task's question."""

    tools: tuple[str, ...] = ()
    """the tools a reply may call (``ToolEnv``'s); none in a single-turn env"""

    def __init__(self, examples: list[dict], reward, system_prompt: str | None = None):
        if not examples:
            raise OmnigymError("a text env needs at least one example")
        self.examples, self.reward, self.system_prompt = examples, reward, system_prompt
        self._rng = random.Random()
        self.messages: list[dict] = []
        self.example: dict = {}

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng.seed(seed)
        self.example = (options or {}).get("example") or self._rng.choice(self.examples)
        self.messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
        self.messages.append({"role": "user", "content": self.example["question"]})
        return list(self.messages), {"example": self.example}

    def respond(self, text: str):
        """The model said ``text``: returns ``(messages, terminated, truncated, info)``."""
        self.messages.append({"role": "assistant", "content": text})
        return list(self.messages), True, False, {"example": self.example}

    def step(self, text: str):
        messages, terminated, truncated, info = self.respond(text)
        reward = float(self.reward([text], [self.example])[0]) if terminated else 0.0
        return messages, reward, terminated, truncated, info


def calculator(expression: str) -> str:
    """Arithmetic on numbers with + - * / ** and parentheses, evaluated on the syntax tree."""
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            # It runs in the trainer: a tower of bounded powers, (((9**64)**64)**64)**64, took 21 s,
            # one more level hours. An int of more than 4,300 digits cannot be shown anyway.
            if isinstance(node.op, ast.Pow) and type(left) is int and type(right) is int \
                    and abs(left).bit_length() * right > 14_300:
                raise ValueError("result too large (over 4300 digits)")
            return ops[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in ops:
            return ops[type(node.op)](ev(node.operand))
        raise ValueError("only numbers and + - * / ** ( ) are allowed")

    try:
        return str(ev(ast.parse(expression.strip(), mode="eval").body))
    except Exception as exc:  # the model sees the error and may try again
        return f"error: {exc}"


def python_tool(code: str, sandbox) -> str:
    """``code`` run in ``sandbox`` (an ``omnigym.rewards.sandbox.Sandbox``); its output, or the error."""
    from omnigym.rewards.sandbox import SandboxLimits

    result = sandbox.run_python(code, SandboxLimits(cpu_seconds=2, wall_seconds=5, max_output_bytes=2000))
    if result.timed_out:
        return "error: timed out"
    return (result.stdout + result.stderr).strip()[:2000]


class ToolEnv(TextEnv):
    """Multi-turn: ``<tool name="python">…</tool>`` or ``<tool name="calculator">…</tool>`` in a
    reply is answered by a ``tool`` message; a reply without a tool call is final and scored."""

    TOOLS = ("python", "calculator")

    def __init__(self, examples, reward, system_prompt=None, max_turns: int = 4, tools=("python", "calculator")):
        from omnigym.rewards.sandbox import Sandbox

        super().__init__(examples, reward, system_prompt)
        self.sandbox = Sandbox()
        """where the python tool runs; the per-episode copies of this env share it (it probes the machine once)"""
        unknown = set(tools) - set(self.TOOLS)
        if unknown:
            raise OmnigymError(f"unknown tools {sorted(unknown)}; available: {', '.join(self.TOOLS)}")
        self.max_turns, self.tools, self.turns = max_turns, tools, 0

    def reset(self, seed=None, options=None):
        self.turns = 0
        return super().reset(seed, options)

    def respond(self, text: str):
        self.turns += 1
        self.messages.append({"role": "assistant", "content": text})
        calls = TOOL_CALL.findall(text)
        if not calls:
            return list(self.messages), True, False, {"example": self.example}
        outputs = [self.use_tool(name, arg) for name, arg in calls]
        self.messages.append({"role": "tool", "content": "\n".join(outputs)})
        truncated = self.turns >= self.max_turns
        return list(self.messages), False, truncated, {"example": self.example, "tool_calls": len(calls),
                                                       "tool_errors": sum(o.startswith("error") for o in outputs)}

    def use_tool(self, name: str, arg: str) -> str:
        if name not in self.tools:
            return f"error: unknown tool {name}"
        return python_tool(arg, self.sandbox) if name == "python" else calculator(arg)


def arithmetic_env(digits: int = 2, terms: int = 2, operations: str = "+", n: int = 5000, seed: int = 0,
                   tools: bool = False, **kwargs) -> TextEnv:
    """Procedural arithmetic scored by correctness + 0.1 x format; with ``tools`` a ToolEnv."""
    from omnigym.rewards import WeightedSum
    from omnigym.tasks.arithmetic import ArithmeticTask

    examples = ArithmeticTask(digits, terms, operations).sample(n, seed)
    return (ToolEnv if tools else TextEnv)(examples, WeightedSum({"math": 1.0, "format": 0.1}), **kwargs)


def arithmetic_tools_env(**kwargs) -> TextEnv:
    return arithmetic_env(tools=True, **kwargs)


register_text_env("arithmetic-v0", arithmetic_env)
register_text_env("arithmetic-tools-v0", arithmetic_tools_env)
