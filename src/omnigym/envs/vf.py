"""verifiers environments trained unchanged: ``omnigym train grpo --env vf:MODULE``.

``MODULE`` is a verifiers environment module, as verifiers' env packages are: it defines
``load_environment(**kwargs)`` returning a ``verifiers`` ``Environment`` (``SingleTurnEnv``,
``MultiTurnEnv``, ``ToolEnv``, ...). ``--env-args '{"k": v}'`` are its keyword arguments.

A verifiers env talks to the model itself, through an OpenAI client: its ``rollout`` sends
chat requests, runs its own tools and env turns, and its ``Rubric`` scores the finished
rollout. So each episode here is an agent function on the ``--agent`` contract
(``async def run(client, example)``, agents/episodes.py): ``VerifiersAgent`` wraps the
``openai.AsyncOpenAI`` client the run serves from its own engine in verifiers' own
``OpenAIChatCompletionsClient`` and calls verifiers' ``Environment.run_rollout`` (rollout
and ``Rubric.score_rollout``), unchanged. The endpoint records every request as sampled,
so what is trained is exactly the tokens the model produced, the env's messages between
them masked. The reward is the rubric's: its weighted reward functions are returned as
reward parts (``reward/<name>``: weight x score; zero-weight functions are metrics and are
left out), whose sum is verifiers' own ``reward``.

Examples are the env's dataset rows (``get_dataset()``: ``prompt``, ``answer``, ``info``,
``example_id``, ...), given to ``run_rollout`` as they are; the held-out split is the env's
eval dataset when it has one, else ``--eval-size`` rows of its dataset.

Tools of a verifiers ``ToolEnv`` are Python functions written by the env's author and run in
this process, as verifiers runs them: the env module is the user's own code. The model's
text reaches them only as the arguments verifiers parses from its tool calls.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import random

from omnigym.errors import OmnigymError
from omnigym.tasks.datasets import check_held_out


def verifiers():
    """The verifiers package, or one line naming the extra that brings it."""
    try:
        import verifiers as vf
        from verifiers.clients import OpenAIChatCompletionsClient  # noqa: F401  (the v0 surface loads)
    except ImportError:
        raise OmnigymError("--env vf:MODULE needs verifiers, which is not installed; install it with: "
                           "pip install 'omnigym[agents]'") from None
    return vf


def load_vf_environment(spec: str, args: dict):
    """``load_environment(**args)`` of module ``spec`` (``-`` read as ``_``, as verifiers does),
    checked to be a verifiers ``Environment`` that this adapter can play."""
    from omnigym.user_code import call_user_code, import_reference

    vf = verifiers()
    module_name = spec.replace("-", "_")
    if not module_name or not all(part.isidentifier() for part in module_name.split(".")):
        raise OmnigymError(f"--env vf:{spec}: name a Python module (vf:my_env), the way verifiers names env packages")
    module, _ = import_reference(f"{module_name}:load_environment", "--env vf:")
    load = getattr(module, "load_environment", None)
    if not callable(load):
        raise OmnigymError(f"--env vf:{spec}: module {module_name} ({getattr(module, '__file__', '?')}) has no "
                           "load_environment(**kwargs); a verifiers environment module defines one")
    env = call_user_code(f"--env vf:{spec}: load_environment", lambda: load(**args))
    if not isinstance(env, vf.Environment):
        raise OmnigymError(f"--env vf:{spec}: load_environment returned {type(env).__name__}, not a verifiers "
                           "Environment")
    if env.rubric.has_group_rewards:
        raise OmnigymError(f"--env vf:{spec}: its rubric has group reward functions, which score a whole group at "
                           "once; omnigym plays each episode on its own (scored by Rubric.score_rollout)")
    return env


def preflight(env, spec: str, example: dict) -> None:
    """One rollout of ``example`` before the run starts, the model's part played by a canned reply
    ("ok") through the real openai client on an in-memory transport: an env whose own code fails
    (its env turn, its stop conditions, its rubric) stops the run in one line, with nothing
    written, instead of failing every episode of the run."""
    import asyncio
    import concurrent.futures

    import httpx
    import openai
    from verifiers.clients import OpenAIChatCompletionsClient

    def answer(request):
        body = json.loads(request.content)
        return httpx.Response(200, json={
            "id": "preflight", "object": "chat.completion", "created": 0, "model": body.get("model", "omnigym"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    async def play():
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
            client = openai.AsyncOpenAI(base_url="http://preflight.invalid/v1", api_key="-", http_client=http,
                                        max_retries=0)
            await env.run_rollout(copy.deepcopy(example), OpenAIChatCompletionsClient(client), "omnigym", {})

    # verifiers logs what it thinks of the canned reply (no handler: Python prints it on stderr);
    # a handler that drops it, for this rollout only, keeps a failure to the one line below
    quiet = logging.NullHandler()
    logging.getLogger("verifiers").addHandler(quiet)
    # a thread of its own: asyncio.run needs one with no running event loop (a notebook's has one)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="omnigym-vf-preflight") as pool:
        try:
            pool.submit(asyncio.run, play()).result()
        except Exception as exc:  # verifiers keeps the model's failures (vf.Error) in the state; this is the env's
            from omnigym.user_code import at

            first = (str(exc).strip().splitlines() or [""])[0][:300]
            raise OmnigymError(f"--env vf:{spec}: a rollout with the reply 'ok' raised {type(exc).__name__}: {first}"
                               f"{at(exc)}; the env's own code fails before any model is involved") from None
        finally:
            logging.getLogger("verifiers").removeHandler(quiet)


def rows(dataset) -> list[dict]:
    """A verifiers dataset's rows as examples: what run_rollout takes, plus ``question`` and
    ``answer`` (held-out accuracy and samples.jsonl read them)."""
    out = []
    for row in dataset:
        row = dict(row)
        prompt = row.get("prompt")
        if "question" not in row and isinstance(prompt, list):
            row["question"] = next((m.get("content", "") for m in reversed(prompt)
                                    if isinstance(m, dict) and m.get("role") == "user"), "")
        row.setdefault("question", str(prompt))
        row.setdefault("answer", "")
        out.append(row)
    return out


def rubric_weights(rubric) -> list[tuple[str, float]]:
    """``(name, weight)`` of each function of a verifiers rubric, read from its public fields:
    ``funcs`` and ``weights`` (a ``RubricGroup``: its ``rubrics``' in turn), each function named
    as verifiers names it in a rollout's metrics (its ``__name__``)."""
    if getattr(rubric, "rubrics", None) is not None:
        return [pair for child in rubric.rubrics for pair in rubric_weights(child)]
    if not hasattr(rubric, "funcs") or not hasattr(rubric, "weights"):
        import verifiers

        raise OmnigymError(f"verifiers {verifiers.__version__}: a Rubric has no funcs and weights fields, which "
                           "omnigym reads its reward weights from; pip install 'verifiers==0.3.1' or report it")
    return [(getattr(func, "__name__", repr(func)), float(weight)) for func, weight in zip(rubric.funcs, rubric.weights)]


class VerifiersAgent:
    """A verifiers env's rollout as an agent function: ``await agent(client, example)`` ->
    the rubric's weighted parts (``{name: weight x score}``), or raises when the rollout failed."""

    def __init__(self, env, spec: str, model: str = "omnigym"):
        self.env, self.spec, self.model = env, spec, model
        self.weights = tuple((name, w) for name, w in rubric_weights(env.rubric) if w)

    async def __call__(self, client, example: dict) -> dict:
        from verifiers.clients import OpenAIChatCompletionsClient

        output = await self.env.run_rollout(example, OpenAIChatCompletionsClient(client), self.model, {})
        if output.get("error"):
            raise RuntimeError(f"the verifiers rollout of vf:{self.spec} failed: {output['error']}")
        metrics = output.get("metrics") or {}
        parts = {name: weight * float(metrics.get(name, 0.0)) for name, weight in self.weights}
        return parts or {"reward": float(output.get("reward") or 0.0)}


@contextlib.contextmanager
def quiet_datasets():
    """datasets' progress bars off while verifiers formats the env's dataset (its ``map`` would
    draw one on stderr, around the one line a bad env gets), and back as they were."""
    import datasets

    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if shown:
            datasets.enable_progress_bars()


def vf_task(cfg, spec: str):
    """``--env vf:MODULE``'s examples (a ``Task``) and the agent function that plays them."""
    from omnigym.envs.skyrl import parse_env_args
    from omnigym.tasks import Task

    with quiet_datasets():
        env = load_vf_environment(spec, parse_env_args(cfg.env_args))
        train = rows(env.get_dataset())
        evaluated = env.eval_dataset is not None or getattr(env, "eval_dataset_source", None) is not None
        heldout = rows(env.get_eval_dataset())[:cfg.eval_size] if evaluated else None
    if not evaluated:
        check_held_out(f"--env vf:{spec} (no eval dataset)", len(train), "examples", cfg.eval_size)
        random.Random(cfg.seed).shuffle(train)
        train, heldout = train[cfg.eval_size:], train[:cfg.eval_size]
    preflight(env, spec, train[0])
    return Task(train, heldout), VerifiersAgent(env, spec)
