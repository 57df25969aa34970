"""A real MCP stdio server for the tests (the official SDK's ``MCPServer``), started by the
MCP client of a worker: ``python -m tests.servers.mcp``.

``apply`` writes one row per call into the SQLite file ``TEST_DB`` (``tests.agents.basic``' table,
which keeps every row with ``TEST_DB_DEDUPE=0``), keyed by the idempotency key the call
carries in its ``_meta``: a call applied twice would show. ``peek`` only reads (the server
marks it ``readOnlyHint``). ``TEST_MCP_LISTS`` counts how often the tool list is asked for.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("ledger")


def _conn() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["TEST_DB"], timeout=10, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS effects (key TEXT, at REAL)")
    conn.execute("CREATE TABLE IF NOT EXISTS served (pid INTEGER PRIMARY KEY)")
    conn.execute("INSERT OR IGNORE INTO served VALUES (?)", (os.getpid(),))
    return conn


@server.tool()
def apply(n: int, ctx: Context) -> str:
    """Apply change number n (an effect, keyed by the caller's idempotency key)."""
    key = (ctx.request_context.meta or {}).get("idempotency_key")
    if not key:
        raise ValueError("no idempotency_key in the call's _meta")
    time.sleep(float(os.environ.get("TEST_SLOW_S", "0")))
    conn = _conn()
    try:
        conn.execute("INSERT INTO effects VALUES (?, ?)", (key, time.time()))
        applied = int(conn.execute("SELECT COUNT(*) FROM effects").fetchone()[0])
    finally:
        conn.close()
    die_at = int(os.environ.get("TEST_MCP_DIE_AT", "0"))
    marker = os.environ["TEST_DB"] + ".mcp-died"
    if die_at and applied >= die_at and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return f"applied {n} ({key})"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def peek() -> int:
    """How many changes were applied (reads only)."""
    conn = _conn()
    try:
        return int(conn.execute("SELECT COUNT(*) FROM effects").fetchone()[0])
    finally:
        conn.close()


def sessions(db_path: str) -> int:
    """How many server processes served calls against the database ``db_path``: one per
    session a client kept."""
    conn = sqlite3.connect(db_path)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM served").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


def started_pids(path: str) -> list[int]:
    """The pids of the server processes that wrote to the ``TEST_MCP_PIDS`` file ``path``."""
    try:
        with open(path) as f:
            return [int(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


if __name__ == "__main__":
    if os.environ.get("TEST_MCP_PIDS"):
        with open(os.environ["TEST_MCP_PIDS"], "a") as pids:
            pids.write(f"{os.getpid()}\n")
    try:
        server.run("stdio")
    finally:
        time.sleep(float(os.environ.get("TEST_MCP_LINGER_S", "0")))
