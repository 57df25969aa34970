"""The harness of the A2A tests: a real ``durable a2a`` process (random port, a tokens file of
two callers of two tenants) and the official ``a2a-sdk`` client, as another agent calls it."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.client.client import Client as A2AClient
from a2a.types import (
    AgentCard,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    TaskState,
)
from a2a.utils.constants import PROTOCOL_VERSION_0_3
from google.protobuf.json_format import ParseDict
from google.protobuf.struct_pb2 import Value

from durable.backend.embedded import free_port
from durable.log import keys
from durable.security.callers import new_token
from durable.testing import Server, wait_for
from durable.testing.processes import Process

#: Caller -> tenant, as the tokens file says.
CALLERS = {"acme-bot": "acme", "globex-bot": "globex"}
#: The header of a 1.0 request (without it, a request is 0.3's).
V1 = {"A2A-Version": "1.0"}


@dataclass
class A2AServer:
    url: str
    proc: Process
    log: Path
    tokens: dict[str, str]  # caller -> token

    def endpoint(self, agent: str) -> str:
        return f"{self.url}/agents/{agent}/"

    def headers(self, caller: str = "acme-bot") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[caller]}"}

    @contextlib.asynccontextmanager
    async def client(self, agent: str, caller: str = "acme-bot", *, streaming: bool = True,
                     v03: bool = False, auth: httpx.Auth | None = None
                     ) -> AsyncIterator[A2AClient]:
        """The SDK's client for ``agent``'s card, as ``caller`` (or with ``auth``, e.g. a
        console user's ``httpx.BasicAuth``); ``v03``: from the card a 0.3 client reads
        (asked for with ``A2A-Version: 0.3``), through its 0.3 interface (``message/send``,
        ``tasks/get``, ``tasks/resubscribe``...)."""
        async with httpx.AsyncClient(timeout=120, auth=auth,
                                     headers={} if auth else self.headers(caller)) as http:
            factory = ClientFactory(ClientConfig(httpx_client=http, streaming=streaming))
            card = await self.card(agent, http, PROTOCOL_VERSION_0_3 if v03 else None)
            if v03:
                assert [i.protocol_version for i in card.supported_interfaces] == \
                    [PROTOCOL_VERSION_0_3]
            client = factory.create(card)
            try:
                yield client
            finally:
                await client.close()

    async def card(self, agent: str, http: httpx.AsyncClient,
                   version: str | None = None) -> AgentCard:
        """``agent``'s card as the SDK's resolver reads it; ``version``: the card of that
        protocol version (``A2A-Version``; the SDK's client sends 1.0)."""
        from a2a.client import A2ACardResolver

        headers = {"A2A-Version": version} if version else {}
        return await A2ACardResolver(http, self.endpoint(agent)).get_agent_card(
            http_kwargs={"headers": headers})


def rpc(door: A2AServer, agent: str, body: Any, *, caller: str | None = "acme-bot",
        headers: dict[str, str] | None = None) -> httpx.Response:
    """POST ``body`` (JSON, or ``bytes`` as they are) to ``agent``'s endpoint as ``caller``."""
    sent = {**(door.headers(caller) if caller else {}), **(headers or {})}
    content = body if isinstance(body, bytes) else None
    return httpx.post(door.endpoint(agent), content=content,
                      json=None if content is not None else body, headers=sent, timeout=60)


def error(response: httpx.Response, status: int = 200) -> dict[str, Any]:
    """The JSON-RPC error object of ``response``, which has the HTTP ``status``."""
    assert response.status_code == status, (response.status_code, response.text)
    err: dict[str, Any] = response.json()["error"]
    return err


def message(data: Any = None, *, text: str | None = None, message_id: str | None = None,
            task_id: str = "", context_id: str = "") -> SendMessageRequest:
    """A request sending one message: ``data`` as a data part, or ``text``."""
    part = Part(text=text) if text is not None else Part(data=ParseDict(data, Value()))
    return SendMessageRequest(message=Message(
        message_id=message_id or uuid.uuid4().hex, role=Role.ROLE_USER, parts=[part],
        task_id=task_id, context_id=context_id))


def kind(item: StreamResponse) -> str:
    """What a stream item is: task, status:<state>, artifact:<id>, message."""
    which = item.WhichOneof("payload")
    if which == "status_update":
        return f"status:{TaskState.Name(item.status_update.status.state)}"
    if which == "artifact_update":
        return f"artifact:{item.artifact_update.artifact.artifact_id}"
    return str(which)


@contextlib.contextmanager
def serving(server: Server, folder: Path, *args: str) -> Iterator[A2AServer]:
    """A ``durable a2a`` process on the session's Redis (the test's environment)."""
    folder.mkdir(parents=True, exist_ok=True)
    tokens: dict[str, str] = {}
    lines = []
    for caller, tenant in CALLERS.items():
        token, digest = new_token()
        tokens[caller] = token
        lines.append(f'[tokens.{caller}]\nsha256 = "{digest}"\ntenant = "{tenant}"\n')
    path = folder / "tokens.toml"
    path.write_text("\n".join(lines))
    port = free_port()
    log = folder / f"a2a-{port}.log"
    # It imports no agent (DURABLE_AGENTS empty): it knows them from the catalog the
    # workers publish, as a front door deployed apart from the agents' code does.
    proc = Process(server.url, ["a2a", "--port", str(port), "--tokens", str(path), *args],
                   log_path=log, DURABLE_AGENTS="")
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/agents", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        assert wait_for(up, 60, interval=0.1), log.read_text()
        yield A2AServer(url, proc, log, tokens)
    finally:
        proc.stop()
    assert "Traceback" not in log.read_text(), log.read_text()


@pytest.fixture()
def door(server: Server, settings: Any, tmp_path: Path) -> Iterator[A2AServer]:
    """A ``durable a2a`` process (``serving``) for the test."""
    with serving(server, tmp_path) as running:
        yield running


def published(r: Any, *names: str, timeout: float = 60) -> None:
    """Wait until a worker has published ``names`` to the catalog."""
    assert wait_for(lambda: all(r.hexists(keys.AGENTS, n) for n in names), timeout), \
        "no worker published the agents"


def elapsed_ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000
