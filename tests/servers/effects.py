"""The real external system the tests count effects in: a SQLite database whose ``effects``
table holds one row per applied effect, keyed by its idempotency key (``TEST_DB``), and the
``requests`` table a test model server counts model requests in.

Agents' tools (``tests.agents``) and the integrations' world (``tests.servers.integration_world``)
write it; tests read it with ``applications`` and ``model_requests``. Importing it registers
no agent, so a worker that serves only an integration's agents loads no others.
"""

from __future__ import annotations

import os
import sqlite3


def effects_db() -> sqlite3.Connection:
    """A connection to ``TEST_DB``, its ``effects`` table made if missing. With
    ``TEST_DB_DEDUPE=0`` the key has no unique constraint: only the system's ledger and
    lookups prevent duplicates.

    Commits are not synced to disk (a killed process's commits are kept all the same: the
    tests kill processes, not the machine). Synced, 50 overlapping writes took 0.4-0.9 s to
    commit one after another on a busy machine, and the last ones could cross their
    tools' deadline and be refused."""
    conn = sqlite3.connect(os.environ["TEST_DB"], timeout=10, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    unique = "UNIQUE" if os.environ.get("TEST_DB_DEDUPE", "1") == "1" else ""
    conn.execute(f"CREATE TABLE IF NOT EXISTS effects (key TEXT {unique}, at REAL)")
    return conn


def model_requests(db_path: str) -> dict[str, int]:
    """Requests per idempotency key that a test model counted in its SQLite file."""
    conn = sqlite3.connect(db_path)
    try:
        return dict(conn.execute("SELECT key, COUNT(*) FROM requests GROUP BY key").fetchall())
    except sqlite3.OperationalError:
        return {}
    finally:
        conn.close()


def applications(db_path: str) -> dict[str, int]:
    """Applications per idempotency key of the effects in the SQLite file."""
    conn = sqlite3.connect(db_path)
    try:
        rows = conn.execute("SELECT key, COUNT(*) FROM effects GROUP BY key").fetchall()
    except sqlite3.OperationalError:
        return {}
    finally:
        conn.close()
    return {k: n for k, n in rows}
