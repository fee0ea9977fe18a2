"""``omnigym serve``'s records, in one SQLite file (the standard library's ``sqlite3``):
sessions, training runs (models), checkpoints, sampling sessions and futures with their
results. A restarted server reads them back, so it serves the same runs, checkpoints and
finished futures again; a future that was still pending when the server stopped is marked
failed on open, with a message that says so.

One connection, guarded by a lock: the HTTP handlers and the worker thread both write, and
SQLite's own locking is per connection. Every statement is parameterised.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created REAL NOT NULL, last_seen REAL NOT NULL,
    expired INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS models (
    id TEXT PRIMARY KEY, session TEXT NOT NULL, owner TEXT NOT NULL, base TEXT NOT NULL,
    rank INTEGER NOT NULL, seed INTEGER NOT NULL, train_mlp INTEGER NOT NULL,
    train_attn INTEGER NOT NULL, train_unembed INTEGER NOT NULL, created REAL NOT NULL,
    last_seq INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS checkpoints (
    model TEXT NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (model, kind, name));
CREATE TABLE IF NOT EXISTS samplers (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, model TEXT, name TEXT, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS futures (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, model TEXT, seq_key TEXT UNIQUE,
    status TEXT NOT NULL, content_type TEXT, result BLOB, error TEXT, category TEXT,
    created REAL NOT NULL);
"""

LOST = "the server stopped before this request finished; send it again (load_state first if training state matters)"


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # WAL + NORMAL: a killed server loses nothing committed (only a power cut can lose the
        # last commits), and a commit costs no fsync: a training step commits about six times
        self._db.execute("PRAGMA synchronous=NORMAL")
        with self._lock:
            self._db.executescript(SCHEMA)
            # A future pending at the last stop will never finish: say so, once, for good.
            self._db.execute("UPDATE futures SET status='failed', error=?, category='server' "
                             "WHERE status='pending'", (LOST,))
            # Sessions get a fresh heartbeat window after a restart: the server's downtime is
            # not the client's silence.
            self._db.execute("UPDATE sessions SET last_seen=? WHERE expired=0", (time.time(),))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _one(self, sql: str, args=()) -> dict | None:
        with self._lock:
            cur = self._db.execute(sql, args)
            row = cur.fetchone()
            return None if row is None else dict(zip([c[0] for c in cur.description], row))

    def _all(self, sql: str, args=()) -> list[dict]:
        with self._lock:
            cur = self._db.execute(sql, args)
            names = [c[0] for c in cur.description]
            return [dict(zip(names, row)) for row in cur.fetchall()]

    def _run(self, sql: str, args=()) -> int:
        with self._lock:
            return self._db.execute(sql, args).rowcount

    # sessions
    def add_session(self, session_id: str, owner: str) -> None:
        now = time.time()
        self._run("INSERT INTO sessions (id, owner, created, last_seen) VALUES (?, ?, ?, ?)",
                  (session_id, owner, now, now))

    def session(self, session_id: str) -> dict | None:
        return self._one("SELECT * FROM sessions WHERE id=?", (session_id,))

    def touch_session(self, session_id: str) -> None:
        self._run("UPDATE sessions SET last_seen=? WHERE id=?", (time.time(), session_id))

    def silent_sessions(self, older_than: float) -> list[str]:
        """The sessions not expired yet whose last heartbeat is older than ``older_than``."""
        return [row["id"] for row in self._all("SELECT id FROM sessions WHERE expired=0 AND last_seen<?",
                                               (older_than,))]

    def expire_sessions(self, older_than: float) -> list[str]:
        """Marks sessions silent since ``older_than`` expired; returns their ids."""
        silent = self.silent_sessions(older_than)
        for session_id in silent:
            self._run("UPDATE sessions SET expired=1 WHERE id=?", (session_id,))
        return silent

    def expire_sessions_named(self, session_ids: list[str]) -> None:
        for session_id in session_ids:
            self._run("UPDATE sessions SET expired=1 WHERE id=?", (session_id,))

    # models
    def add_model(self, model_id: str, session: str, owner: str, base: str, rank: int, seed: int,
                  train_mlp: bool, train_attn: bool, train_unembed: bool) -> None:
        self._run("INSERT INTO models (id, session, owner, base, rank, seed, train_mlp, train_attn, "
                  "train_unembed, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                  (model_id, session, owner, base, rank, seed, int(train_mlp), int(train_attn),
                   int(train_unembed), time.time()))

    def model(self, model_id: str) -> dict | None:
        return self._one("SELECT * FROM models WHERE id=?", (model_id,))

    def models(self, owner: str) -> list[dict]:
        return self._all("SELECT * FROM models WHERE owner=? ORDER BY created", (owner,))

    def session_models(self, session_id: str) -> list[str]:
        return [r["id"] for r in self._all("SELECT id FROM models WHERE session=?", (session_id,))]

    # checkpoints
    def add_checkpoint(self, model_id: str, kind: str, name: str) -> None:
        self._run("INSERT OR REPLACE INTO checkpoints (model, kind, name, created) VALUES (?, ?, ?, ?)",
                  (model_id, kind, name, time.time()))

    def checkpoint(self, model_id: str, kind: str, name: str) -> dict | None:
        return self._one("SELECT * FROM checkpoints WHERE model=? AND kind=? AND name=?",
                         (model_id, kind, name))

    def checkpoints(self, model_id: str) -> list[dict]:
        return self._all("SELECT * FROM checkpoints WHERE model=? ORDER BY created, rowid", (model_id,))

    def latest_state(self, model_id: str) -> str | None:
        row = self._one("SELECT name FROM checkpoints WHERE model=? AND kind='state' "
                        "ORDER BY created DESC, rowid DESC LIMIT 1", (model_id,))
        return None if row is None else row["name"]

    # sampling sessions
    def add_sampler(self, sampler_id: str, owner: str, model_id: str | None, name: str | None) -> None:
        self._run("INSERT INTO samplers (id, owner, model, name, created) VALUES (?, ?, ?, ?, ?)",
                  (sampler_id, owner, model_id, name, time.time()))

    def sampler(self, sampler_id: str) -> dict | None:
        return self._one("SELECT * FROM samplers WHERE id=?", (sampler_id,))

    # futures
    def add_future(self, future_id: str, owner: str, model_id: str | None, seq_key: str | None) -> str:
        """Records a pending future; a request already seen (same ``seq_key``: a client's retry)
        returns the first one's id instead."""
        with self._lock:
            if seq_key is not None:
                row = self._db.execute("SELECT id FROM futures WHERE seq_key=?", (seq_key,)).fetchone()
                if row is not None:
                    return row[0]
            self._db.execute("INSERT INTO futures (id, owner, model, seq_key, status, created) "
                             "VALUES (?, ?, ?, ?, 'pending', ?)",
                             (future_id, owner, model_id, seq_key, time.time()))
            return future_id

    def finish_future(self, future_id: str, content_type: str, result: bytes) -> None:
        self._run("UPDATE futures SET status='done', content_type=?, result=? WHERE id=?",
                  (content_type, result, future_id))

    def fail_future(self, future_id: str, error: str, category: str) -> None:
        self._run("UPDATE futures SET status='failed', error=?, category=? WHERE id=?",
                  (error, category, future_id))

    def future(self, future_id: str) -> dict | None:
        return self._one("SELECT * FROM futures WHERE id=?", (future_id,))


def as_json(value) -> bytes:
    return json.dumps(value).encode()
