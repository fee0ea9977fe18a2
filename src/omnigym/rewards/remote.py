"""A reward model served over HTTP as a reward like any other: ``--rewards rm:http://HOST:PORT:1.0``.

``omnigym serve-rm RUN_DIR`` (``serve/reward_server.py``) holds the reward model; this reward
sends each batch to it in one POST (``/score``: the completions and their prompts, nothing
else of the examples) and reads back one score per completion. So the trainer and every Ray
generator share one copy of the weights instead of each loading its own.

The server is asked for its ``/info`` when the reward is named, so a server that is down or is
not a reward server is one line before a run starts. A full server queue (503) is tried again
a few times with growing waits; anything else that goes wrong (refused, timed out, an answer
that is not scores) is one ``OmnigymError`` line naming the URL and what to do. Pickling sends
the URL and settings, never a connection: Ray generator actors unpickle it and connect themselves.
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Sequence

import torch

from omnigym.errors import OmnigymError
from omnigym.rewards.base import Reward

KEY_ENV = "OMNIGYM_RM_API_KEY"
"""the environment variable whose value is sent as the bearer key (a server started with --api-key-env)"""


def is_reward_url(given: str) -> bool:
    """``http://...`` or ``https://...`` (what follows ``rm:``): a served reward model, not a folder."""
    return given.lower().startswith(("http://", "https://"))


def checked_url(given: str) -> str:
    """The base URL, without a trailing slash; anything but scheme://host[:port][/prefix] is one line."""
    try:
        parts = urllib.parse.urlsplit(given)
        port = parts.port  # reads the port: a non-number or one past 65535 raises here
    except ValueError as exc:
        raise OmnigymError(f"rm:{given} is not a URL ({exc}); write rm:http://HOST:PORT") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OmnigymError(f"rm:{given} is not a URL; write rm:http://HOST:PORT")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise OmnigymError(f"rm:{given}: give the server's address alone (no query, fragment or credentials; "
                           f"a key goes in ${KEY_ENV})")
    if port == 0:
        raise OmnigymError(f"rm:{given}: port 0 is not a server's port")
    return given.rstrip("/")


class RemoteRewardModel(Reward):
    """The scores of the reward model an ``omnigym serve-rm`` at ``url`` serves."""

    def __init__(self, url: str, timeout_s: float = 120.0, retries: int = 5, backoff_s: float = 0.5):
        self.url = checked_url(url)
        self.label = "rm:" + self.url
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.api_key = os.environ.get(KEY_ENV) or None
        self.info = self._request("GET", "/info", None, timeout_s=min(timeout_s, 10.0))
        if not isinstance(self.info, dict) or "reward" not in self.info:
            raise OmnigymError(f"{self.label} answered /info without a reward model's description; is it an "
                               "`omnigym serve-rm` server?")

    def __call__(self, completions: Sequence[str], examples: Sequence[dict]) -> torch.Tensor:
        from omnigym.rewards.reward_model import prompt_of

        if len(completions) != len(examples):
            raise OmnigymError(f"{len(completions)} completions but {len(examples)} examples")
        if not completions:
            return torch.zeros(0, dtype=torch.float64)
        body = {"completions": list(completions), "prompts": [prompt_of(example) for example in examples]}
        answer = self._request("POST", "/score", body, timeout_s=self.timeout_s)
        scores = answer.get("scores") if isinstance(answer, dict) else None
        if not isinstance(scores, list) or len(scores) != len(completions) or \
                not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in scores):
            raise OmnigymError(f"{self.label} answered /score without one score per completion ({len(completions)} "
                               "sent); is it an `omnigym serve-rm` server?")
        return torch.tensor(scores, dtype=torch.float64)

    def _request(self, method: str, path: str, body, timeout_s: float):
        """The JSON the server answers; a full queue (503) is asked again ``retries`` times."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {self.api_key}"}
                                                          if self.api_key else {})}
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=timeout_s) as response:
                    raw = response.read()
                break
            except urllib.error.HTTPError as exc:
                detail = server_detail(exc)
                if exc.code == 503 and attempt < self.retries:
                    time.sleep(self.backoff_s * 2 ** attempt)
                    continue
                raise OmnigymError(self._http_failure(exc.code, detail, attempt)) from None
            except http.client.HTTPException as exc:  # something answered, but not in HTTP
                raise OmnigymError(f"{self.label} answered {path} with something that is not HTTP "
                                   f"({type(exc).__name__}); is it an `omnigym serve-rm` server?") from None
            except OSError as exc:  # refused, reset, unreachable, or timed out (URLError wraps the first ones)
                reason = getattr(exc, "reason", exc)
                if isinstance(reason, TimeoutError):
                    raise OmnigymError(f"{self.label}: no answer within {timeout_s:g} s; the server is overloaded "
                                       "or stuck (check its console, or give it a larger --batch-size)") from None
                raise OmnigymError(f"{self.label}: no reward server answers there ({reason}); start one with "
                                   "`omnigym serve-rm RM_RUN_DIR --port PORT`") from None
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise OmnigymError(f"{self.label} answered {path} with something that is not JSON; is it an "
                               "`omnigym serve-rm` server?") from None

    def _http_failure(self, code: int, detail: str, attempt: int) -> str:
        if code == 503:
            return (f"{self.label}: the server's queue stayed full after {attempt + 1} tries; start it with a larger "
                    f"--max-queue or --batch-size, or send it fewer generators ({detail})")
        if code == 401:
            return f"{self.label}: the server wants an API key; set ${KEY_ENV} to one of its keys"
        if code == 404:
            return f"{self.label} has no reward-model API here (404); is it an `omnigym serve-rm` server?"
        return f"{self.label} refused the request (HTTP {code}: {detail})"


def server_detail(exc) -> str:
    """The ``detail`` of a FastAPI error answer, else the start of its body."""
    try:
        raw = exc.read()[:2000]
        detail = json.loads(raw).get("detail")
        return detail if isinstance(detail, str) else json.dumps(detail)[:300]
    except Exception:  # not JSON, or no body: the status line says it
        return str(getattr(exc, "reason", "")) or "no detail"
