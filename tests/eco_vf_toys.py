"""A verifiers environment module written for the tests, as verifiers' env packages are:
``load_environment(kind=...)`` gives a single-turn, a multi-turn or a tool env on additions."""

import verifiers as vf
from datasets import Dataset


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


class NumberReplyEnv(vf.MultiTurnEnv):
    """Broken on purpose: its env turn is a number, not a list of messages (a string, verifiers
    itself reads as a user message)."""

    async def env_response(self, messages, state, **kwargs):
        return 42


class FeedbackEnv(vf.MultiTurnEnv):
    """Multi-turn: a wrong answer is told "try again" by the env, up to max_turns replies."""

    async def env_response(self, messages, state, **kwargs):
        return [{"role": "user", "content": "try again"}]

    @vf.stop
    async def answered_right(self, state, **kwargs) -> bool:
        completion = state.get("trajectory") or []
        if not completion:
            return False
        last = completion[-1]["completion"][-1]
        return self.parser.parse_answer([last]) == state["answer"]


def load_environment(kind: str = "single", n: int = 40):
    rows = [{"question": f"{i % 7}+{i % 5}", "answer": str(i % 7 + i % 5)} for i in range(n)]
    parser = vf.XMLParser(["answer"], answer_field="answer")

    def correct(completion, answer, **kwargs) -> float:
        return 1.0 if parser.parse_answer(completion) == answer else 0.0

    def brief(completion, **kwargs) -> float:
        return 1.0 if len(parser.parse_answer(completion) or "xxxx") <= 3 else 0.0

    def length(completion, **kwargs) -> float:  # a metric: weight 0
        return float(len(str(completion)))

    rubric = vf.Rubric(funcs=[correct, brief, length], weights=[1.0, 0.2, 0.0], parser=parser)
    data = Dataset.from_list(rows)
    if kind == "single":
        return vf.SingleTurnEnv(dataset=data, parser=parser, rubric=rubric)
    if kind == "multi":
        return FeedbackEnv(dataset=data, parser=parser, rubric=rubric, max_turns=3)
    if kind == "number_reply":
        return NumberReplyEnv(dataset=data, parser=parser, rubric=rubric, max_turns=3)
    if kind == "tool":
        return vf.ToolEnv(dataset=data, tools=[add], parser=parser, rubric=rubric, max_turns=3)
    return "not an environment"
