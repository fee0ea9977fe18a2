"""skyrl-gym's Python tool answered from omnigym's sandbox, through skyrl's own tool API: a
``ToolGroup`` subclass whose ``@tool python`` runs the model's code in ``rewards/sandbox.py``
(skyrl's runs a bare ``python -c`` on the host), set on the env with ``init_tool_groups``.
Imported only where a skyrl env is made (skyrl-gym is the ``[skyrl]`` extra)."""

from __future__ import annotations

from skyrl_gym.tools import PythonCodeExecutorToolGroup
from skyrl_gym.tools.core import tool

from omnigym.rewards.sandbox import SandboxLimits


class SandboxedPythonTools(PythonCodeExecutorToolGroup):
    """skyrl's Python tool group (same group name, same tool name, same answers) with the code
    run in the sandbox."""

    def __init__(self, timeout: float, sandbox):
        self.sandbox = sandbox
        super().__init__(timeout=timeout)

    @tool
    def python(self, code: str) -> str:
        result = self.sandbox.run_python(code, SandboxLimits(cpu_seconds=max(1, int(self.timeout)),
                                                             wall_seconds=self.timeout, max_output_bytes=4000))
        if result.timed_out:
            return f"Error executing Python code: Execution timed out after {self.timeout} seconds."
        if result.stderr:
            return f"Error executing Python code: {result.stderr.strip()}"
        return result.stdout.strip()


def sandbox_python_tools(env, sandbox) -> None:
    """Every Python tool group of a skyrl env replaced by one that runs in ``sandbox``."""
    groups = list(getattr(env, "tool_groups", ()))
    if any(type(g) is PythonCodeExecutorToolGroup for g in groups):
        env.init_tool_groups([SandboxedPythonTools(g.timeout, sandbox) if type(g) is PythonCodeExecutorToolGroup else g
                              for g in groups])
