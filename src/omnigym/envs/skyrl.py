"""skyrl-gym's text envs as omnigym ``TextEnv``s: ``omnigym train grpo --env skyrl:NAME``.

A skyrl-gym env (``skyrl_gym.make(NAME, env_config=..., extras=...)``, a ``BaseTextEnv``)
is made afresh for every episode from the example's ``extras``, as SkyRL's own generator
does: ``init(prompt)`` gives the first conversation, and each model reply goes to
``step(reply)``, whose ``observations`` (a list of chat messages) are appended to the
conversation. The chat template renders them and the generator appends them with loss
mask 0; ``done`` ends the episode.

The episode's reward is the **sum of the rewards of its steps**: what SkyRL's GRPO trains on
(it puts each step's reward on that turn's last token and an outcome estimator adds them
up). Each step's reward is kept in the episode's example as ``step_rewards``. An episode that
reaches ``--max-turns`` before the env says ``done`` is truncated with reward 0, as every
omnigym text env is.

Examples are skyrl's dataset rows: ``prompt`` (a list of chat messages, or a string),
``env_class``, ``reward_spec`` (``{"method": "rule", "ground_truth": ...}``), ``extra_info``
and any other field the env reads; every field but ``prompt`` and ``env_class`` is the
env's ``extras``. A task of question/answer examples (``--task arithmetic``, a jsonl of
question/answer) becomes such rows: the question as the user message, the answer as
``reward_spec.ground_truth``.

What runs where: skyrl's tools run in this process, as SkyRL runs them, except model-written
code. The ``python`` tool of skyrl's ``PythonCodeExecutorToolGroup`` (used by ``searchcode``,
and by any env of yours that uses that group) is answered by omnigym's sandbox
(rewards/sandbox.py) instead of skyrl's bare ``python -c``. Envs whose own code runs what
the model wrote outside any sandbox are refused (``REFUSED``). Your own skyrl env (``--env
skyrl:MODULE:NAME``: the module registers NAME when imported) is your own code and runs as
such.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

from omnigym.envs.text import TextEnv
from omnigym.errors import OmnigymError
from omnigym.rewards.base import MAX_REWARD, Reward, reward_value, shown_reward
from omnigym.user_code import call_user_code

REFUSED = (
    ("lcb", "its reward runs the model's program with exec() in a child process of the trainer, outside any sandbox"),
    ("text2sql", "its tool and its reward run the model's SQL with sqlite3 in the trainer's process, where ATTACH "
                 "opens any path on the host"),
)
"""skyrl-gym envs that run model-written code unsandboxed, and why; --env skyrl:NAME refuses them"""

DEMONSTRATIONS = (("gsm8k", "#### {answer}"), ("gsm8k_multi_turn", "#### {answer}"))
"""the answer format of the shipped envs whose reward reads one reply, for the warm-up's demonstrations"""


def skyrl_gym():
    """The skyrl_gym package, or one line naming the extra that brings it."""
    try:
        import skyrl_gym
    except ImportError:
        raise OmnigymError("--env skyrl:NAME needs skyrl-gym, which is not installed; install it with: "
                           "pip install 'omnigym[agents]'") from None
    return skyrl_gym


def resolve(spec: str) -> str:
    """``NAME`` or ``MODULE:NAME`` (the module is imported first, so it can register NAME): the
    registered id, checked to exist and not to be refused."""
    gym = skyrl_gym()
    name = spec
    if ":" in spec:
        from omnigym.user_code import import_reference

        _, name = import_reference(spec, "--env skyrl:")
    refused = dict(REFUSED)
    if name in refused:
        raise OmnigymError(f"--env skyrl:{name} is refused: {refused[name]}")
    if name not in gym.registry:
        import difflib

        known = sorted(set(gym.registry) - set(refused))
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f"closest: {', '.join(close)}; " if close else ""
        raise OmnigymError(f"--env skyrl:{name}: no skyrl-gym env of that name ({hint}known: {', '.join(known)}; "
                           "your own: --env skyrl:MODULE:NAME, where importing MODULE registers NAME)")
    return name


def env_config(name: str, args: dict):
    """The env's ``env_config``: ``--env-args`` over the defaults of the env module's config
    dataclass (``SearchEnvConfig``'s search_url, ...), as an OmegaConf DictConfig like SkyRL's."""
    import dataclasses
    import importlib

    from omegaconf import OmegaConf

    entry = skyrl_gym().registry[name].entry_point
    defaults = {}
    if isinstance(entry, str):
        module = importlib.import_module(entry.split(":")[0])
        for value in vars(module).values():
            if dataclasses.is_dataclass(value) and isinstance(value, type) and value.__name__.endswith("Config"):
                defaults = {f.name: f.default for f in dataclasses.fields(value)
                            if f.default is not dataclasses.MISSING}
    return OmegaConf.create({**defaults, **args})


def is_message_list(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value)


class StepRewards(Reward):
    """An episode's reward as the skyrl env gave it: the sum of its steps' rewards, which the
    episode keeps in its example (``step_rewards``)."""

    label = "skyrl"

    def __call__(self, completions, examples):
        import torch

        return torch.tensor([float(sum(e.get("step_rewards", ()))) for e in examples], dtype=torch.float64)


class SkyrlEnv(TextEnv):
    """A skyrl-gym env, one instance per episode, behind omnigym's ``reset``/``respond``."""

    def __init__(self, name: str, examples: list[dict], env_args: dict | None = None, max_turns: int = 4,
                 system_prompt: str | None = None):
        from omnigym.rewards.sandbox import Sandbox

        super().__init__(examples, StepRewards(), system_prompt)
        self.name, self.env_args, self.max_turns = name, dict(env_args or {}), max_turns
        self.sandbox = Sandbox()
        """where skyrl's python tool runs; the per-episode copies share it (it probes the machine once)"""
        self.config = env_config(name, self.env_args)
        self.turns = 0
        self.skyrl = None

    def _make(self, example: dict):
        extras = {k: v for k, v in example.items() if k not in ("prompt", "env_class", "step_rewards")}
        try:
            env = skyrl_gym().make(self.name, env_config=self.config, extras=extras)
        except Exception as exc:  # skyrl's envs assert on the fields they need
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            raise OmnigymError(f"--env skyrl:{self.name} refused an example: {type(exc).__name__}: {first}") from None
        from omnigym.envs.skyrl_sandbox import sandbox_python_tools

        sandbox_python_tools(env, self.sandbox)
        return env

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng.seed(seed)
        example = (options or {}).get("example") or self._rng.choice(self.examples)
        self.example = {**example, "step_rewards": []}  # this episode's own copy: its rewards go in it
        self.turns = 0
        self.skyrl = self._make(example)
        first = call_user_code(f"--env skyrl:{self.name}: init()", self.skyrl.init, copy.deepcopy(example["prompt"]))
        messages = first[0] if isinstance(first, tuple) and len(first) == 2 else first
        if not is_message_list(messages):
            raise OmnigymError(f"--env skyrl:{self.name}: init() returned {type(messages).__name__}, not a list of "
                               "chat messages ({'role': str, 'content': str})")
        if self.system_prompt and not any(m["role"] == "system" for m in messages):
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        self.messages = list(messages)
        return list(self.messages), {"example": self.example}

    def respond(self, text: str):
        self.turns += 1
        self.messages.append({"role": "assistant", "content": text})
        out = call_user_code(f"--env skyrl:{self.name}: step()", self.skyrl.step, text)
        observations = out.get("observations") if isinstance(out, dict) else None
        if not is_message_list(observations):
            shown = (f"{type(out).__name__}, not a dict" if not isinstance(out, dict) else
                     "list, not all {'role': str, 'content': str}" if isinstance(observations, list) else
                     type(observations).__name__)
            raise OmnigymError(f"--env skyrl:{self.name}: step() returned observations of type {shown}; a skyrl "
                               "text env answers with a list of chat messages ({'role': str, 'content': str})")
        reward = out.get("reward") or 0.0
        number = reward_value(reward)
        if number is None:
            raise OmnigymError(f"--env skyrl:{self.name}: step() returned reward {shown_reward(reward)}; a reward is a "
                               f"finite number, at most {MAX_REWARD:g} in size")
        self.example["step_rewards"].append(number)
        self.messages += observations
        done = bool(out.get("done"))
        truncated = not done and self.turns >= self.max_turns
        if done or truncated:  # the episode's env is done with (its sessions, files, connections)
            self.skyrl.close()
        return list(self.messages), done, truncated, {"example": self.example, "metadata": out.get("metadata")}

    def demonstration(self, example: dict) -> list[dict] | None:
        """The warm-up's scripted episode: the example's own ``demonstration`` (the messages after
        the prompt), else the answer in the env's format for the single-reply envs that ship."""
        if example.get("demonstration"):
            return example["demonstration"]
        answer_format = dict(DEMONSTRATIONS).get(self.name)
        if answer_format:
            return [{"role": "assistant", "content": answer_format.format(answer=example["answer"])}]
        return None

    def __getstate__(self):  # a live skyrl env (sockets, sessions) does not travel; episodes make their own
        state = dict(self.__dict__)
        state["skyrl"] = None
        return state


def as_skyrl_row(example: dict, name: str) -> dict:
    """A question/answer example as a skyrl dataset row (kept as well: accuracy and samples read them)."""
    return {**example, "prompt": [{"role": "user", "content": str(example["question"])}], "env_class": name,
            "reward_spec": {"method": "rule", "ground_truth": str(example["answer"])}, "extra_info": {}}


def read_rows(path: str) -> list[dict] | None:
    """skyrl dataset rows from a jsonl file (rows with ``prompt``), else None (not that format)."""
    if not path.endswith(".jsonl") or not Path(path).is_file():
        return None
    from omnigym.tasks.datasets import read_jsonl

    rows = read_jsonl(path)  # each fault (not UTF-8, not JSON, not an object) is one line naming the file
    if not rows or "prompt" not in rows[0]:
        return None
    for number, row in enumerate(rows, 1):
        prompt = row.get("prompt")
        if isinstance(prompt, str):
            row["prompt"] = prompt = [{"role": "user", "content": prompt}]
        if not is_message_list(prompt):
            raise OmnigymError(f"--task {path}: row {number}'s prompt is not a string or a list of chat messages")
        row.setdefault("question", next((m["content"] for m in reversed(prompt) if m["role"] == "user"), ""))
        row.setdefault("answer", str((row.get("reward_spec") or {}).get("ground_truth", "")))
    return rows


def skyrl_task(cfg, spec: str):
    """``--task`` for ``--env skyrl:NAME``: a ``Task`` of skyrl rows with the env attached; every
    example is checked by making its env and calling ``init``, so bad data stops the run before
    anything is written."""
    from omnigym.envs.task_spec import Task, load_task

    name = resolve(spec)
    args = parse_env_args(cfg.env_args)
    rows = read_rows(cfg.task)
    if rows is not None:
        if len(rows) <= cfg.eval_size:
            raise OmnigymError(f"--task {cfg.task} has {len(rows)} rows, and --eval-size {cfg.eval_size} holds out that "
                               f"many or more; use --eval-size below {len(rows)}")
        random.Random(cfg.seed).shuffle(rows)
        train, heldout = rows[cfg.eval_size:], rows[:cfg.eval_size]
    else:
        task = load_task(cfg.task, cfg.seed, cfg.eval_size, cfg.digits, cfg.terms, cfg.operations)
        train, heldout = [as_skyrl_row(e, name) for e in task.train], [as_skyrl_row(e, name) for e in task.heldout]
    env = SkyrlEnv(name, train, args, cfg.max_turns, cfg.system_prompt or None)
    for example in train[:64] + heldout[:64]:  # each env asserts on its fields; a sample of both splits is checked
        env.reset(options={"example": example})
        env.skyrl.close()
    if cfg.sft_steps and env.demonstration(train[0]) is None:
        raise OmnigymError(f"--env skyrl:{name}: the warm-up (--sft-steps {cfg.sft_steps}) needs a 'demonstration' in "
                           "each example (the messages after the prompt); give --sft-steps 0 for a model that can "
                           "already answer")
    return Task(train, heldout, env)


def parse_env_args(text: str | None) -> dict:
    """``--env-args``: a JSON object, or nothing."""
    if not text:
        return {}
    try:
        args = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OmnigymError(f"--env-args must be a JSON object, e.g. '{{\"search_url\": \"...\"}}': {exc}") from None
    if not isinstance(args, dict):
        raise OmnigymError(f"--env-args must be a JSON object, got {type(args).__name__}")
    return args
