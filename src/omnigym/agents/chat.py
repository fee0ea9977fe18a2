"""OpenAI chat requests rendered by the model's own chat template, and replies read back
into OpenAI's shape: the text, the tool calls parsed from it, the finish reason.

Tool calls are read in the Hermes format that Qwen2.5/Qwen3, Hermes and most open
function-calling templates both ask for and render back: ``<tool_call>{"name": ...,
"arguments": {...}}</tool_call>``. A template that ignores ``tools=`` (the built-in tiny
model's, SmolLM2-135M's) would give the model a prompt without the tools the agent
described; ``template_takes_tools`` finds that out once, and a request with tools is then
refused in one line instead of answered from the wrong prompt.
"""

from __future__ import annotations

import json
import re

from omnigym.errors import OmnigymError

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
PROBE_NAME = "omnigym_probe_tool"


def render(tokenizer, messages: list[dict], tools: list[dict] | None) -> str:
    """The prompt text for ``messages`` (and ``tools``), ending where the assistant speaks."""
    try:
        return tokenizer.apply_chat_template(template_messages(messages), tools=tools or None,
                                             add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # the template's own raise_exception, or messages it cannot read
        raise OmnigymError(f"the chat template cannot render these messages: {type(exc).__name__}: {exc}") from None


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI's messages as chat templates read them: a tool call's ``arguments`` is a JSON
    string in OpenAI's API and a dict in Hugging Face's templates (Qwen2.5's writes it with
    ``tojson``: a string would be quoted twice, and would not be what the model wrote).
    Content given as OpenAI's list of text parts is joined into one string, as vLLM's server
    does: templates print ``content`` as it is, and a list would reach the model as its Python repr."""
    out = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if isinstance(calls, list):
            message = {**message, "tool_calls": [_with_dict_arguments(call) for call in calls]}
        if isinstance(message, dict) and isinstance(message.get("content"), list):
            message = {**message, "content": _text_of_parts(message["content"])}
        elif isinstance(message, dict) and not isinstance(message.get("content"), (str, type(None))):
            # a number or an object reached the model as its Python repr
            raise OmnigymError(f"message content must be text, a list of text parts or null; got "
                               f"{type(message['content']).__name__}")
        out.append(message)
    return out


def _text_of_parts(parts: list) -> str:
    if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in parts):
        raise OmnigymError("message content parts other than {\"type\": \"text\", \"text\": ...} are not served "
                           "(a text model): send text")
    return "\n".join(p["text"] for p in parts)


def _with_dict_arguments(call):
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call
    return {**call, "function": {**function, "arguments": arguments}} if isinstance(arguments, dict) else call


def template_takes_tools(tokenizer) -> bool:
    """Does the template put ``tools`` into the prompt at all? (A probe tool's name must appear.)"""
    messages = [{"role": "user", "content": "hi"}]
    probe = {"type": "function", "function": {"name": PROBE_NAME, "description": "probe",
                                              "parameters": {"type": "object", "properties": {}}}}
    try:
        text = tokenizer.apply_chat_template(messages, tools=[probe], add_generation_prompt=True, tokenize=False)
    except Exception:
        return False
    return PROBE_NAME in text


def parse_tool_calls(text: str, call_id: str) -> tuple[str | None, list[dict], int]:
    """``(content, tool_calls, malformed)``: the text before the first tool call (None when
    empty), the well-formed calls in OpenAI's shape (ids ``{call_id}_{i}``), and how many
    ``<tool_call>`` blocks were not a JSON object with a string ``name`` (left in the content)."""
    calls, malformed, first = [], 0, None
    for match in TOOL_CALL.finditer(text):
        try:
            body = json.loads(match.group(1))
        except ValueError:
            body = None
        arguments = body.get("arguments", body.get("parameters", {})) if isinstance(body, dict) else None
        if not isinstance(body, dict) or not isinstance(body.get("name"), str) or \
                not isinstance(arguments, (dict, str)):
            malformed += 1
            continue
        first = match.start() if first is None else first
        calls.append({"id": f"{call_id}_{len(calls)}", "type": "function",
                      "function": {"name": body["name"],
                                   "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
    if not calls:
        return text, [], malformed
    content = text[:first]
    return (content if content.strip() else None), calls, malformed


def token_logprobs(tokenizer, ids: list[int], logprobs: list[float]) -> dict:
    """OpenAI's ``choices[i].logprobs``: each generated token, its text and log-prob (no top-k)."""
    content = []
    for token_id, value in zip(ids, logprobs):
        piece = tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        content.append({"token": piece, "logprob": float(value), "bytes": list(piece.encode("utf-8")),
                        "top_logprobs": []})
    return {"content": content, "refusal": None}


def completion(response_id: str, model: str, created: int, message: dict, finish_reason: str, usage: dict,
               logprobs: dict | None) -> dict:
    """A ``chat.completion`` object as OpenAI's API returns it (one choice)."""
    return {"id": response_id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": logprobs}],
            "usage": usage}


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None) -> dict:
    """OpenAI's error shape, which the ``openai`` client turns into its exception's message."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
