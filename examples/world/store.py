"""The world's two SQLite files.

``api.sqlite`` is the notification API's own store: every application of every key (a new
row each time the effect happens), every request with what became of it (the data
source's and the model's too), and the keys callers aborted. ``example.sqlite`` is the
database the example agent writes to: table ``reports`` whose ``idem_key`` column is
``UNIQUE``, except in the non-deduplicating mode, where nothing but the system's ledger and
lookups stands between a retry and a second row.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

API_SCHEMA = """
CREATE TABLE IF NOT EXISTS applications (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    body TEXT NOT NULL,
    result TEXT NOT NULL,
    received_ms INTEGER NOT NULL,
    applied_ms INTEGER NOT NULL,
    deadline_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS applications_key ON applications(key);
CREATE TABLE IF NOT EXISTS requests (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    endpoint TEXT NOT NULL,
    key TEXT NOT NULL,
    received_ms INTEGER NOT NULL,
    disposition TEXT NOT NULL,
    fault TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS requests_key ON requests(key);
CREATE TABLE IF NOT EXISTS aborted (
    key TEXT PRIMARY KEY, deadline_ms INTEGER NOT NULL, aborted_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

#: The example's table. ``{unique}`` is ``UNIQUE`` unless deduplication is off.
DB_SCHEMA = """
CREATE TABLE IF NOT EXISTS reports (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    idem_key TEXT NOT NULL {unique},
    run_id TEXT NOT NULL,
    source TEXT NOT NULL,
    count INTEGER NOT NULL,
    total REAL NOT NULL,
    body TEXT NOT NULL,
    written_ms INTEGER NOT NULL
);
"""


def now_ms() -> int:
    return int(time.time() * 1000)


class ModeMismatch(RuntimeError):
    pass


def _prefix_clause(column: str, prefix: str | None) -> tuple[str, tuple[Any, ...]]:
    # substr, not LIKE: run ids may contain '_' and '%'.
    if not prefix:
        return "", ()
    return f" WHERE substr({column}, 1, ?) = ?", (len(prefix), prefix)


class ApiStore:
    """The notification API's store. One connection, one lock: each check-and-apply is
    atomic with respect to every other request."""

    def __init__(self, path: Path, dedupe: bool) -> None:
        self.path, self.dedupe = path, dedupe
        self.lock = threading.Lock()
        self.conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(API_SCHEMA)
        _check_mode(self.conn, "meta", dedupe, path)

    def close(self) -> None:
        with self.lock:
            self.conn.close()

    def request(self, endpoint: str, key: str, received: int, fault: str = "") -> int:
        with self.lock:
            cur = self.conn.execute(
                "INSERT INTO requests(endpoint, key, received_ms, disposition, fault) "
                "VALUES (?, ?, ?, 'pending', ?)", (endpoint, key, received, fault))
            return int(cur.lastrowid or 0)

    def settle(self, request: int, disposition: str) -> None:
        with self.lock:
            self.conn.execute("UPDATE requests SET disposition = ? WHERE seq = ?",
                              (disposition, request))

    def apply(self, key: str, body: dict[str, Any], received: int,
              deadline: int) -> tuple[str, dict[str, Any] | None]:
        """Apply the notification unless refused: ``(disposition, result)``.

        Dispositions: ``applied``, ``replayed`` (dedupe on, key applied before),
        ``refused_deadline``, ``refused_aborted``.
        """
        with self.lock:
            if self.conn.execute("SELECT 1 FROM aborted WHERE key = ? AND deadline_ms >= ?",
                                 (key, deadline)).fetchone():
                return "refused_aborted", None
            now = now_ms()
            if now > deadline:
                return "refused_deadline", None
            if self.dedupe:
                row = self.conn.execute("SELECT result FROM applications WHERE key = ? "
                                        "ORDER BY seq LIMIT 1", (key,)).fetchone()
                if row:
                    return "replayed", dict(json.loads(row[0]))
            cur = self.conn.execute(
                "INSERT INTO applications(key, body, result, received_ms, applied_ms, "
                "deadline_ms) VALUES (?, ?, '{}', ?, ?, ?)",
                (key, json.dumps(body), received, now, deadline))
            seq = int(cur.lastrowid or 0)
            result = {"notification_id": seq, "recipient": body.get("recipient"),
                      "applied_ms": now}
            self.conn.execute("UPDATE applications SET result = ? WHERE seq = ?",
                              (json.dumps(result), seq))
            return "applied", result

    def lookup(self, key: str) -> dict[str, Any]:
        with self.lock:
            rows = self.conn.execute("SELECT result FROM applications WHERE key = ? "
                                     "ORDER BY seq", (key,)).fetchall()
            aborted = self.conn.execute("SELECT 1 FROM aborted WHERE key = ?",
                                        (key,)).fetchone() is not None
        return {"key": key, "applied": bool(rows), "count": len(rows), "aborted": aborted,
                "result": json.loads(rows[0][0]) if rows else None}

    def abort(self, key: str, deadline: int) -> dict[str, Any]:
        """Refuse from now on every request for ``key`` whose deadline is ``deadline`` or
        earlier (the attempt being abandoned, and any older one), unless the key was applied
        already: then say so. A later attempt (a later deadline) is not refused."""
        with self.lock:
            row = self.conn.execute("SELECT result FROM applications WHERE key = ? "
                                    "ORDER BY seq LIMIT 1", (key,)).fetchone()
            if row:
                return {"key": key, "applied": True, "aborted": False,
                        "result": json.loads(row[0])}
            self.conn.execute(
                "INSERT INTO aborted(key, deadline_ms, aborted_ms) VALUES (?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET deadline_ms = max(deadline_ms, excluded."
                "deadline_ms), aborted_ms = excluded.aborted_ms", (key, deadline, now_ms()))
        return {"key": key, "applied": False, "aborted": True, "result": None}

    def counts(self, prefix: str | None) -> tuple[dict[str, int], dict[str, int]]:
        """Applications per key, and data-source reads per key."""
        where, args = _prefix_clause("key", prefix)
        with self.lock:
            api = self.conn.execute(f"SELECT key, COUNT(*) FROM applications{where} "
                                    "GROUP BY key", args).fetchall()
            extra = " AND" if where else " WHERE"
            reads = self.conn.execute(
                f"SELECT key, COUNT(*) FROM requests{where}{extra} endpoint = 'source' "
                "AND disposition = 'applied' GROUP BY key", args).fetchall()
        return {k: n for k, n in api}, {k: n for k, n in reads}

    def model_requests(self, prefix: str | None) -> dict[str, int]:
        """Requests the model received per key, whatever became of each."""
        where, args = _prefix_clause("key", prefix)
        extra = " AND" if where else " WHERE"
        with self.lock:
            found = self.conn.execute(
                f"SELECT key, COUNT(*) FROM requests{where}{extra} endpoint = 'model' "
                "GROUP BY key", args).fetchall()
        return {k: n for k, n in found}

    def rows(self, prefix: str | None) -> list[dict[str, Any]]:
        where, args = _prefix_clause("key", prefix)
        with self.lock:
            found = self.conn.execute(f"SELECT key, received_ms, applied_ms FROM applications"
                                      f"{where} ORDER BY seq", args).fetchall()
        return [{"system": "api", "key": k, "received_ms": r, "applied_ms": a}
                for k, r, a in found]

    def requests(self, key: str) -> list[dict[str, Any]]:
        with self.lock:
            found = self.conn.execute("SELECT endpoint, received_ms, disposition, fault "
                                      "FROM requests WHERE key = ? ORDER BY seq",
                                      (key,)).fetchall()
        return [{"endpoint": e, "key": key, "received_ms": r, "disposition": d, "fault": f}
                for e, r, d, f in found]


class ExampleDb:
    """The database the example writes to (the tools open it themselves, by path)."""

    def __init__(self, path: Path, dedupe: bool) -> None:
        self.path, self.dedupe = path, dedupe
        conn = self.connect()
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(DB_SCHEMA.format(unique="UNIQUE" if dedupe else ""))
            conn.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, "
                         "value TEXT NOT NULL)")
            _check_mode(conn, "meta", dedupe, path)
        finally:
            conn.close()

    def connect(self, timeout: float = 10.0) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=timeout, isolation_level=None)

    def counts(self, prefix: str | None) -> dict[str, int]:
        where, args = _prefix_clause("idem_key", prefix)
        conn = self.connect()
        try:
            found = conn.execute(f"SELECT idem_key, COUNT(*) FROM reports{where} "
                                 "GROUP BY idem_key", args).fetchall()
        finally:
            conn.close()
        return {k: n for k, n in found}

    def rows(self, prefix: str | None) -> list[dict[str, Any]]:
        where, args = _prefix_clause("idem_key", prefix)
        conn = self.connect()
        try:
            found = conn.execute(f"SELECT idem_key, written_ms FROM reports{where} ORDER BY id",
                                 args).fetchall()
        finally:
            conn.close()
        return [{"system": "db", "key": k, "received_ms": w, "applied_ms": w} for k, w in found]

    def hold_lock(self, seconds: float) -> None:
        """A fault: hold the write lock for ``seconds`` (writers wait, or time out)."""
        conn = self.connect()
        try:
            conn.execute("BEGIN EXCLUSIVE")
            time.sleep(seconds)
            conn.execute("COMMIT")
        finally:
            conn.close()


def _check_mode(conn: sqlite3.Connection, table: str, dedupe: bool, path: Path) -> None:
    want = "dedupe" if dedupe else "no-dedupe"
    row = conn.execute(f"SELECT value FROM {table} WHERE name = 'mode'").fetchone()
    if row is None:
        conn.execute(f"INSERT INTO {table}(name, value) VALUES ('mode', ?)", (want,))
    elif row[0] != want:
        raise ModeMismatch(f"{path} was created in {row[0]} mode, not {want}: start the "
                           "world with --reset or another --data-dir")
