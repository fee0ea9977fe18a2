"""The agent endpoint, through the real ``openai`` client: chat, tool calls both ways,
log-probs, the bearer token, loopback only, and every request recorded as sampled."""

import asyncio
import copy
import json
import socket
import urllib.error
import urllib.request

import openai
import pytest

from agent_helpers import TOOL_TEMPLATE, ScriptedEngine
from omnigym.agents.episodes import AgentEpisodes, agent_metrics
from omnigym.agents.recorder import trajectories
from omnigym.agents.server import AgentServer
from omnigym.algos.lm.grpo import GRPOConfig, cut_off_lines
from omnigym.errors import OmnigymError
from omnigym.generators.turns import stitch
from omnigym.inference.engine import SamplingParams
from omnigym.inference.service import EngineService
from omnigym.models.lm import build_tiny_model, load_policy_and_tokenizer, stripped_special_tokens

ADD = {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    return load_policy_and_tokenizer(str(path))


@pytest.fixture
def tool_tokenizer(tiny):
    tokenizer = copy.deepcopy(tiny[1])
    tokenizer.chat_template = TOOL_TEMPLATE
    return tokenizer


class Endpoint:
    """An endpoint over ``engine`` for one test; ``record`` is its one open episode."""

    def __init__(self, engine, tokenizer, **kwargs):
        self.service = EngineService(engine)
        self.server = AgentServer(self.service, tokenizer, "tiny", kwargs.pop("max_new_tokens", 128), **kwargs).start()
        self.record = self.server.open_episode()
        self.client = self.server.client(self.record.episode_id)

    def close(self):
        self.server.close()
        self.service.close()


def serve(engine, tokenizer, agent, **kwargs):
    endpoint = Endpoint(engine, tokenizer, **kwargs)
    try:
        result = asyncio.run(agent(endpoint.client))
    finally:
        endpoint.close()
    return result, endpoint.record


def test_tool_call_round_trip_is_one_sequence_of_the_tokens_sampled(tool_tokenizer):
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    engine = ScriptedEngine(tool_tokenizer, [call, "<answer>5</answer>"])

    async def agent(client):
        messages = [{"role": "user", "content": "2+3?"}]
        first = await client.chat.completions.create(model="tiny", messages=messages, tools=[ADD])
        messages.append(first.choices[0].message)  # the way OpenAI's docs send the reply back
        tool_call = first.choices[0].message.tool_calls[0]
        arguments = json.loads(tool_call.function.arguments)
        messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": str(arguments["a"] + arguments["b"])})
        second = await client.chat.completions.create(model="tiny", messages=messages, tools=[ADD])
        return first, second

    (first, second), record = serve(engine, tool_tokenizer, agent)
    assert first.choices[0].finish_reason == "tool_calls"
    assert first.choices[0].message.content is None
    assert first.choices[0].message.tool_calls[0].function.name == "add"
    assert json.loads(first.choices[0].message.tool_calls[0].function.arguments) == {"a": 2, "b": 3}
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content == "<answer>5</answer>"
    assert second.choices[0].message.tool_calls is None
    assert first.usage.completion_tokens == len(engine.calls[0][2].completion_ids)
    assert first.usage.prompt_tokens == len(engine.calls[0][0])

    # recorded as sampled: the prompts the engine got, the ids it generated, their log-probs
    assert [t.prompt_ids for t in record.turns] == [c[0] for c in engine.calls]
    assert [t.completion_ids for t in record.turns] == [c[2].completion_ids for c in engine.calls]
    assert [t.logprobs for t in record.turns] == [c[2].logprobs for c in engine.calls]
    # the second prompt continues the first prompt and reply token for token: one sequence
    first_turn, second_turn = record.turns
    assert second_turn.prompt_ids[:len(first_turn.prompt_ids) + len(first_turn.completion_ids)] == \
        first_turn.prompt_ids + first_turn.completion_ids
    [sequence] = stitch(record.turns)
    inserted = len(second_turn.prompt_ids) - len(first_turn.prompt_ids) - len(first_turn.completion_ids)
    assert sequence.loss_mask == [1] * len(first_turn.completion_ids) + [0] * inserted + \
        [1] * len(second_turn.completion_ids)
    inserted_text = tool_tokenizer.decode(sequence.response_ids[len(first_turn.completion_ids):][:inserted])
    assert inserted_text == "<|tool|>5<|end|><|assistant|>"  # the tool's reply and the template's markers, masked
    assert record.exchanges[0].tool_calls[0]["function"]["name"] == "add"

    [trajectory] = trajectories(record, 1.0, {}, 0, {"question": "2+3?"}, 0)
    assert trajectory.response_ids == sequence.response_ids and trajectory.info["tool_calls"] == 1
    assert trajectory.info["turns"] == 2 and "error" not in trajectory.info


def test_qwen25s_own_template_round_trip(tiny):
    """Qwen2.5's chat template as Qwen ships it (TRL keeps the original): it shows the tools,
    the model's Hermes tool call parses, and the agent's history (arguments as OpenAI's JSON
    string) renders back as the model wrote it, so the episode stays one sequence."""
    trl = pytest.importorskip("trl")
    from pathlib import Path

    tokenizer = copy.deepcopy(tiny[1])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.eos_token = "<|im_end|>"  # Qwen's end of turn, a token of its own as in Qwen's vocabulary
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    engine = ScriptedEngine(tokenizer, [call, "5"])

    async def agent(client):
        messages = [{"role": "user", "content": "2+3?"}]
        first = await client.chat.completions.create(model="qwen", messages=messages, tools=[ADD])
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        call_id = first.choices[0].message.tool_calls[0].id
        messages.append({"role": "tool", "tool_call_id": call_id, "content": "5"})
        await client.chat.completions.create(model="qwen", messages=messages, tools=[ADD])
        return first

    first, record = serve(engine, tokenizer, agent)
    assert '"name": "add"' in tokenizer.decode(record.turns[0].prompt_ids)  # the tools are in the prompt
    assert first.choices[0].finish_reason == "tool_calls"
    assert json.loads(first.choices[0].message.tool_calls[0].function.arguments) == {"a": 2, "b": 3}
    [sequence] = stitch(record.turns)
    inserted = [t for t, m in zip(sequence.response_ids, sequence.loss_mask) if m == 0]
    assert tokenizer.decode(inserted) == "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n" \
                                        "<|im_start|>assistant\n"


def test_logprobs_are_the_engines(tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["hello"])

    async def agent(client):
        return await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                    logprobs=True, max_tokens=3)

    reply, record = serve(engine, tool_tokenizer, agent)
    assert reply.choices[0].finish_reason == "length" and reply.choices[0].message.content == "hel"
    assert [t.token for t in reply.choices[0].logprobs.content] == ["h", "e", "l"]
    assert [t.logprob for t in reply.choices[0].logprobs.content] == pytest.approx([-0.01, -0.02, -0.03])
    assert engine.calls[0][1].max_new_tokens == 3  # max_tokens reached the engine
    assert record.turns[0].finished is False



def test_a_cut_off_reply_says_which_limit_cut_it(tool_tokenizer):
    """An agent that caps its own replies (max_tokens 8 under the run's 16) was told to raise
    --max-new-tokens: each reply cut off says what it ran into, and so do the run's metrics."""
    engine = ScriptedEngine(tool_tokenizer, ["a" * 30] * 4 + ["hi"])

    async def agent(client):
        async def ask(content, **limits):
            return await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}],
                                                        **limits)
        return [await ask("x", max_tokens=8), await ask("x"), await ask("x", max_tokens=40),
                await ask("y" * 30), await ask("x", max_tokens=8)]  # the prompt 33 tokens: 7 left of 40

    replies, record = serve(engine, tool_tokenizer, agent, max_new_tokens=16, context=40)
    assert [r.choices[0].finish_reason for r in replies] == ["length"] * 4 + ["stop"]
    assert [e.cut_by for e in record.exchanges] == ["max_tokens", "--max-new-tokens", "--max-new-tokens", "context",
                                                    None]
    assert [len(t.completion_ids) for t in record.turns] == [8, 16, 16, 7, 3]
    items = trajectories(record, 0.0, {}, 0, {}, 0)
    assert items[0].info["cut_by"] == ["--max-new-tokens", "context", "max_tokens"]
    assert [turn.get("cut_by") for turn in items[0].info["transcript"]] == [e.cut_by for e in record.exchanges]

    engine = ScriptedEngine(tool_tokenizer, ["a" * 60])  # the reviewer's case: its own max_tokens only

    async def capped(client):
        await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=40)

    _, record = serve(engine, tool_tokenizer, capped, max_new_tokens=64)
    logged = [{"completion/cut_off_fraction": 1.0, **agent_metrics(trajectories(record, 0.0, {}, 0, {}, 0))}]
    assert logged[0]["completion/cut_by_max_tokens_fraction"] == 1.0
    assert logged[0]["completion/cut_by_max_new_tokens_fraction"] == 0.0
    said = "\n".join(cut_off_lines(GRPOConfig(max_new_tokens=64), logged, 100.0))
    assert "by the agent's own max_tokens: 100.0% (raise max_tokens in its requests" in said
    assert "raise --max-new-tokens" not in said, said


def test_special_tokens_a_reply_loses_in_decoding_are_shown(tool_tokenizer):
    """An untrained model wrote nothing but special tokens: the agent gets "" as vLLM would
    answer (skip_special_tokens), and samples.jsonl says what was left out instead of a bare ""."""
    engine = ScriptedEngine(tool_tokenizer, ["<|user|><|user|>ab", "plain"])
    seen = []

    async def agent(client):
        for _ in range(2):
            reply = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
            seen.append(reply.choices[0].message.content)

    _, record = serve(engine, tool_tokenizer, agent)
    assert seen == ["ab", "plain"]  # what the agent reads, and scores, is as before
    first, second = trajectories(record, 0.0, {}, 0, {}, 0)[0].info["transcript"]
    assert first["reply"] == "ab" and first["special_tokens_stripped"] == 2  # the ending <|end|> is no news
    assert first["with_special_tokens"] == "<|user|><|user|>ab<|end|>"
    assert second == {"asked": {"role": "user", "content": "x"}, "reply": "plain", "tool_calls": [],
                      "finish_reason": "stop"}
    # a sample row counts the model's own tokens only: the template's markers between turns are not its doing
    ids = tool_tokenizer("<|user|>a<|tool|>b<|end|>", add_special_tokens=False)["input_ids"]
    assert stripped_special_tokens(tool_tokenizer, ids, [1, 1, 0, 1, 1]) == \
        {"special_tokens_stripped": 1, "with_special_tokens": "<|user|>a<|tool|>b<|end|>"}
    assert stripped_special_tokens(tool_tokenizer, ids[1:], [1, 0, 1, 1]) == {}

@pytest.mark.parametrize("kind", ["kv", "hf"])
def test_real_engine_tokens_are_recorded_as_sampled(tiny, kind):
    """The tiny model's own samplers behind the endpoint: the recorded turn is what they made."""
    from omnigym.inference import make_engine

    policy, tokenizer = tiny
    engine = make_engine(policy, tokenizer, kind)
    made = []
    generate = engine.generate

    def keep(prompts, n, params):
        out = generate(prompts, n, params)
        made.extend(s for group in out for s in group)
        return out

    engine.generate = keep

    async def agent(client):
        messages = [{"role": "user", "content": "1+1"}]
        first = await client.chat.completions.create(model="tiny", messages=messages, logprobs=True)
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "sure?"}]
        second = await client.chat.completions.create(model="tiny", messages=messages)
        return first, second

    (first, _), record = serve(engine, tokenizer, agent, max_new_tokens=12, context=256)
    assert [t.completion_ids for t in record.turns] == [s.completion_ids for s in made]
    assert [t.logprobs for t in record.turns] == [s.logprobs for s in made]
    assert [t.logprob for t in first.choices[0].logprobs.content] == pytest.approx(made[0].logprobs)
    assert first.choices[0].message.content == tokenizer.decode(made[0].completion_ids, skip_special_tokens=True)


def test_token_ids_top_k_and_tool_choice_none(tool_tokenizer):
    """vLLM's extensions that verifiers' clients send (return_token_ids, top_k through
    extra_body) are served; tool_choice "none" leaves a tool-call-looking reply as text."""
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>'
    engine = ScriptedEngine(tool_tokenizer, [call])

    async def agent(client):
        return await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "1+1"}],
                                                    tools=[ADD], tool_choice="none",
                                                    extra_body={"return_token_ids": True, "top_k": 5})

    reply, record = serve(engine, tool_tokenizer, agent)
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].message.content == call
    assert reply.choices[0].finish_reason == "stop"
    assert reply.prompt_token_ids == record.turns[0].prompt_ids
    assert reply.choices[0].token_ids == record.turns[0].completion_ids
    assert engine.calls[0][1].top_k == 5


def test_a_rewritten_history_starts_a_new_sequence(tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["one", "two"])

    async def agent(client):
        await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "first"}])
        await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "other"}])

    _, record = serve(engine, tool_tokenizer, agent)
    sequences = stitch(record.turns)
    assert len(sequences) == 2 and all(s.loss_mask == [1] * 4 for s in sequences)  # 3 letters and end-of-sequence
    assert len(trajectories(record, 0.5, {}, 3, {}, 0)) == 2


def test_stop_strings_cut_the_reply_and_its_tokens(tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["abc STOP def"])

    async def agent(client):
        return await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                                    stop=["STOP"])

    reply, record = serve(engine, tool_tokenizer, agent)
    assert reply.choices[0].message.content == "abc " and reply.choices[0].finish_reason == "stop"
    assert tool_tokenizer.decode(record.turns[0].completion_ids) == "abc STOP"
    assert record.turns[0].logprobs == pytest.approx([-0.01 * (i + 1) for i in range(8)])


def test_requests_need_the_runs_token(tool_tokenizer):
    endpoint = Endpoint(ScriptedEngine(tool_tokenizer, ["x"]), tool_tokenizer)
    url = endpoint.server.base_url(endpoint.record.episode_id) + "/chat/completions"
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}).encode()
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": endpoint.server.key(endpoint.record.episode_id)}):
            request = urllib.request.Request(url, body, {"Content-Type": "application/json", **headers})
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(request, timeout=10)
            assert caught.value.code == 401
        wrong = openai.AsyncOpenAI(base_url=endpoint.server.base_url(endpoint.record.episode_id), api_key="guess",
                                   max_retries=0)

        async def models(client):
            return await client.models.list()

        with pytest.raises(openai.AuthenticationError):
            asyncio.run(models(wrong))
        assert [m.id for m in asyncio.run(models(endpoint.client)).data] == ["tiny"]
        assert endpoint.record.turns == []  # nothing was sampled for the refused requests
    finally:
        endpoint.close()


def test_the_endpoint_binds_loopback_only(tool_tokenizer):
    endpoint = Endpoint(ScriptedEngine(tool_tokenizer, []), tool_tokenizer)
    try:
        assert [address[0] for address in endpoint.server._runner.addresses] == ["127.0.0.1"]
        assert endpoint.server.port > 0
        outside = [ip for ip in _own_addresses() if not ip.startswith("127.")]
        for ip in outside:  # the machine's other addresses do not reach it
            with pytest.raises(OSError):
                socket.create_connection((ip, endpoint.server.port), timeout=2).close()
    finally:
        endpoint.close()


def _own_addresses() -> set:
    try:
        return {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    except OSError:
        return set()


def test_unservable_requests_get_400_or_404(tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, ["x"])
    endpoint = Endpoint(engine, tool_tokenizer, context=40)
    hi = [{"role": "user", "content": "hi"}]

    async def ask(client, **kwargs):
        return await client.chat.completions.create(model="tiny", **{"messages": hi, **kwargs})

    cases = [({"n": 2}, "n=2"), ({"messages": []}, "messages must be"), ({"temperature": -1}, "temperature"),
             ({"max_tokens": 0}, "max_tokens"), ({"top_logprobs": 3, "logprobs": True}, "top_logprobs"),
             ({"messages": [{"role": "user", "content": "x" * 60}]}, "context is 40")]

    async def all_cases():  # one event loop: a client's connections belong to the loop that made them
        for kwargs, words in cases:
            with pytest.raises(openai.BadRequestError, match=words):
                await ask(endpoint.client, **kwargs)
        ended = endpoint.server.open_episode()  # an episode's own client, after the episode ended
        gone = endpoint.server.client(ended.episode_id)
        endpoint.server.close_episode(ended.episode_id)
        with pytest.raises(openai.NotFoundError):
            await ask(gone)

    try:
        asyncio.run(all_cases())
        assert engine.calls == [] and endpoint.record.turns == []
    finally:
        endpoint.close()


def test_an_engine_failure_stops_the_run_not_just_the_episode(tool_tokenizer):
    """The agent sees a 500; the episode's play raises the engine's own error afterwards."""
    class Broken(ScriptedEngine):
        def generate(self, prompts, n, params):
            raise RuntimeError("out of memory")

    async def agent(client, example):
        await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        return 1.0

    episodes = AgentEpisodes(agent, Broken(tool_tokenizer, []), tool_tokenizer, SamplingParams(max_new_tokens=8))
    try:
        with pytest.raises(RuntimeError, match="out of memory"):
            asyncio.run(episodes.play({}, 0))
    finally:
        episodes.close()


def test_a_template_without_tools_refuses_a_request_with_tools(tiny):
    """The tiny model's own template ignores tools=: the request is refused, and the run stops
    in one line rather than train on prompts that never showed the model its tools."""
    _, tokenizer = tiny
    engine = ScriptedEngine(tokenizer, ["x"])

    async def agent(client, example):
        await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], tools=[ADD])
        return 1.0

    episodes = AgentEpisodes(agent, engine, tokenizer, SamplingParams(max_new_tokens=8))
    try:
        with pytest.raises(OmnigymError, match="chat template ignores tools="):
            asyncio.run(episodes.play({}, 0))
    finally:
        episodes.close()
    assert engine.calls == []


def test_which_templates_take_tools(tiny, tool_tokenizer):
    """The tiny model's and SmolLM2-135M's templates ignore tools= (a request with tools is
    refused for them); the Hermes-style one of these tests and Qwen2.5's show them."""
    from pathlib import Path

    from omnigym.agents.chat import template_takes_tools

    assert not template_takes_tools(tiny[1]) and template_takes_tools(tool_tokenizer)
    smollm2 = Path(__file__).parent.parent / "models" / "smollm2-135m-instruct" / "chat_template.jinja"
    if smollm2.exists():  # made by `make smollm2`
        tokenizer = copy.deepcopy(tiny[1])
        tokenizer.chat_template = smollm2.read_text()
        assert not template_takes_tools(tokenizer)


def test_a_body_over_the_cap_is_refused_unread(tool_tokenizer):
    endpoint = Endpoint(ScriptedEngine(tool_tokenizer, []), tool_tokenizer, max_request_bytes=4096)
    url = endpoint.server.base_url(endpoint.record.episode_id) + "/chat/completions"
    body = json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json",
                                                 "Authorization": f"Bearer {endpoint.server.key(endpoint.record.episode_id)}"})
    try:
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=30)
        assert caught.value.code == 413 and endpoint.record.turns == []
    finally:
        endpoint.close()


def test_the_endpoint_modules_touch_no_files_or_processes():
    """What a request names is never a path: the endpoint's modules call nothing that opens,
    lists, removes or runs anything (the agent's own code is the user's, docs/agents.md)."""
    import ast
    from pathlib import Path

    import omnigym.agents

    forbidden = {"open", "Path", "remove", "unlink", "rmtree", "listdir", "scandir", "walk", "system", "popen",
                 "run", "Popen", "exec", "eval", "read_text", "write_text", "read_bytes", "write_bytes"}
    folder = Path(omnigym.agents.__file__).parent
    for name in ("server.py", "chat.py", "recorder.py"):
        tree = ast.parse((folder / name).read_text())
        called = {node.func.id if isinstance(node.func, ast.Name) else node.func.attr
                  for node in ast.walk(tree) if isinstance(node, ast.Call)
                  and isinstance(node.func, (ast.Name, ast.Attribute))}
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                    for alias in node.names} | {node.module.split(".")[0] for node in ast.walk(tree)
                                                 if isinstance(node, ast.ImportFrom) and node.module}
        assert not called & forbidden, (name, called & forbidden)
        assert not imported & {"os", "shutil", "subprocess", "pathlib"}, name
