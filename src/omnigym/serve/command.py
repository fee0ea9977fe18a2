"""``omnigym serve``: its flags, checked in full before anything is created on disk or bound,
then the hub, the store and the HTTP app, served by uvicorn until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

from omnigym.errors import OmnigymError, missing_extra, path_name
from omnigym.serve.http import serve_in_main_thread

DESCRIPTION = ("Serve the tinker SDK's REST API over one base model: LoRA training runs, sampling, "
               "checkpoints (docs/serve.md).")


@dataclass
class ServeArgs:
    base_model: Path
    host: str
    port: int
    store: Path
    api_keys: list[str]
    limits: object


class _Parser(argparse.ArgumentParser):
    """argparse's usage-and-exit on a mistake, as one ``OmnigymError`` line (as omnigym.cli's,
    which this module cannot import: cli imports it)."""

    def error(self, message):
        raise OmnigymError(f"{message}; see {self.prog} --help")


def parser():
    p = _Parser(prog="omnigym serve", description=DESCRIPTION)
    p.add_argument("--base-model", required=True, type=path_name,
                   help="a model folder (config.json + weights + tokenizer), a run directory with model/, or "
                        "tiny (omnigym's ~1M-parameter test model, built offline into the store)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; "
                   "any other needs --api-key-env)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--store", default="serve_store", type=path_name,
                   help="folder for the server's records and checkpoints (default ./serve_store)")
    p.add_argument("--api-key-env", metavar="NAME",
                   help="environment variable holding the API key(s) clients must send, comma-separated, "
                        "each starting with tml- (the SDK's rule)")
    p.add_argument("--session-ttl", type=float, default=300.0,
                   help="seconds without a heartbeat before a session's runs leave memory (default 300; 0: never)")
    p.add_argument("--max-request-mb", type=float, default=64.0, help="largest request body (default 64)")
    p.add_argument("--max-data", type=int, default=1024, help="most data in one forward_backward (default 1024)")
    p.add_argument("--max-samples", type=int, default=64, help="most samples per prompt (default 64)")
    p.add_argument("--max-runs", type=int, default=64,
                   help="training runs held in memory at once, over all callers (default 64)")
    return p


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_can_listen(host: str, port: int) -> None:
    """A port out of range or taken (another server on it) is one line, before anything starts."""
    if not 1 <= port <= 65535:
        raise OmnigymError(f"--port {port}: choose 1-65535")
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            # as uvicorn binds: a port whose last connections linger in TIME_WAIT is free, one
            # that a server listens on is not
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as exc:
        raise OmnigymError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None


def resolve_base(path: str) -> Path:
    folder = Path(path).expanduser()
    if (folder / "model" / "config.json").is_file():  # a run directory: its trained model
        folder = folder / "model"
    if not (folder / "config.json").is_file():
        raise OmnigymError(f"--base-model {path}: no model there (expected a folder with config.json, "
                           "or a run directory with model/)")
    return folder


def check(argv: list[str]) -> ServeArgs:
    """Every mistake in the flags, as one line, before anything is created."""
    from omnigym.serve.app import Limits

    args = parser().parse_args(argv)
    store = Path(args.store).expanduser()
    # tiny is built into the store at start (serve()), so a restarted server has the same weights
    base = store / "tiny" if args.base_model == "tiny" else resolve_base(args.base_model)
    keys: list[str] = []
    if args.api_key_env:
        raw = os.environ.get(args.api_key_env, "")
        keys = [k.strip() for k in raw.split(",") if k.strip()]
        if not keys:
            raise OmnigymError(f"--api-key-env {args.api_key_env}: that variable is not set or empty")
        bad = [k for k in keys if not k.startswith("tml-") or len(k) < 12]
        if bad:
            raise OmnigymError(f"--api-key-env {args.api_key_env}: each key must start with tml- and be "
                               "at least 12 characters (the tinker SDK sends only such keys)")
    if not is_loopback(args.host) and not keys:
        raise OmnigymError(f"--host {args.host} is reachable from other machines; set an API key with "
                           "--api-key-env NAME, or serve on 127.0.0.1")
    if not 1 <= args.port <= 65535:
        raise OmnigymError(f"--port {args.port}: choose 1-65535")
    for flag, value, low in (("--max-request-mb", args.max_request_mb, 0.001), ("--max-data", args.max_data, 1),
                             ("--max-samples", args.max_samples, 1), ("--max-runs", args.max_runs, 1),
                             ("--session-ttl", args.session_ttl, 0)):
        if not math.isfinite(value) or value < low:  # nan compares as nothing: a ttl of nan never expired
            raise OmnigymError(f"{flag} {value}: must be at least {low}")
    if store.exists() and not store.is_dir():
        raise OmnigymError(f"--store {args.store} is a file; name a folder")
    from omnigym.track.run_dir import check_out_of_other_runs

    # a store inside a training run's folder would be moved aside with it by --overwrite
    check_out_of_other_runs(store, [], "--store", "which a server's store is not part of", "the store",
                            "--store ~/serve_store", folder=True)  # (the default, ./serve_store, when run in one)
    check_can_listen(args.host, args.port)
    if args.base_model != "tiny":
        from omnigym.models.lm import check_model_folder

        # the checks every --model gets (weights present and whole, not a run's config), here
        # rather than when the hub loads it: a refused start must not have made the store
        check_model_folder(f"--base-model {args.base_model}", base)
    limits = Limits(max_request_bytes=int(args.max_request_mb * 1024 * 1024), max_data=args.max_data,
                    max_samples=args.max_samples, max_runs=args.max_runs, session_ttl_s=args.session_ttl)
    return ServeArgs(base, args.host, args.port, store, keys, limits)


def serve(argv: list[str]) -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise missing_extra(exc.name or "fastapi", "serve") from None
    args = check(argv)
    try:
        from omnigym.serve.hub import ModelHub
    except ImportError as exc:
        raise OmnigymError(f"omnigym serve's compute is not available here ({exc})") from None
    from omnigym.serve.app import make_app
    from omnigym.serve.store import Store

    lock = hold_the_store(args.store)
    try:
        if args.base_model == args.store / "tiny" and not (args.base_model / "config.json").is_file():
            from omnigym.models.lm import build_tiny_model

            # 2048 positions: a multi-turn cookbook episode (guess_number) passes the default 256
            build_tiny_model(args.base_model, max_positions=2048, seed=0)
        hub = ModelHub(str(args.base_model), args.store / "hub")
        app = make_app(hub, Store(args.store / "serve.db"), api_key=args.api_keys or None, limits=args.limits)
        print(f"omnigym serve: {args.base_model} on http://{args.host}:{args.port} "
              f"(store {args.store}; {'API key required' if args.api_keys else 'loopback only'})", flush=True)
        try:
            serve_in_main_thread(app, args.host, args.port)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP (cli.py): the stop line says how to go on
            # a run comes back as its last save_state left it: the optimizer steps after that lived in memory only
            exc.where = (f"the store ({args.store}) keeps every run and checkpoint, each run as its last save_state "
                         "left it (its steps since are lost): go on with omnigym serve "
                         f"{shlex.join(argv)} (a request that had not finished is answered 'send it again')")
            raise
        finally:
            app.state.worker.stop()
    finally:
        lock.release()


def hold_the_store(store: Path):
    """One server per store: opening the store marks every pending request failed ("the server
    stopped before this request finished"), so a second server on it failed the first one's
    requests while that one still ran them, and a client that sent them again trained twice.
    The lock is track's run lock (flock: a killed server never leaves it stuck). A store that
    cannot be made or written is one line (it was a NotADirectoryError traceback)."""
    from omnigym.track.lock import RunLock

    lock = RunLock(store, ".omnigym-serve.lock", f"--store {store}")
    if not lock.acquire(create=True):
        try:
            store.mkdir(parents=True, exist_ok=True)
            if not os.access(store, os.W_OK | os.X_OK):
                raise PermissionError(13, "permission denied")
        except OSError as exc:
            raise OmnigymError(f"--store {store} cannot be made or written here: "
                               f"{exc.strerror or exc}; name a folder you can write") from None
    return lock
