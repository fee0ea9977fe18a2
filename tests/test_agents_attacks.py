"""The agent endpoint and the agent's return value under hostile or careless use: each case
here was found by trying it (issue 26, h-try) and fails without its fix."""

import asyncio
import copy
import urllib.error
import urllib.request

import openai
import pytest

from agent_helpers import TOOL_TEMPLATE, ScriptedEngine
from omnigym.agents.episodes import BadReturn, reward_of
from omnigym.agents.server import AgentServer
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
                                     {"Content-Type": "application/json", "Authorization": f"Bearer {server.token}"})
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


def test_large_but_representable_rewards_still_count():
    assert reward_of(1e15) == (1e15, {})
    assert reward_of({"a": -5e14, "b": 2.0}) == (-5e14 + 2.0, {"a": -5e14, "b": 2.0})
