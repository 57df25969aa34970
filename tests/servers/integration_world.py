"""What the framework integrations' test agents and tests share: the tools' effects in a real
SQLite database (``tests.servers.effects``, keyed by the step's idempotency key, with no unique
key when ``TEST_DB_DEDUPE=0``: an effect applied twice shows), the lookups that ask it, a real
stdio MCP server's transport (``tests.servers.mcp``), and the tests' environment."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from durable.agents import Lookup
from durable.client import Client
from durable.integrations.base import current_step
from durable.log import events as ev
from tests.servers.effects import effects_db as _db


def effect(what: str) -> dict[str, Any]:
    """One application, keyed by the step's idempotency key (``TEST_SLOW_S`` slows it)."""
    step = current_step()
    assert step is not None, "an effect outside a durable step"
    time.sleep(float(os.environ.get("TEST_SLOW_S", "0")))
    conn = _db()
    try:
        conn.execute("INSERT INTO effects VALUES (?, ?)", (step.key, time.time()))
    finally:
        conn.close()
    return {"done": what, "key": step.key}


def applied(key: str) -> bool:
    conn = _db()
    try:
        return bool(conn.execute("SELECT COUNT(*) FROM effects WHERE key = ?",
                                 (key,)).fetchone()[0])
    finally:
        conn.close()


def book_lookup(key: str, args: dict[str, Any]) -> Lookup:
    """What the database says of a booking: the tool's own result when it was applied."""
    if applied(key):
        return Lookup.applied({"done": f"slot {args['slot']}", "key": key})
    return Lookup.not_applied()


def refund_lookup(key: str, args: dict[str, Any]) -> Lookup:
    if applied(key):
        return Lookup.applied({"done": f"refund {args['order']} {args['cents']}", "key": key})
    return Lookup.not_applied()


def mcp_apply_lookup(key: str, args: dict[str, Any]) -> Lookup:
    """What the MCP server's database says of an ``apply`` call (its own answer's text)."""
    return Lookup.applied(f"applied {args['args']['n']} ({key})") if applied(key) \
        else Lookup.not_applied()


def mcp_server_command() -> tuple[str, list[str], dict[str, str], str]:
    """How to start the test MCP stdio server: command, arguments, environment, directory.
    With ``TEST_MCP_VIA_SHELL=1`` a shell starts it as its child (as ``npx`` or ``uvx`` run
    a server), and waits for it."""
    if os.environ.get("TEST_MCP_VIA_SHELL") == "1":
        return "sh", ["-c", f'"{sys.executable}" -m tests.servers.mcp; exit $?'], \
            dict(os.environ), os.getcwd()
    return sys.executable, ["-m", "tests.servers.mcp"], dict(os.environ), os.getcwd()


def set_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, agents: str,
            **extra: str) -> None:
    """The environment of an integration test's workers: the agent modules, the effects'
    database (never deduplicating), the model's request log, and ``extra``."""
    monkeypatch.setenv("DURABLE_AGENTS", agents)
    monkeypatch.setenv("TEST_DB", str(tmp_path / "world.sqlite"))
    monkeypatch.setenv("TEST_DB_DEDUPE", "0")
    monkeypatch.setenv("TEST_MODEL_LOG", str(tmp_path / "model.sqlite"))
    for name, value in extra.items():
        monkeypatch.setenv(name, value)


#: The agent modules of the OpenAI Agents SDK tests' workers.
OPENAI_AGENTS = "examples.agents,tests.agents.basic,tests.agents.openai_agents"


def set_openai_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, openai_url: str) -> None:
    """The environment of an OpenAI Agents SDK test's workers: ``set_env`` with their
    agents, the local OpenAI-compatible server at ``openai_url``, and the SDK's tracing
    off (it would export to OpenAI)."""
    set_env(monkeypatch, tmp_path, OPENAI_AGENTS, TEST_OPENAI_URL=openai_url,
            OPENAI_AGENTS_DISABLE_TRACING="1")


def decided(client: Client, run: str) -> list[ev.StepDecided]:
    """The steps a run decided, in order."""
    return [e.event for e in client.events(run) if isinstance(e.event, ev.StepDecided)]
