"""The agent endpoint and the agent's return value under hostile or careless use: each case
here was found by trying it (issue 26, h-try) and fails without its fix."""

import asyncio
import copy
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from fractions import Fraction

import openai
import pytest

import omnigym.agents.server as agent_server
from agent_helpers import TOOL_TEMPLATE, ScriptedEngine
from omnigym.agents.episodes import AgentGenerator, BadReturn, reward_of
from omnigym.agents.server import AgentServer
from omnigym.errors import OmnigymError
from omnigym.inference.service import EngineService
from omnigym.models.lm import build_tiny_model, load_policy_and_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    tokenizer = copy.deepcopy(load_policy_and_tokenizer(str(build_tiny_model(tmp_path_factory.mktemp("tiny"))))[1])
    tokenizer.chat_template = TOOL_TEMPLATE
    return tokenizer


@pytest.fixture
def endpoint(tokenizer):
    engine = ScriptedEngine(tokenizer, ["ok", "ok"])
    service = EngineService(engine)
    server = AgentServer(service, tokenizer, "tiny", 16).start()
    record = server.open_episode()
    yield engine, server, record
    server.close()
    service.close()


def post(server, record, body: bytes):
    request = urllib.request.Request(server.base_url(record.episode_id) + "/chat/completions", body,
                                     {"Content-Type": "application/json", "Authorization": f"Bearer {server.key(record.episode_id)}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_json_nested_too_deep_is_a_400_not_a_server_error(endpoint, capfd):
    """json's parser raises RecursionError (not ValueError) on deep nesting: it was a 500 with
    aiohttp's traceback on the run's stderr."""
    engine, server, record = endpoint
    status, text = post(server, record, b'{"messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert status == 400 and "not JSON" in text
    assert "Traceback" not in capfd.readouterr().err
    assert engine.calls == [] and record.turns == [] and record.crash is None


def test_a_message_without_a_role_is_a_400(endpoint):
    """The template printed a missing role as nothing (``<||>hi``) and the model was sampled on it."""
    engine, server, record = endpoint
    status, text = post(server, record, b'{"messages": [{"content": "hi"}]}')
    assert status == 400 and "needs a role" in text
    assert engine.calls == [] and record.turns == []


def test_an_episodes_url_refuses_another_live_episodes_client(endpoint):
    """An agent that kept the first episode's base URL (or the first episode's client) and posts
    there from a second live episode got 200, and its turns landed in the first episode."""
    engine, server, first = endpoint
    second = server.open_episode()
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    for url_of, key_of in ((first, second), (second, first)):
        request = urllib.request.Request(server.base_url(url_of.episode_id) + "/chat/completions", body,
                                         {"Content-Type": "application/json",
                                          "Authorization": f"Bearer {server.key(key_of.episode_id)}"})
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=30)
        assert caught.value.code == 403 and "another episode" in caught.value.read().decode()
    # a key asking for an episode id that does not exist is told the same: nothing about the id
    request = urllib.request.Request(server.base_url("0" * 16) + "/models",
                                     headers={"Authorization": f"Bearer {server.key(first.episode_id)}"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 403
    assert engine.calls == [] and first.turns == [] and second.turns == []
    assert post(server, second, body)[0] == 200 and len(second.turns) == 1 and first.turns == []


def test_a_message_too_long_for_the_context_is_refused_before_it_is_tokenized(tokenizer, monkeypatch):
    """A 10 MB message was rendered and tokenized whole (4.5 GB and 60 s on SmolLM2's tokenizer)
    before the context check refused it."""
    engine = ScriptedEngine(tokenizer, ["ok"])
    service = EngineService(engine)
    server = AgentServer(service, tokenizer, "tiny", 16, context=128).start()
    record = server.open_episode()
    rendered = []
    real_render = agent_server.render
    monkeypatch.setattr(agent_server, "render", lambda *a, **k: rendered.append(1) or real_render(*a, **k))
    try:
        status, text = post(server, record, json.dumps({"messages": [{"role": "user", "content": "x" * 10_000_000}]})
                            .encode())
        assert status == 400 and "characters, more than the model's context of 128 tokens can hold" in text
        assert rendered == [] and engine.calls == [] and record.turns == []
        # one that fits goes through
        assert post(server, record, json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode())[0] == 200
        assert rendered == [1]
    finally:
        server.close()
        service.close()


def test_text_content_parts_are_rendered_as_their_text(endpoint, tokenizer):
    """openai's content parts ([{"type": "text", "text": ...}]) reached the template as a list,
    which it printed as Python's repr; now the prompt is the one plain text gives."""
    engine, server, record = endpoint
    client = server.client(record.episode_id)

    async def ask():
        await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": [{"type": "text", "text": "2+3?"}]}])
        with pytest.raises(openai.BadRequestError, match="content parts other than"):
            await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}])
        for content in (5, {"text": "2+3?"}):  # they reached the model as their Python repr
            with pytest.raises(openai.BadRequestError, match="message content must be text, a list of text parts"):
                await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}])

    asyncio.run(ask())
    expected = tokenizer.apply_chat_template([{"role": "user", "content": "2+3?"}], add_generation_prompt=True,
                                             tokenize=False)
    assert [call[0] for call in engine.calls] == [tokenizer(expected, add_special_tokens=False)["input_ids"]]


@pytest.mark.parametrize("result", [1e300, -3e38, {"a": 1e300}, {"a": 9e14, "b": 9e14}])
def test_a_reward_too_large_for_float32_is_a_bad_return(result):
    """1e300 is a finite Python float and inf as the float32 the trainer's tensors hold: it made
    ``reward/mean`` Infinity and the group's advantages meaningless."""
    with pytest.raises(BadReturn, match="at most 1e"):
        reward_of(result)


class Evil(float):
    """Checked as 0.5, and 1e300 to float(): the check and the value used were two readings."""

    def __float__(self):
        return 1e300


@pytest.mark.parametrize("result", [10**400, 10**5000, Fraction(10**400), {"a": 10**400}, Evil(0.5), {"a": Evil(0.5)}],
                         ids=["int-400-digits", "int-5000-digits", "fraction", "part-int", "float-subclass",
                              "part-float-subclass"])
def test_a_reward_that_is_no_float_is_a_bad_return_not_a_traceback(result):
    """An int of 400 digits (or a Fraction of one) was an OverflowError in the check, a trained run's traceback; an int
    of 5,000 digits has no repr for the message; a float subclass passed as 0.5 and was summed as 1e300."""
    with pytest.raises(BadReturn, match="at most 1e"):
        reward_of(result)


@pytest.mark.parametrize("name", ["mean", "std", "../x", "a/b", "", "x" * 65, "1st"])
def test_a_reward_part_cannot_take_another_metrics_name(name):
    """{"mean": 0.25, ...} was logged as reward/mean over the step's true mean; "../x" made a metric outside reward/."""
    with pytest.raises(BadReturn, match="reward part named"):
        reward_of({name: 0.25, "ok": 0.1})


def test_each_type_of_bad_return_is_its_own_kind_said_once():
    """All bad returns were one kind, said once: a nan said first hid the dicts of text that followed."""
    kinds = []
    for result in (float("nan"), {"a": "x"}, 1e300, "fine", None):
        with pytest.raises(BadReturn) as caught:
            reward_of(result)
        kinds.append(caught.value.args[0])
        assert caught.value.args[1].startswith(f"the agent returned {result!r}"[:30])
    assert kinds == ["returned float", "returned dict", "returned float", "returned str", "returned NoneType"]


def test_large_but_representable_rewards_still_count():
    assert reward_of(1e15) == (1e15, {})
    assert reward_of({"a": -5e14, "b": 2.0}) == (-5e14 + 2.0, {"a": -5e14, "b": 2.0})


def test_text_reinforce_with_a_tool_agent_does_not_point_to_a_flag_it_lacks(tmp_path):
    """The refusal said "give --chat-template", which text_reinforce does not accept (an
    "Unrecognized options" error was the user's next step). And with several episodes raising
    it, asyncio.run's shutdown printed a traceback for the second (1 run in 3 with 2 episodes):
    the one line must be the only one."""
    (tmp_path / "tool_agent.py").write_text(
        "async def run(client, example):\n"
        "    await client.chat.completions.create(model='m', messages=[{'role': 'user', 'content': 'hi'}],\n"
        "        tools=[{'type': 'function', 'function': {'name': 'f', 'parameters': {'type': 'object'}}}])\n"
        "    return 1.0\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "omnigym", "train", "text_reinforce", "--agent", "tool_agent:run",
                           "--steps", "1", "--batch-size", "8", "--max-new-tokens", "4", "--run-dir", "runs/r",
                           "--no-progress", "--no-plot"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "ignores tools=" in line and "grpo --chat-template" in line and "text_reinforce takes no --chat-template" \
        in line
    assert not (tmp_path / "runs" / "r").exists()


class _TwoFatalEpisodes:
    """The first episode stops the run; the other, cancelled, raises as it ends (as an episode
    whose record holds the same fatal error does)."""

    async def play(self, example, group_id):
        if group_id == 0:
            raise OmnigymError("the run stops")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            raise OmnigymError("the run stops") from None


def test_a_run_stopping_episode_ends_the_others_without_a_traceback(caplog):
    """asyncio.run's shutdown logged the second episode's error with its traceback (the CLI's
    stderr, before the one line), in 1 run of 3 of a text_reinforce with a tool agent."""
    generator = AgentGenerator(_TwoFatalEpisodes(), concurrency=4)
    with pytest.raises(OmnigymError, match="the run stops"):
        asyncio.run(generator._play_all([{}, {}], 1))
    assert not [r for r in caplog.records if "unhandled exception" in r.getMessage()]


SKYRL_ENV = '''
import sys
import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput


class Env(BaseTextEnv):
    def __init__(self, env_config=None, extras={}):
        super().__init__()
        self.kind = env_config["kind"]

    def step(self, action):
        if self.kind == "exit":
            sys.exit(4)
        return BaseTextEnvStepOutput(observations=[{"role": 5, "content": "x"}], reward=0.0, done=False, metadata={})


if "h_try_env" not in skyrl_gym.registry:
    skyrl_gym.register(id="h_try_env", entry_point=Env)
'''


@pytest.mark.parametrize("kind, words", [
    # sys.exit in the env's step ended the run with exit status 4 and not a word
    ("exit", "--env skyrl:h_try_env: step() raised SystemExit: 4"),
    # a list whose message has a non-string role was said to be "of type list", which it is
    ("role", "observations of type list, not all {'role': str, 'content': str}")])
def test_a_skyrl_env_that_exits_or_answers_a_bad_message_is_one_line(tmp_path, kind, words):
    pytest.importorskip("skyrl_gym")
    (tmp_path / "h_try_env.py").write_text(SKYRL_ENV)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "omnigym", "train", "grpo", "--env", "skyrl:h_try_env:h_try_env",
                           "--env-args", json.dumps({"kind": kind}), "--sft-steps", "0", "--steps", "1",
                           "--prompts-per-step", "1", "--group-size", "2", "--eval-size", "1", "--max-new-tokens", "4",
                           "--max-turns", "2", "--run-dir", "runs/r", "--no-progress", "--no-plot"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert words in line
    assert not (tmp_path / "runs" / "r").exists()


def test_heldout_accuracy_counts_each_episode_once_whatever_the_agent_sends(tokenizer):
    """An agent episode of many separate requests is many sequences, each with the episode's
    reward: accuracy counted them (1,000 requests made it 500.5). It is a rate: each example's
    episode counts once, so it stays in [0, 1]."""
    from omnigym.evaluation.text import accuracy
    from omnigym.generators.base import Trajectories, Trajectory

    class Judge:  # example 0: one episode of three sequences, correct; example 1: wrong; 2: failed
        def generate(self, examples, group_size):
            one = lambda group, reward, **info: Trajectory([1], [2], [1], [0.0], reward, group, 0, examples[group],  # noqa: E731
                                                           info)
            return Trajectories([one(0, 1.0, sequence=0), one(0, 1.0, sequence=1), one(0, 1.0, sequence=2),
                                 one(1, 0.0), one(2, 1.0, error="the agent raised ValueError")])

    assert accuracy(Judge(), tokenizer, [{"i": 0}, {"i": 1}, {"i": 2}]) == pytest.approx(1 / 3)


def test_a_step_where_every_episode_fails_is_skipped_not_a_traceback(tmp_path, monkeypatch, capsys):
    """Every agent episode raising before its first request left a batch with no tokens, and the
    step ended the run with ``IndexError: argmax()`` from rl/advantages.py."""
    from omnigym.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "always_raise.py").write_text("async def run(client, example):\n    raise ValueError('down')\n")
    flags = ["--agent", "always_raise:run", "--sft-steps", "0", "--prompts-per-step", "2", "--group-size", "2",
             "--eval-size", "2", "--eval-every", "100", "--no-progress", "--no-plot", "--no-tensorboard"]
    assert main(["train", "grpo", *flags, "--steps", "2", "--run-dir", "two"]) in (0, None)  # skipped, counted
    logged = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["agent/errors"], r["groups/kept_fraction"], r["steps/no_usable_episode"])
            for r in logged if "reward/mean" in r] == [(4, 0.0, 1.0)] * 2
    assert "Traceback" not in capsys.readouterr().err
    # three such steps in a row: the run stops with one line, checkpointed, and says how to go on
    assert main(["train", "grpo", *flags, "--steps", "10", "--run-dir", "ten"]) == 2
    err = capsys.readouterr().err
    assert "every episode failed in 3 steps in a row (steps 1-3" in err and "--resume" in err
    assert "Traceback" not in err
    logged = [json.loads(line) for line in (tmp_path / "ten" / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in logged if "reward/mean" in r] == [1, 2, 3]
