"""Your agent function's episodes: an episode source (``play``) and a Generator over it.

``AgentEpisodes(fn, engine, tokenizer, params, ...)`` plays one episode per call of
``await play(example, group_id)``: it opens an episode on the endpoint (``server.py``),
gives ``fn`` an ``openai.AsyncOpenAI`` client for it and the example, waits at most
``timeout`` seconds, and returns the episode's Trajectories (``recorder.py``), its reward
the function's return value: a number, or a dict of numbers (reward components, summed;
each part is logged as ``reward/<name>``). An agent that raises, hangs past the timeout or
returns something else costs that episode only: one Trajectory with ``info["error"]``,
which the trainer does not train on (and which does not count in its group's baseline);
each distinct reason is said once on stderr. A chat template that cannot show the model
the agent's tools stops the run (``OmnigymError``): every episode would be wrong. Each
episode's function runs in a thread and event loop of its own, so one that blocks instead of
awaiting holds its own episode only; ``play`` itself may be awaited in any event loop.

``AgentGenerator(episodes, concurrency)`` is the plain generator seam over it
(``generate(examples, group_size)``: every episode of the step, at most ``concurrency`` at
once, in an event loop of its own; the endpoint is up for the call and down after it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import inspect
import os
import re
import sys
import threading
import time

from omnigym.agents.recorder import trajectories
from omnigym.agents.server import AgentServer
from omnigym.errors import OmnigymError
from omnigym.generators.base import Trajectories
from omnigym.inference.engine import SamplingParams
from omnigym.inference.service import EngineService
from omnigym.rewards.base import MAX_REWARD, reward_value, shown_reward
from omnigym.user_code import import_object, is_reference, where


class BadReturn(Exception):
    """The agent returned something that is not a reward: ``(kind, message)``, the kind its type
    (said once per kind: a nan said first hid the dicts of text that came after)."""


def load_agent(spec: str):
    """``--agent MODULE:FUNCTION``, checked before the run starts: an ``async def`` that takes
    ``(client, example)``."""
    if not is_reference(spec):
        raise OmnigymError(f"--agent {spec!r}: name your function as MODULE:FUNCTION (e.g. my_agent:run)")
    fn = import_object(spec, "--agent")
    target = fn.__call__ if callable(fn) and not inspect.isroutine(fn) and not inspect.isclass(fn) else fn
    if not callable(fn) or inspect.isclass(fn):
        raise OmnigymError(f"--agent {spec}: {type(fn).__name__} is not a function; give async def run(client, example)")
    if not inspect.iscoroutinefunction(target):
        raise OmnigymError(f"--agent {spec} is not an async function: write it as async def run(client, example) "
                           "(it gets an openai.AsyncOpenAI client)")
    try:
        signature = inspect.signature(fn)
        signature.bind(object(), {})
    except (TypeError, ValueError):
        raise OmnigymError(f"--agent {spec}{_signature(fn)} cannot be called as run(client, example): it must take "
                           "exactly those two arguments") from None
    return fn


def _signature(fn) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return ""


PART_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
"""a reward part's name, logged as ``reward/<name>``: no "/" or "..", which made other metrics' names"""
TRAINER_REWARD_KEYS = frozenset({"mean", "std", "step_mean", "steps_per_reply", "score", "total"})
"""``reward/`` metrics the trainers log themselves: a part of that name overwrote them ("mean": 0.25 logged as the
mean reward of a step whose rewards were 0.35)"""


def reward_of(result) -> tuple[float, dict]:
    """The episode's reward and its parts from what the agent returned."""
    number = reward_value(result)
    if number is not None:
        return number, {}
    if isinstance(result, dict) and result and all(isinstance(k, str) for k in result):
        bad = next((k for k in result if not PART_NAME.fullmatch(k) or k in TRAINER_REWARD_KEYS), None)
        if bad is not None:
            raise BadReturn("returned a reward part with a bad name",
                            f"the agent returned a reward part named {bad[:40]!r}: a part's name is letters, digits "
                            f"and _ (at most 64, a letter first), and not one of {', '.join(sorted(TRAINER_REWARD_KEYS))}"
                            " (the trainer's own reward/ metrics)")
        parts = {k: reward_value(v) for k, v in result.items()}
        if all(v is not None for v in parts.values()) and reward_value(sum(parts.values())) is not None:
            return sum(parts.values()), parts
    raise BadReturn(f"returned {type(result).__name__}",
                    f"the agent returned {shown_reward(result)} "
                    f"({type(result).__name__}): return a finite number, or a dict of them (reward parts, summed), "
                    f"at most {MAX_REWARD:g} in size")


class AgentEpisodes:
    def __init__(self, fn, engine, tokenizer, params: SamplingParams, timeout: float = 300.0,
                 model_name: str = "omnigym", context: int | None = None, said: set | None = None):
        """``params``: the reply budget (``max_new_tokens``), the temperature of requests that
        give none, and ``greedy`` (every request sampled greedily: held-out evaluation);
        ``said``: the failure reasons already said (shared by a run's sources, so each is said once)."""
        self.fn, self.engine, self.tokenizer, self.params, self.timeout = fn, engine, tokenizer, params, timeout
        self.model_name, self.context = model_name, context
        self.service: EngineService | None = None
        self.server: AgentServer | None = None
        self._said = said if said is not None else set()

    def on_engine(self, engine) -> "AgentEpisodes":
        """The same agent's episodes served from ``engine``, saying each failure reason once
        together with these (the set of reasons said is shared, not copied)."""
        return AgentEpisodes(self.fn, engine, self.tokenizer, self.params, self.timeout, self.model_name,
                             self.context, self._said)

    def open(self) -> None:
        """Start the endpoint (and the engine's batching service), if it is not up."""
        if self.server is not None:
            return
        self.service = EngineService(self.engine)
        try:
            self.server = AgentServer(self.service, self.tokenizer, self.model_name, self.params.max_new_tokens,
                                      self.context, self.params.temperature, self.params.greedy).start()
        except BaseException:
            self.service.close()
            self.service = None
            raise

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.service.close()
        self.server = self.service = None

    def update_weights(self, named_tensors, version: int) -> None:
        (self.service or self.engine).update_weights(named_tensors, version)

    async def play(self, example: dict, group_id: int) -> list:
        """One episode of the agent on ``example``."""
        self.open()
        server = self.server
        record = server.open_episode()
        reward, parts, error, timed_out, kind = 0.0, {}, None, False, ""
        started = time.monotonic()
        try:  # the agent gets a copy: it may not change the task's examples
            kind, value = await self._run_apart(server, record.episode_id, copy.deepcopy(example))
            if kind == "returned":
                reward, parts = reward_of(value)
            elif kind == "timed out":
                error, timed_out = f"the agent did not finish within --agent-timeout {self.timeout:g} s", True
            else:
                error = f"the agent raised {type(value).__name__}: {_first_line(value)} (at {where(value)})"
                kind += f"{type(value).__name__} {where(value)}"  # said once per exception type and place
        except BadReturn as exc:
            kind, error = exc.args
        finally:
            server.close_episode(record.episode_id)  # a request still on its way gets 404
        if record.fatal:
            raise OmnigymError(record.fatal)
        if record.crash is not None:  # not the agent's doing: the run stops with the engine's own error
            raise record.crash
        if error is not None:
            reward, parts = 0.0, {}
            self._say_once(kind, error, time.monotonic() - started)
        return trajectories(record, reward, parts, group_id, example, self.engine.version, error, timed_out)

    async def _run_apart(self, server, episode_id: str, example: dict) -> tuple[str, object]:
        """``fn(client, example)`` in a thread and event loop of its own: an agent that blocks
        (``time.sleep``, a synchronous call) holds its own episode only, and past the timeout
        it is cancelled at its next await, or, blocked, left behind (a daemon thread).
        Returns ``("returned", value)``, ``("raised", exception)`` or ``("timed out", None)``."""
        loop = asyncio.get_running_loop()
        finished = loop.create_future()
        cancel = []

        def episode():
            agent_loop = asyncio.new_event_loop()
            try:
                client = server.client(episode_id, timeout=self.timeout)
                task = agent_loop.create_task(self.fn(client, example))
                cancel.append(lambda: agent_loop.call_soon_threadsafe(task.cancel))
                try:
                    outcome = ("returned", agent_loop.run_until_complete(task))
                except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the episode's, not the run's
                    outcome = ("raised", exc)
                agent_loop.run_until_complete(_quietly_close(client))
            except BaseException as exc:
                outcome = ("raised", exc)
            finally:
                cancel.clear()
                agent_loop.close()
            try:
                loop.call_soon_threadsafe(_settle, finished, outcome)
            except RuntimeError:  # the caller's loop has ended: nobody waits for this episode any more
                pass

        threading.Thread(target=episode, name="omnigym-agent-episode", daemon=True).start()
        try:
            return await asyncio.wait_for(asyncio.shield(finished), self.timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            for stop in list(cancel):
                try:
                    stop()
                except RuntimeError:  # its loop has just closed
                    pass
            if isinstance(exc, asyncio.CancelledError):
                raise
            return "timed out", None

    def _say_once(self, kind: str, error: str, seconds: float) -> None:
        """``error`` on stderr, the first time a failure of this ``kind`` happens in the run."""
        kind = kind or error
        if kind not in self._said:
            self._said.add(kind)
            print(f"omnigym: an agent episode failed after {seconds:.1f} s and is not trained on: {error} "
                  "(said once; agent/errors counts them)", file=sys.stderr)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


def _settle(future: asyncio.Future, outcome: tuple) -> None:
    if not future.done():
        future.set_result(outcome)


async def _quietly_close(client) -> None:
    try:
        await client.close()
    except Exception:  # the episode is over either way
        pass


class AgentGenerator:
    def __init__(self, episodes: AgentEpisodes, concurrency: int = 32):
        self.episodes, self.concurrency = episodes, concurrency

    def update_weights(self, named_tensors, version: int) -> None:
        self.episodes.update_weights(named_tensors, version)

    def episode_source(self) -> AgentEpisodes:
        """The same agent's episodes for ``--rollouts async`` (runtime/episodes.py), served from an
        engine on its own copy of the policy, so that they go on sampling while the trainer trains
        (its weights are copied in between two engine batches); closing the source stops its endpoint."""
        from omnigym.inference import engine_on_own_copy

        return self.episodes.on_engine(engine_on_own_copy(self.episodes.engine))

    def generate(self, examples: list[dict], group_size: int) -> Trajectories:
        # a thread of its own: asyncio.run needs a thread with no running event loop (a notebook's has one)
        self.episodes.open()
        cwd = os.getcwd()
        running: dict = {}

        async def play_all() -> list:
            running["loop"], running["task"] = asyncio.get_running_loop(), asyncio.current_task()
            return await self._play_all(examples, group_size)

        try:
            with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="omnigym-agents") as pool:
                future = pool.submit(asyncio.run, play_all())
                try:
                    items = future.result()
                except BaseException:  # Ctrl-C, or SIGTERM's grace over: the episodes end now, each at its next
                    if not future.done() and "loop" in running:  # await, not after --agent-timeout (300 s default)
                        try:
                            running["loop"].call_soon_threadsafe(running["task"].cancel)
                        except RuntimeError:  # the loop closed in between: nothing is left to cancel
                            pass
                    raise
        finally:
            self.episodes.close()
            # An agent that changes the process's working directory (a coding agent's os.chdir) moved the trainer's
            # relative paths with it: --run-dir runs/x was written (or not found) under the agent's folder.
            if os.getcwd() != cwd:
                os.chdir(cwd)
        return Trajectories(items)

    async def _play_all(self, examples: list[dict], group_size: int) -> list:
        gate = asyncio.Semaphore(self.concurrency)

        async def one(example: dict, group_id: int) -> list:
            async with gate:
                return await self.episodes.play(example, group_id)

        tasks = [asyncio.ensure_future(one(example, g)) for g, example in enumerate(examples)
                 for _ in range(group_size)]
        try:
            played = await asyncio.gather(*tasks)
        except BaseException:  # the run stops: end the other episodes here, and collect how each ended, or
            for task in tasks:  # asyncio.run's shutdown prints a traceback for the next one that raised
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return [t for episode in played for t in episode]


def agent_generators(cfg, fn, engine, tokenizer, policy) -> tuple[AgentGenerator, AgentGenerator]:
    """The two Generators of an ``--agent`` run, the sampler and the greedy judge of held-out
    accuracy: replies of at most ``--max-new-tokens`` (and the model's context), ``--temperature``
    unless a request gives one."""
    context = getattr(getattr(policy, "config", None), "max_position_embeddings", None)
    said: set = set()
    return tuple(AgentGenerator(AgentEpisodes(fn, engine, tokenizer, SamplingParams(
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, greedy=greedy), cfg.agent_timeout,
        str(cfg.model), context if isinstance(context, int) else None, said), cfg.agent_concurrency)
        for greedy in (False, True))


def agent_metrics(items: list) -> dict:
    """Per-episode means of an agent batch (an episode of several sequences counted once)."""
    episodes = [t for t in items if t.info.get("sequence", 0) == 0]
    n = max(len(episodes), 1)
    return {"agent/errors": sum(1 for t in episodes if t.info.get("error")),
            "agent/timeouts": sum(1 for t in episodes if t.info.get("timed_out")),
            "agent/turns": sum(t.info.get("turns", 0) for t in episodes) / n,
            "agent/tool_calls": sum(t.info.get("tool_calls", 0) for t in episodes) / n,
            "agent/tool_errors": sum(t.info.get("tool_errors", 0) for t in episodes) / n,
            "agent/sequences": len(items) / n,
            # per sequence, as completion/cut_off_fraction is: which limit cut the replies off
            **{f"completion/cut_by_{name}_fraction":
               sum(limit in t.info.get("cut_by", ()) for t in items) / max(len(items), 1) for name, limit in CUT_BY}}


CUT_BY = (("max_tokens", "max_tokens"), ("max_new_tokens", "--max-new-tokens"), ("context", "context"))
"""(a metric's name, the limit that cut a reply off: agents/recorder.py's Exchange.cut_by)"""
