"""The OpenAI-compatible endpoint a run serves from its own inference engine, one base URL
per episode, every request recorded as the engine sampled it.

How to use it (the agent episodes of ``agents/episodes.py`` do exactly this; so can any
other source of episodes that talk to an ``openai`` client)::

    service = EngineService(engine)                 # inference/service.py: requests share batches
    server = AgentServer(service, tokenizer, model_name="tiny", max_new_tokens=64)
    server.start()                                  # 127.0.0.1, a free port, a random bearer token
    record = server.open_episode()                  # EpisodeRecord (agents/recorder.py)
    client = server.client(record.episode_id)       # openai.AsyncOpenAI for that episode only
    ...                                             # the agent's requests: await client.chat.completions.create(...)
    record = server.close_episode(record.episode_id)   # later requests for it get 404
    record.turns                                    # [generators.turns.Turn], as sampled
    recorder.trajectories(record, reward, parts, group_id, example, version)   # what a trainer reads
    server.close()

Routes (under ``/episodes/<id>/v1``): ``POST chat/completions`` (``messages``, ``tools``,
``temperature`` (0: greedy), ``top_p``, ``top_k``, ``max_tokens`` / ``max_completion_tokens`` (at
most the run's ``--max-new-tokens``), ``stop``, ``logprobs``, ``tool_choice`` "none" (else read as
"auto"), ``return_token_ids`` (vLLM's: the prompt's and the reply's ids in the answer), ``n`` = 1)
and ``GET models``.
Every request needs ``Authorization: Bearer <key>`` with the key of the episode its URL names
(401 without a key of this run, ``serve/http.py``'s check, shared with the other servers; 403
with another episode's: each episode has its own, ``server.key(episode_id)``, which
``server.client(episode_id)`` carries, so an agent that kept another episode's URL records
nothing there) and a body under ``max_request_bytes`` (413). A conversation that cannot fit the
model's context is refused (400) from its length in characters, before the chat template or the
tokenizer see it: a 10 MB message costs a length check, not a tokenizer pass. The app is
FastAPI's, served by uvicorn from an event loop on a thread of its own (``serve/http.py`` says
why that framework for all three servers), so episodes may run in any event loop, many at once,
and it binds loopback only. It opens no file: nothing in a request is ever used as a path.
"""

from __future__ import annotations

import json
import math
import secrets
import ssl
import threading
import time

from omnigym.agents.chat import completion, error_body, parse_tool_calls, render, template_takes_tools, token_logprobs
from omnigym.agents.recorder import EpisodeRecord, Exchange, prompt_ids
from omnigym.errors import OmnigymError, missing_extra
from omnigym.generators.turns import Turn
from omnigym.inference.engine import SamplingParams
from omnigym.models.lm import stripped_special_tokens
from omnigym.serve.http import (BodyTooLarge, ThreadedServer, declared_too_large, presented_key, read_body,
                                refused_key)

HOST = "127.0.0.1"
MAX_REQUEST_BYTES = 16 * 1024 * 1024


class BadRequest(Exception):
    """A request the endpoint answers with 400 and this message."""


class AgentServer:
    def __init__(self, service, tokenizer, model_name: str, max_new_tokens: int, context: int | None = None,
                 temperature: float = 1.0, greedy: bool = False, max_request_bytes: int = MAX_REQUEST_BYTES):
        """``max_new_tokens``: the most a reply may have (a request may ask for fewer);
        ``context``: the model's positions (prompt and reply must fit); ``temperature``: for
        requests that give none; ``greedy``: every request is sampled greedily (evaluation);
        ``max_request_bytes``: a larger request body is refused (413) before it is read whole."""
        self.service, self.tokenizer, self.model_name = service, tokenizer, model_name
        self.max_new_tokens, self.context, self.temperature, self.greedy = max_new_tokens, context, temperature, greedy
        self.max_request_bytes = max_request_bytes
        self.takes_tools = template_takes_tools(tokenizer)
        # the most characters one token can stand for (a byte-level token's string has one
        # character per byte, a decoded character at least one byte): a text of more than
        # context x this many characters has more tokens than the context holds
        vocabulary = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        self.chars_per_token = max(map(len, vocabulary), default=0) or None
        self.port: int | None = None
        self._episodes: dict[str, EpisodeRecord] = {}
        self._keys: dict[str, str] = {}  # an episode's key -> its id, kept after it closes (its URL then answers 404)
        self._lock = threading.Lock()
        self._runner: ThreadedServer | None = None
        self._tls = None

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> "AgentServer":
        app = self._app()
        try:
            self._runner = ThreadedServer(app, HOST, "omnigym-agent-endpoint")
            self._runner.start()
        except (OSError, RuntimeError) as exc:
            raise OmnigymError(f"the agent endpoint could not start on {HOST}: {exc}") from None
        self.port = self._runner.addresses[0][1]
        return self

    def close(self) -> None:
        if self._runner is not None:
            self._runner.stop()

    # -- episodes ---------------------------------------------------------------------------
    def open_episode(self) -> EpisodeRecord:
        record = EpisodeRecord(secrets.token_hex(8))
        with self._lock:
            self._episodes[record.episode_id] = record
            self._keys[secrets.token_urlsafe(32)] = record.episode_id
        return record

    def key(self, episode_id: str) -> str:
        """The key that episode's requests carry (``Authorization: Bearer KEY``)."""
        with self._lock:
            for key, owner in self._keys.items():
                if owner == episode_id:
                    return key
        raise OmnigymError(f"no episode {episode_id!r} was opened on this endpoint")

    def close_episode(self, episode_id: str) -> EpisodeRecord:
        with self._lock:
            record = self._episodes.pop(episode_id)
        with record.lock:
            record.closed = True
        return record

    def base_url(self, episode_id: str) -> str:
        return f"http://{HOST}:{self.port}/episodes/{episode_id}/v1"

    def client(self, episode_id: str, timeout: float | None = None):
        """An ``openai.AsyncOpenAI`` for this episode, carrying the episode's key; it never retries
        (a retried request would be a second sample of the same turn) and ignores proxy settings
        (the token goes to loopback, nowhere else)."""
        try:
            import httpx
            import openai
        except ImportError:
            raise missing_extra("openai", "agents") from None
        if self._tls is None:  # building one per client cost 60 ms each (certifi's bundle), for a plain-HTTP endpoint
            self._tls = ssl.create_default_context()
        http = httpx.AsyncClient(verify=self._tls, trust_env=False, timeout=timeout)
        return openai.AsyncOpenAI(base_url=self.base_url(episode_id), api_key=self.key(episode_id), max_retries=0,
                                  timeout=timeout, http_client=http)

    # -- HTTP -------------------------------------------------------------------------------
    def _app(self):
        """The endpoint's FastAPI app: two routes, every request behind the run's token."""
        try:
            import uvicorn  # noqa: F401  (ThreadedServer serves it)
            from fastapi import FastAPI
        except ImportError as exc:
            raise missing_extra(exc.name or "fastapi", "agents") from None
        app = FastAPI(title="omnigym agent endpoint", docs_url=None, redoc_url=None, openapi_url=None)
        app.middleware("http")(self._authorize)
        # plain request -> response endpoints: the routes read their one path parameter themselves
        app.add_route("/episodes/{episode}/v1/chat/completions", self._chat, methods=["POST"])
        app.add_route("/episodes/{episode}/v1/models", self._models, methods=["GET"])
        return app

    @staticmethod
    def _reply(status: int, body: dict):
        from fastapi.responses import Response

        # json.dumps' own defaults (as aiohttp's json_response wrote them): a non-finite
        # log-prob goes out as -Infinity, which the openai client reads, where Starlette's
        # JSONResponse would refuse it and fail the request
        return Response(json.dumps(body), status_code=status, media_type="application/json; charset=utf-8")

    async def _authorize(self, request, call_next):
        with self._lock:
            keys = list(self._keys)
        refusal = refused_key(request, keys, "Authorization")
        if refusal is not None:
            return self._reply(401, error_body(f"{refusal}; use the client this run gave the agent",
                                               code="invalid_api_key"))
        return await call_next(request)

    def _record(self, request):
        """The episode the URL names, or the reply that refuses: 403 when the request's key is
        another episode's (whether the named one exists is not said), 404 when it has ended."""
        episode_id = request.path_params["episode"]
        with self._lock:
            owner = self._keys.get(presented_key(request, "Authorization"))  # a key of this run: _authorize
            record = self._episodes.get(episode_id)
        if owner != episode_id:
            return self._reply(403, error_body("this key belongs to another episode: an episode's requests go to its "
                                               "own base URL with its own client", code="wrong_episode"))
        if record is None:
            return self._reply(404, error_body("no such episode (it ended, or never was)", code="not_found"))
        return record

    async def _models(self, request):
        record = self._record(request)
        if not isinstance(record, EpisodeRecord):
            return record
        return self._reply(200, {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                                             "owned_by": "omnigym"}]})

    async def _chat(self, request):
        record = self._record(request)
        if not isinstance(record, EpisodeRecord):
            return record
        try:
            if declared_too_large(request, self.max_request_bytes):
                raise BodyTooLarge(self.max_request_bytes)
            raw = await read_body(request, self.max_request_bytes)
        except BodyTooLarge as exc:
            return self._reply(413, error_body(str(exc)))
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than json's parser goes
            return self._reply(400, error_body("the request body is not JSON"))
        try:
            return self._reply(200, await self._complete(record, body))
        except BadRequest as exc:
            return self._reply(400, error_body(str(exc)))
        except Exception as exc:  # the engine (or omnigym) failed: the run stops with it, not only this episode
            record.crash = record.crash or exc
            return self._reply(500, error_body(f"the server failed: {type(exc).__name__}: {exc}", "server_error"))

    async def _complete(self, record: EpisodeRecord, body) -> dict:
        messages, tools, params, stop, want_logprobs = self._read(body)
        if tools and not self.takes_tools:
            record.fatal = ("the agent sent tools, but the model's chat template ignores tools= (it would never see "
                            "them): give omnigym train grpo --chat-template a template with tool support (docs/agents.md; "
                            "text_reinforce takes no --chat-template: its model's own template must show tools)")
            raise BadRequest(record.fatal)
        self._check_size(messages, tools)
        try:
            text = render(self.tokenizer, messages, tools)
        except OmnigymError as exc:
            raise BadRequest(str(exc)) from None
        ids = prompt_ids(self.tokenizer, record, text)
        budget = params.max_new_tokens
        params = self._fit(params, len(ids))
        # what a reply that runs out of tokens ran into: the advice differs (raise the agent's
        # max_tokens, the run's --max-new-tokens, or shorten the conversation)
        limit = "context" if params.max_new_tokens < budget else \
            "max_tokens" if budget < self.max_new_tokens else "--max-new-tokens"
        samples, version = await self.service.sample(ids, params, 1)
        sample = samples[0]
        completion_ids, logprobs, stopped = _cut_at_stop(self.tokenizer, sample.completion_ids, sample.logprobs, stop)
        reply = self.tokenizer.decode(completion_ids, skip_special_tokens=True)
        turn_number = len(record.turns)
        if stopped:
            reply = _before_stop(reply, stop)
        parse = tools and body.get("tool_choice") != "none"  # "required" or a named function: read as "auto"
        content, calls, malformed = parse_tool_calls(reply, f"call_{record.episode_id}_{turn_number}") if parse \
            else (reply, [], 0)
        finished = sample.finished or stopped
        finish_reason = "tool_calls" if calls else "stop" if finished else "length"
        asked = messages[-1] if isinstance(messages[-1], dict) else {}
        exchange = Exchange({"role": asked.get("role"), "content": asked.get("content")}, reply, calls, malformed,
                            finish_reason, None if finished else limit,
                            stripped_special_tokens(self.tokenizer, completion_ids))
        if not record.add(Turn(ids, completion_ids, logprobs, version, finished), exchange):
            raise BadRequest("this episode has ended (its agent timed out)")
        message = {"role": "assistant", "content": content, "refusal": None, "tool_calls": calls or None}
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(completion_ids),
                 "total_tokens": len(ids) + len(completion_ids)}
        answer = completion(f"chatcmpl-{record.episode_id}-{turn_number}", str(body.get("model") or self.model_name),
                            int(time.time()), message, finish_reason, usage,
                            token_logprobs(self.tokenizer, completion_ids, logprobs) if want_logprobs else None)
        if body.get("return_token_ids"):  # vLLM's extension (extra_body), which verifiers' token client asks for
            answer["prompt_token_ids"] = ids
            answer["choices"][0]["token_ids"] = completion_ids
        return answer

    def _read(self, body) -> tuple:
        """The request's fields, checked: anything the endpoint cannot do as asked is a 400."""
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise BadRequest("messages must be a non-empty list of message objects")
        if not all(isinstance(m.get("role"), str) and m["role"] for m in messages):  # the template would print None
            raise BadRequest("each message needs a role (a string: system, user, assistant, tool)")
        tools = body.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise BadRequest("tools must be a list of tool objects")
        if body.get("n") not in (None, 1):
            raise BadRequest(f"n={body.get('n')!r}: this endpoint answers one choice per request (n=1)")
        if body.get("stream"):
            raise BadRequest("stream=true is not served: ask without streaming")
        if body.get("top_logprobs") not in (None, 0):
            raise BadRequest("top_logprobs is not served (logprobs=true gives each sampled token's log-prob)")
        temperature = _number(body, "temperature", self.temperature, low=0.0)
        top_p = _number(body, "top_p", 1.0, low=0.0)
        if not 0 < top_p <= 1:
            raise BadRequest(f"top_p must be in (0, 1], got {top_p}")
        asked = body.get("max_completion_tokens", body.get("max_tokens"))
        if asked is not None and (not isinstance(asked, int) or isinstance(asked, bool) or asked < 1):
            raise BadRequest(f"max_tokens must be a positive integer, got {asked!r}")
        stop = body.get("stop")
        stop = [stop] if isinstance(stop, str) else stop
        if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
            raise BadRequest("stop must be a string or a list of non-empty strings")
        top_k = body.get("top_k")  # vLLM's extension; -1 or 0: off
        if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < -1):
            raise BadRequest(f"top_k must be an integer >= -1, got {top_k!r}")
        greedy = self.greedy or temperature == 0
        params = SamplingParams(max_new_tokens=min(asked or self.max_new_tokens, self.max_new_tokens),
                                temperature=1.0 if greedy else temperature, top_p=top_p, top_k=max(top_k or 0, 0),
                                greedy=greedy)
        return messages, tools, params, stop or [], bool(body.get("logprobs"))

    def _check_size(self, messages: list, tools) -> None:
        """Refuse a conversation whose text alone has more tokens than the context holds, from
        its length in characters, before the chat template or the tokenizer see it."""
        if self.context is None or self.chars_per_token is None:
            return
        characters = _text_length(messages) + _text_length(tools)
        # x4: room for what a template leaves out (an earlier turn's reasoning, stripped space)
        if characters > 4 * self.context * self.chars_per_token:
            raise BadRequest(f"the conversation has {characters} characters, more than the model's context of "
                             f"{self.context} tokens can hold: shorten the conversation")

    def _fit(self, params: SamplingParams, prompt_length: int) -> SamplingParams:
        """The reply's budget cut to what the model's context leaves after the prompt."""
        if self.context is None:
            return params
        room = self.context - prompt_length
        if room < 1:
            raise BadRequest(f"the prompt has {prompt_length} tokens and the model's context is {self.context}: "
                             "shorten the conversation")
        if params.max_new_tokens > room:
            params = SamplingParams(room, params.temperature, params.top_p, params.top_k, params.greedy)
        return params


def _text_length(value) -> int:
    """Characters in the strings (keys too) of a parsed JSON value: messages, tools."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(k) + _text_length(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(map(_text_length, value))
    return 0


def _number(body: dict, name: str, default: float, low: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < low:
        raise BadRequest(f"{name} must be a number >= {low:g}, got {value!r}")
    return float(value)


def _cut_at_stop(tokenizer, ids: list[int], logprobs: list[float], stop: list[str]):
    """The sampled tokens up to the one that completes a stop string (the reply a server with
    stop strings would have sampled); ``stopped`` says whether one was found."""
    if not stop:
        return ids, logprobs, False
    for end in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:end], skip_special_tokens=True)
        if any(s in text for s in stop):
            return ids[:end], logprobs[:end], True
    return ids, logprobs, False


def _before_stop(text: str, stop: list[str]) -> str:
    """OpenAI's replies leave the stop string out."""
    cut = min((text.find(s) for s in stop if s in text), default=len(text))
    return text[:cut]
