"""What ``durable mcp`` refuses, against the real process: a missing or wrong credential
(401, naming the schemes), a console viewer (403), another caller's MCP session, an
unknown tool, arguments the agent refuses, an unknown task, a bad cursor, an oversized body,
a bad tokens file or stdio token: each refused with a clear message, nothing started."""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import redis
from mcp import types
from mcp.shared.exceptions import MCPError

from durable.client import Client
from durable.errors import UsageError
from durable.security.callers import Access, Caller, NotAllowed, Tokens
from durable.security.users import User, Users, hash_password
from durable.testing import Server
from tests.agent2agent import published
from tests.conftest import run_durable
from tests.mcp_door import (
    McpDoor,
    call_with_task,
    door,
    get_task,
    list_tasks,
    serving,
    text_of,
    tokens_file,
)

__all__ = ["door"]  # the fixture

pytestmark = pytest.mark.timeout(240)

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {},
    "clientInfo": {"name": "probe", "version": "0"}}}
ACCEPT = {"Accept": "application/json, text/event-stream"}


def post(door: McpDoor, body: Any, headers: dict[str, str]) -> httpx.Response:
    content = body if isinstance(body, bytes) else None
    return httpx.post(door.endpoint, content=content, json=None if content else body,
                      headers={**ACCEPT, "Content-Type": "application/json", **headers},
                      timeout=60)


def basic(name: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()


def test_credentials_and_sessions_are_checked_before_anything_is_served(
        server: Server, worker: Any, client: Client, r: redis.Redis, tmp_path: Path) -> None:
    """No credentials, a wrong token, a wrong password: 401, ``WWW-Authenticate`` naming
    both schemes, a JSON-RPC error object. A console viewer's right password: 403. A
    console operator's is admitted through the SDK's client: its task is a run of the
    default tenant owned by ``mcp:user:<name>``. An MCP session opened by one caller is an
    unknown session (404) to another; a malformed task-augmented call is invalid params; a
    body over twice ``DURABLE_MAX_PAYLOAD_BYTES`` (and 64 KiB) is refused (413)."""
    users = tmp_path / "users.toml"
    users.write_text(f'[users.ops]\npassword = "{hash_password("ops-pw")}"\n'
                     f'roles = ["operator"]\n[users.eve]\npassword = "{hash_password("eve-pw")}"\n')
    worker()
    published(r, "chat")
    with serving(server, tmp_path / "door", "--users", str(users),
                 DURABLE_MAX_PAYLOAD_BYTES="2048") as door:
        for headers, status in (({}, 401), ({"Authorization": "Bearer nope"}, 401),
                                ({"Authorization": basic("ops", "wrong")}, 401),
                                ({"Authorization": basic("eve", "eve-pw")}, 403)):
            refused = post(door, INITIALIZE, headers)
            assert refused.status_code == status, (headers, refused.text)
            error = refused.json()["error"]
            assert error["code"] == -32600
            assert ("Bearer" in error["message"]) if status == 401 else \
                "no operator role" in error["message"]
            if status == 401:
                assert refused.headers["www-authenticate"] == \
                    'Bearer realm="durable mcp", Basic realm="durable mcp"'
        opened = post(door, INITIALIZE, door.headers("acme-bot"))
        assert opened.status_code == 200, opened.text
        session = {"mcp-session-id": opened.headers["mcp-session-id"]}
        stolen = post(door, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                      {**door.headers("globex-bot"), **session})
        assert stolen.status_code == 404, stolen.text
        malformed = post(door, {"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                                "params": {"task": {"ttl": 1}, "arguments": 3}},
                         {**door.headers("acme-bot"), **session})
        assert malformed.status_code == 200 and \
            '"code":-32602' in malformed.text.replace(" ", ""), malformed.text
        huge = post(door, b'{"jsonrpc": "2.0", "id": 3, "method": "tools/list", "x": "'
                    + b"x" * 100_000 + b'"}', {**door.headers("acme-bot"), **session})
        assert huge.status_code == 413, huge.text
        assert client.runs() == []

        async def go() -> str:
            async with door.client(auth=httpx2.BasicAuth("ops", "ops-pw")) as c:
                created = await call_with_task(c, "chat", {"parts": 1, "pause_s": 0})
                return created.task.task_id

        task_id = asyncio.run(go())
    assert [(x.run_id, x.tenant, x.owner) for x in client.runs()] == \
        [(task_id, "", "mcp:user:ops")]


def test_bad_calls_and_task_ids_are_refused_starting_nothing(
        door: McpDoor, worker: Any, client: Client, r: redis.Redis) -> None:
    """An unknown tool is the protocol's error (-32602); arguments the agent's schema
    refuses are a tool error a model can correct (``isError``) of a call without a task,
    and -32602 of one with a task; an unknown task id, a bad cursor and a bad idempotency
    key are -32602. None starts a run."""
    worker()
    published(r, "chat")

    async def go() -> None:
        async with door.client() as c:
            with pytest.raises(MCPError, match="Unknown tool: 'nope'") as exc:
                await c.call_tool("nope", {})
            assert exc.value.error.code == types.INVALID_PARAMS
            bad = await c.call_tool("chat", {"parts": "many"})
            assert bad.is_error and "nothing was started" in text_of(bad), bad
            assert "parts" in text_of(bad)
            with pytest.raises(MCPError, match="nothing was started") as exc:
                await call_with_task(c, "chat", {"parts": "many"})
            assert exc.value.error.code == types.INVALID_PARAMS
            with pytest.raises(MCPError, match="must be a string") as exc:
                await call_with_task(c, "chat", {"parts": 1},
                                     meta={"durable-agents/idempotency-key": 42})
            for task_id in ("mcp-nope", "", "x" * 300, "{a}b", "a b"):
                with pytest.raises(MCPError, match="no task") as exc:
                    await get_task(c, task_id)
                assert exc.value.error.code == types.INVALID_PARAMS
            with pytest.raises(MCPError, match="invalid cursor") as exc:
                await list_tasks(c, cursor="not a run")
            assert exc.value.error.code == types.INVALID_PARAMS

    asyncio.run(go())
    assert client.runs() == []
    assert "Traceback" not in door.log.read_text()


def test_the_tokens_file_and_the_stdio_token_are_checked(tmp_path: Path,
                                                         settings: Any) -> None:
    """A bad tokens file names what is wrong; ``--stdio`` without a token, or with one the
    file does not hold, exits 2 saying so, before it reads or writes anything."""
    bad = tmp_path / "bad.toml"
    for text, says in (("[tokens.x]\nsha256 = 'abc'\n", "64 lowercase hex digits"),
                       ("nope", "not valid TOML"), ("[other]\n", "no [tokens.NAME]")):
        bad.write_text(text)
        with pytest.raises(UsageError, match="MCP tokens file") as exc:
            Tokens.load(bad)
        assert says in str(exc.value)
    path, tokens = tokens_file(tmp_path)
    env = dict(os.environ)
    for token, says in (("", "set DURABLE_MCP_TOKEN"), ("wrong", "not a token of the tokens")):
        done = run_durable("mcp", "--stdio", "--tokens", str(path),
                           env={**env, "DURABLE_MCP_TOKEN": token})
        assert done.returncode == 2 and says in done.stderr, done.stderr
    assert Tokens.load(path).token(tokens["globex-bot"]) == Caller("globex-bot", "globex")


def test_a_users_right_password_is_checked_once_a_wrong_one_every_time(tmp_path: Path) -> None:
    """HTTP Basic sends the password with every call: a right one is hashed (scrypt) once and
    then remembered for ``remember_s``; a wrong one and a viewer's are hashed every time."""
    path = tmp_path / "users.toml"
    path.write_text(f'[users.ops]\npassword = "{hash_password("ops-pw")}"\n'
                    f'roles = ["operator"]\n[users.eve]\npassword = "{hash_password("eve-pw")}"\n')

    class Counted(Users):
        hashed = 0

        def check(self, name: str, password: str) -> User | None:
            Counted.hashed += 1
            return super().check(name, password)

    now = [1000.0]
    access = Access(None, Counted(Users.load(path).users), remember_s=60,
                    clock=lambda: now[0])
    assert [access.check(basic("ops", "ops-pw")) for _ in range(3)] == \
        [Caller("user:ops")] * 3
    assert Counted.hashed == 1
    assert access.check(basic("ops", "wrong")) is None
    assert access.check(basic("ops", "wrong")) is None
    assert Counted.hashed == 3
    with pytest.raises(NotAllowed):
        access.check(basic("eve", "eve-pw"))
    now[0] += 61
    assert access.check(basic("ops", "ops-pw")) == Caller("user:ops")
    assert Counted.hashed == 5
