"""The flags of a run whose episodes are your own agent function (``--agent``)."""

from __future__ import annotations

from dataclasses import dataclass

from omnigym.errors import require


@dataclass
class AgentConfig:
    agent: str | None = None
    """MODULE:FUNCTION of your own async def run(client, example) -> float | dict: it gets an
    openai.AsyncOpenAI client served by this run's model, and returns the episode's reward (docs/agents.md)"""
    agent_concurrency: int = 32
    """--agent episodes running at once (their requests share the engine's batches)"""
    agent_timeout: float = 300.0
    """seconds an --agent episode may take; one that takes longer is dropped (agent/timeouts), the run goes on"""

    def check_agent(self) -> None:
        if self.agent is None and not str(getattr(self, "env", "")).startswith("vf:"):  # vf: played as an agent
            given = [flag for flag, value, default in (("--agent-concurrency", self.agent_concurrency, 32),
                                                       ("--agent-timeout", self.agent_timeout, 300.0))
                     if value != default]
            require(not given, f"{', '.join(given)}: read with --agent only; add --agent MODULE:FUNCTION or leave "
                               "them out")
            return
        require(self.agent_concurrency >= 1, f"--agent-concurrency must be at least 1, got {self.agent_concurrency}")
        require(self.agent_timeout > 0, f"--agent-timeout must be positive, got {self.agent_timeout}")
        require(getattr(self, "runtime", "sync") == "sync",
                "--agent runs its episodes in this process (the endpoint is served from this run's engine): "
                "use --runtime sync")
        # each process of a data-parallel run would play its own episodes, which timing makes differ, while
        # the trainer assumes every process holds the same batch and trains its share of it
        backend = getattr(self, "training_backend", "local")  # text_reinforce has none: it trains in one process
        require(backend == "local", f"--agent plays its episodes in one process: use --training-backend local, not "
                                    f"{backend}")
