"""What omnigym's three HTTP servers share: the API-key check, the capped body read, and the
agent endpoint's uvicorn on a thread of its own.

The servers are ``omnigym serve`` (``serve/app.py``, the tinker SDK's REST API),
``omnigym serve-rm`` (``serve/reward_server.py``) and the agent endpoint
(``agents/server.py``, the OpenAI-compatible URL an agent program talks to). All three are
FastAPI apps (Starlette underneath) served by uvicorn. That one because two of the three
already were, the tinker SDK's wire format is what its own FastAPI-shaped server speaks
(``{"detail": ...}`` errors, which ``rewards/remote.py`` reads too), and an ASGI app runs as
well on a thread's own event loop (the agent endpoint, many episodes at once) as in the main
thread (the two commands, ``serve_in_main_thread``). aiohttp, which served the agent endpoint alone, is no
longer a dependency of any of them.

Importing this module needs neither FastAPI nor uvicorn: the commands check for the
``[serve]`` extra first and name it in one line.
"""

from __future__ import annotations

import asyncio
import hmac
import socket
import threading
import time

UNAUTHORIZED = "missing or wrong API key ({header})"
"""the one line of every 401, naming the header the key goes in"""


class BodyTooLarge(Exception):
    """A request body past its server's cap (answered 413)."""

    def __init__(self, limit: int):
        super().__init__(f"request body over {limit} bytes")


def key_matches(given: str, keys: list[str]) -> bool:
    """Whether ``given`` is one of ``keys``: every key compared in full and in constant time,
    so the time taken says nothing about which key matched or how much of one."""
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given.encode(), key.encode())
    return ok


def presented_key(request, header: str) -> str:
    """The key a request carries in ``header``; for ``Authorization`` only as ``Bearer KEY``
    (a bare key there is no key)."""
    value = request.headers.get(header, "")
    if header.lower() == "authorization":
        return value[len("Bearer "):] if value.startswith("Bearer ") else ""
    return value


def refused_key(request, keys: list[str], header: str) -> str | None:
    """The 401's one line when ``keys`` are set and the request's ``header`` holds none of
    them; None when it may pass."""
    if keys and not key_matches(presented_key(request, header), keys):
        shown = "Authorization: Bearer KEY" if header.lower() == "authorization" else header
        return UNAUTHORIZED.format(header=shown)
    return None


def declared_too_large(request, limit: int) -> bool:
    """A body whose Content-Length is over ``limit`` (or not a number): refused before it is read."""
    size = request.headers.get("content-length")
    return size is not None and (not size.isdigit() or int(size) > limit)


async def read_body(request, limit: int) -> bytes:
    """The body, refused (``BodyTooLarge``) as soon as it passes ``limit``: a chunked body has no
    length to check beforehand."""
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def serve_in_main_thread(app, host: str, port: int) -> None:
    """The two commands' uvicorn, until Ctrl-C, SIGTERM or SIGHUP, which end it by raising (the
    CLI then says it stopped and exits 128 + the signal). Not ``uvicorn.run``: that swallows the
    KeyboardInterrupt uvicorn raises again after its graceful shutdown, so a server stopped by
    SIGTERM exited 0 without a word."""
    import signal

    import uvicorn

    from omnigym.track.stopping import Stopped

    class Server(uvicorn.Server):
        stopped_by: int | None = None

        def handle_exit(self, sig: int, frame) -> None:
            self.stopped_by = sig
            super().handle_exit(sig, frame)

    server = Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    server.run()  # SIGTERM: raised again after the shutdown, through the CLI's handler, as Stopped
    if server.stopped_by == signal.SIGINT:  # asyncio's runner drops the SIGINT uvicorn raises again
        raise KeyboardInterrupt
    if server.stopped_by is not None:
        raise Stopped(server.stopped_by)


class ThreadedServer:
    """An ASGI app served by uvicorn on ``host``, on a port the OS picks, from an event loop on
    a thread of its own: the caller's loops (the agents' episodes) and this one never block
    each other. ``addresses``: where it listens."""

    def __init__(self, app, host: str, name: str, keep_alive_s: float = 75.0, shutdown_s: float = 60.0):
        import uvicorn

        # log_config=None: uvicorn's own dictConfig would reconfigure the caller's logging.
        # keep-alive as long as an agent may think between two requests (uvicorn's 5 s default
        # closed connections that the client's pool then reused); in-flight requests get
        # shutdown_s to finish when it stops.
        self.server = uvicorn.Server(uvicorn.Config(
            app, log_config=None, access_log=False, lifespan="off", timeout_keep_alive=int(keep_alive_s),
            timeout_graceful_shutdown=int(shutdown_s), server_header=False))
        self.socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            self.socket.bind((host, 0))  # port 0: the OS picks a free one
        except OSError:
            self.socket.close()
            raise
        self.addresses = [self.socket.getsockname()]
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.failure: list[BaseException] = []

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self.server.serve(sockets=[self.socket]))
        except BaseException as exc:  # SystemExit included: uvicorn exits on a failed start
            self.failure.append(exc)
        finally:
            loop.close()

    def start(self, timeout_s: float = 30.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if self.failure or not self.thread.is_alive():
                raise RuntimeError(f"it stopped while starting ({self.failure[0] if self.failure else 'no error'})")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"it did not start within {timeout_s:.0f} s")
            time.sleep(0.005)

    def stop(self) -> None:
        self.server.should_exit = True  # uvicorn's main loop looks every 0.1 s
        if self.thread.is_alive():
            self.thread.join()
        self.socket.close()
