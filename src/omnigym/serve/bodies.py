"""Reading the JSON bodies the tinker SDK sends, checked field by field: a wrong field is one
``RequestError`` that names it, before anything is queued or stored."""

from __future__ import annotations

import json
import math

from omnigym.serve.contract import AdamStep, DatumIn, RequestError, SampleParams

INT64 = 2**63
"""seeds must fit torch's and SQLite's 64-bit integers (a larger one failed as the server's fault)"""


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the body is not JSON ({exc})") from None
    except RecursionError:  # json's decoder recurses per nesting level: a deep body ends it
        raise RequestError("the body is nested too deeply") from None
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    return body


def get(body: dict, name: str, kind, default=..., *, low=None, high=None):
    """``body[name]`` checked to be a ``kind`` (bool is not an int here), within [low, high]."""
    if name not in body or body[name] is None:
        if default is ...:
            raise RequestError(f"{name} is required")
        return default
    value = body[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise RequestError(f"{name} must be {kind.__name__ if not isinstance(kind, tuple) else 'a number'}, got {value!r}")
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kinds):
        raise RequestError(f"{name} must be {' or '.join(k.__name__ for k in kinds)}, got {str(value)[:40]!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise RequestError(f"{name} must be finite, got {value}")
    if low is not None and value < low or high is not None and value > high:
        within = (f"in [{low}, {high}]" if low is not None and high is not None else
                  f"at least {low}" if low is not None else f"at most {high}")  # "[-1, None]" read as a range
        raise RequestError(f"{name} must be {within}, got {value}")
    if isinstance(value, str) and len(value) > 512:
        raise RequestError(f"{name} is too long ({len(value)} characters)")
    return value


def adam_step(body: dict) -> AdamStep:
    if "optimizer_params" in body and "adam_params" not in body:
        raise RequestError("only Adam is supported: optim_step needs adam_params")
    params = get(body, "adam_params", dict)
    unknown = set(params) - {"learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"}
    if unknown:
        raise RequestError(f"adam_params: unknown fields {sorted(unknown)}")
    defaults = AdamStep()
    return AdamStep(
        learning_rate=get(params, "learning_rate", float, defaults.learning_rate, low=0.0, high=10.0),
        beta1=get(params, "beta1", float, defaults.beta1, low=0.0, high=0.999999),
        beta2=get(params, "beta2", float, defaults.beta2, low=0.0, high=0.999999),
        eps=get(params, "eps", float, defaults.eps, low=1e-30, high=1.0),
        weight_decay=get(params, "weight_decay", float, defaults.weight_decay, low=0.0, high=10.0),
        grad_clip_norm=get(params, "grad_clip_norm", float, defaults.grad_clip_norm, low=0.0),
    )


def prompt_tokens(body: dict) -> list[int]:
    prompt = get(body, "prompt", dict)
    chunks = get(prompt, "chunks", list)
    tokens: list[int] = []
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, dict) or chunk.get("type", "encoded_text") != "encoded_text":
            raise RequestError(f"prompt chunk {i}: only text chunks are supported")
        part = get(chunk, "tokens", list)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in part):
            raise RequestError(f"prompt chunk {i}: tokens must be integers")
        tokens.extend(part)
    return tokens


def sample_params(body: dict) -> SampleParams:
    raw = get(body, "sampling_params", dict)
    stop = raw.get("stop")
    stop_tokens: list[int] = []
    stop_strings: list[str] = []
    if isinstance(stop, str):
        stop_strings = [stop]
    elif isinstance(stop, list):
        if all(isinstance(s, str) for s in stop):
            stop_strings = list(stop)
        elif all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
            stop_tokens = list(stop)
        else:
            raise RequestError("sampling_params.stop must be a string, a list of strings or a list of token ids")
    elif stop is not None:
        raise RequestError("sampling_params.stop must be a string, a list of strings or a list of token ids")
    if any(s == "" for s in stop_strings):
        raise RequestError("sampling_params.stop: an empty stop string would end every sample at once")
    if len(stop_tokens) + len(stop_strings) > 64 or any(len(s) > 256 for s in stop_strings):
        raise RequestError("sampling_params.stop: at most 64 stop sequences of at most 256 characters")
    for name in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
        if get(body, name, int, 0):
            raise RequestError(f"{name} is not supported by omnigym serve")
    if body.get("target_prompt_logprobs") is not None:
        raise RequestError("target_prompt_logprobs is not supported by omnigym serve")
    return SampleParams(
        max_tokens=get(raw, "max_tokens", int, 16, low=1),
        temperature=get(raw, "temperature", float, 1.0, low=0.0, high=100.0),
        top_p=get(raw, "top_p", float, 1.0, low=1e-6, high=1.0),
        top_k=get(raw, "top_k", int, -1, low=-1),
        seed=get(raw, "seed", int, None, low=-INT64, high=INT64 - 1),
        stop_tokens=stop_tokens,
        stop_strings=stop_strings,
        prompt_logprobs=bool(get(body, "prompt_logprobs", bool, False)),
    )


def last_n(body: dict, prompt_length: int) -> int | None:
    """``prompt_logprobs_last_n``: how many of the prompt's last log-probs to keep (the hub
    scores them all; the rest go back as None, as the SDK checks)."""
    n = get(body, "prompt_logprobs_last_n", int, None)
    if n is None:
        return None
    if not body.get("prompt_logprobs"):
        raise RequestError("prompt_logprobs_last_n needs prompt_logprobs")
    if not 1 <= n <= prompt_length - 1:
        raise RequestError(f"prompt_logprobs_last_n must be in [1, {prompt_length - 1}], got {n}")
    return n


def check_tokens(tokens: list[int], vocab_size: int, what: str) -> None:
    bad = [t for t in tokens if not 0 <= t < vocab_size]
    if bad:
        raise RequestError(f"{what}: token {bad[0]} is out of the vocabulary (0..{vocab_size - 1})")


def check_data(data: list[DatumIn], vocab_size: int, max_length: int, max_data: int) -> None:
    """A forward_backward batch the hub can take: in size, in vocabulary, rows that line up."""
    if not data:
        raise RequestError("forward_backward needs at least one datum")
    if len(data) > max_data:
        raise RequestError(f"forward_backward: {len(data)} data in one request, the limit is {max_data}",
                           status=413)
    for i, datum in enumerate(data):
        n = len(datum.tokens)
        if n == 0:
            raise RequestError(f"datum {i}: model_input is empty")
        if n > max_length:
            raise RequestError(f"datum {i}: {n} tokens, the longest sequence is {max_length}", status=413)
        check_tokens(datum.tokens, vocab_size, f"datum {i}")
        for name, tensor in datum.inputs.items():
            if tensor.dim() == 0 or tensor.shape[0] != n:
                raise RequestError(f"datum {i}: loss_fn_inputs[{name!r}] has {tensor.shape[0] if tensor.dim() else 0} "
                                   f"rows for {n} input tokens (they must match)")
        targets = datum.inputs.get("target_tokens")
        if targets is not None:
            check_tokens([t for t in targets.reshape(-1).tolist()], vocab_size, f"datum {i} target_tokens")
