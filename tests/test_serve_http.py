"""What omnigym's three HTTP servers share (``serve/http.py``): one API-key check with one
401 line, and one capped body read, on ``omnigym serve``, ``serve-rm`` and the agent endpoint."""

import copy
import http.client
import json
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytest.importorskip("fastapi", reason="the [serve] extra")

from agent_helpers import TOOL_TEMPLATE, ScriptedEngine  # noqa: E402
from omnigym.agents.server import AgentServer  # noqa: E402
from omnigym.errors import OmnigymError  # noqa: E402
from omnigym.inference.service import EngineService  # noqa: E402
from omnigym.serve import reward_server  # noqa: E402
from omnigym.serve.app import Limits, make_app  # noqa: E402
from omnigym.serve.http import key_matches, presented_key  # noqa: E402
from omnigym.serve.store import Store  # noqa: E402
from serve_helpers import FakeHub, serving  # noqa: E402


class CountingScorer:
    """Stands in for a loaded reward model: scores every row 0 and counts its calls."""

    folder = Path("run/model")
    info = {"conversational": False}
    batch_size = 1

    def __init__(self):
        self.calls = 0

    def __call__(self, completions, examples):
        import torch

        self.calls += 1
        return torch.zeros(len(completions))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from omnigym.models.lm import build_tiny_model, load_policy_and_tokenizer

    tokenizer = copy.deepcopy(load_policy_and_tokenizer(str(build_tiny_model(tmp_path_factory.mktemp("tiny"))))[1])
    tokenizer.chat_template = TOOL_TEMPLATE
    return tokenizer


def send(url: str, path: str, body: bytes, headers: dict, chunked: bool = False) -> tuple[int, str]:
    """A POST over a fresh connection; ``chunked``: without a Content-Length, in 1000-byte chunks."""
    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    try:
        if chunked:
            connection.putrequest("POST", where.path + path)
            for name, value in {**headers, "Transfer-Encoding": "chunked"}.items():
                connection.putheader(name, value)
            connection.endheaders()
            for start in range(0, len(body), 1000):
                part = body[start:start + 1000]
                connection.send(b"%x\r\n%s\r\n" % (len(part), part))
            connection.send(b"0\r\n\r\n")
        else:
            connection.request("POST", where.path + path, body, headers)
        answer = connection.getresponse()
        return answer.status, answer.read().decode()
    finally:
        connection.close()


def message(text: str) -> str:
    """The error's one line, from FastAPI's {"detail"} or OpenAI's {"error": {"message"}}."""
    body = json.loads(text)
    return body["detail"] if "detail" in body else body["error"]["message"]


def test_key_matches_any_configured_key_and_bearer_needs_its_scheme():
    assert key_matches("second", ["first", "second"]) and not key_matches("secon", ["first", "second"])
    assert not key_matches("", ["first"]) and not key_matches("first", [])

    class Asked:
        def __init__(self, **headers):
            self.headers = headers

    assert presented_key(Asked(authorization="Bearer k-1"), "authorization") == "k-1"
    assert presented_key(Asked(authorization="k-1"), "authorization") == ""  # a bare key is no key
    assert presented_key(Asked(**{"x-api-key": "tml-k"}), "x-api-key") == "tml-k"


def test_the_three_servers_refuse_a_wrong_key_in_the_same_line(tmp_path, tokenizer):
    hub = FakeHub("tiny-base", tmp_path / "hub")
    app = make_app(hub, Store(tmp_path / "serve.db"), api_key="tml-the-secret-key", limits=Limits(poll_s=1))
    with serving(app) as url:
        for key in ("tml-wrong-key-000", ""):
            status, text = send(url, "/api/v1/create_session", b"{}", {"X-API-Key": key})
            assert (status, message(text)) == (401, "missing or wrong API key (X-API-Key)")
        assert send(url, "/api/v1/create_session", b"{}", {"X-API-Key": "tml-the-secret-key"})[0] == 200

    scorer = CountingScorer()
    with serving(reward_server.make_reward_app(scorer, api_keys=["rm-key-0123"])) as url:
        body = json.dumps({"completions": ["a"], "prompts": ["q"]}).encode()
        for given in ("Bearer rm-key-9999", "rm-key-0123", ""):  # a bare key, without Bearer, is refused too
            status, text = send(url, "/score", body, {"Authorization": given})
            assert (status, message(text)) == (401, "missing or wrong API key (Authorization: Bearer KEY)")
        assert scorer.calls == 0
        assert send(url, "/score", body, {"Authorization": "Bearer rm-key-0123"}) == (200, '{"scores":[0.0]}')

    service = EngineService(ScriptedEngine(tokenizer, ["ok"]))
    server = AgentServer(service, tokenizer, "tiny", 8).start()
    try:
        record = server.open_episode()
        url, body = server.base_url(record.episode_id), json.dumps({"messages": [{"role": "user", "content": "hi"}]})
        for given in ("Bearer wrong", server.key(record.episode_id), ""):
            status, text = send(url, "/chat/completions", body.encode(), {"Authorization": given})
            assert status == 401 and message(text) == ("missing or wrong API key (Authorization: Bearer KEY); "
                                                       "use the client this run gave the agent")
        assert record.turns == []
        assert send(url, "/chat/completions", body.encode(), {"Authorization": f"Bearer {server.key(record.episode_id)}"})[0] == 200
    finally:
        server.close()
        service.close()


def test_a_body_over_the_cap_is_413_on_each_server_with_or_without_a_length(tmp_path, tokenizer, monkeypatch):
    """A chunked body has no Content-Length to refuse it by: it is cut off as it is read."""
    hub = FakeHub("tiny-base", tmp_path / "hub")
    big = json.dumps({"padding": "x" * 6000}).encode()
    with serving(make_app(hub, Store(tmp_path / "serve.db"), limits=Limits(poll_s=1, max_request_bytes=4096))) as url:
        for chunked in (False, True):
            status, text = send(url, "/api/v1/create_session", big, {"X-API-Key": "tml-alice-key"}, chunked)
            assert (status, message(text)) == (413, "request body over 4096 bytes")
    assert hub.calls == []

    monkeypatch.setattr(reward_server, "MAX_REQUEST_BYTES", 4096)
    scorer = CountingScorer()
    with serving(reward_server.make_reward_app(scorer)) as url:
        for chunked in (False, True):
            status, text = send(url, "/score", big, {}, chunked)
            assert (status, message(text)) == (413, "request body over 4096 bytes")
    assert scorer.calls == 0

    engine = ScriptedEngine(tokenizer, ["ok"])
    service = EngineService(engine)
    server = AgentServer(service, tokenizer, "tiny", 8, max_request_bytes=4096).start()
    try:
        record = server.open_episode()
        for chunked in (False, True):
            status, text = send(server.base_url(record.episode_id), "/chat/completions", big,
                                {"Authorization": f"Bearer {server.key(record.episode_id)}"}, chunked)
            assert (status, message(text)) == (413, "request body over 4096 bytes")
        assert engine.calls == [] and record.turns == []
    finally:
        server.close()
        service.close()


def test_the_agent_endpoint_without_its_framework_is_one_line_naming_the_extra(tokenizer, monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # unimportable, as where [agents] is not installed
    service = EngineService(ScriptedEngine(tokenizer, []))
    try:
        with pytest.raises(OmnigymError, match=r"pip install 'omnigym\[agents\]'"):
            AgentServer(service, tokenizer, "tiny", 8).start()
    finally:
        service.close()
