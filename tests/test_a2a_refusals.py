"""What ``durable a2a`` refuses, against the real process: a malformed request gets the
protocol's error object (never a 500), an unknown agent, a missing token, an oversized or a
file part, an input the schema refuses, a message id reused for other content, a busy
context, a task id of another tenant: each refused with a clear message, nothing started,
nothing written to the run it names."""

from __future__ import annotations

import asyncio
import base64
import os
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import TaskNotFoundError

from durable.client import Client
from durable.errors import UsageError
from durable.security.callers import Access, Caller, NotAllowed, Tokens
from durable.security.users import User, Users, hash_password
from durable.testing import Server
from tests.agent2agent import V1, A2AServer, door, error, message, published, rpc, serving
from tests.conftest import run_durable

__all__ = ["door"]  # the fixture

pytestmark = pytest.mark.timeout(240)

def send(text: str | None = None, data: Any = None, message_id: str = "m-1",
         **extra: Any) -> dict[str, Any]:
    part = {"text": text} if text is not None else {"data": data}
    return {"jsonrpc": "2.0", "id": 7, "method": "SendMessage", "params": {"message": {
        "messageId": message_id, "role": "ROLE_USER", "parts": [part], **extra}}}


def test_malformed_requests_get_the_protocols_error_objects(door: A2AServer, worker: Any,
                                                            client: Client,
                                                            r: redis.Redis) -> None:
    worker()
    published(r, "chat")
    assert error(rpc(door, "chat", b"{not json"))["code"] == -32700
    assert error(rpc(door, "chat", {"jsonrpc": "2.0", "id": 1}))["code"] == -32600
    assert error(rpc(door, "chat", [send("x")]))["code"] == -32600  # a batch
    assert error(rpc(door, "chat", {"jsonrpc": "2.0", "id": 1, "method": "Nope"}))["code"] \
        == -32601
    assert error(rpc(door, "chat", {"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                                   "params": {"message": 5}}, headers=V1))["code"] == -32602
    assert error(rpc(door, "chat", {"jsonrpc": "2.0", "id": 1, "method": "message/send",
                                   "params": {"message": "hi"}}))["code"] == -32600
    no_id = error(rpc(door, "chat", send(data={"parts": 1}, message_id=""), headers=V1))
    assert no_id["code"] == -32602 and "message id" in no_id["message"]
    assert client.runs() == []


def test_unknown_agent_missing_token_and_big_bodies_are_refused(
        door: A2AServer, worker: Any, client: Client, r: redis.Redis) -> None:
    worker()
    published(r, "chat")
    unknown = error(rpc(door, "nope", send("hi"), headers=V1), 404)
    assert "no agent 'nope'" in unknown["message"]
    for caller, headers in ((None, {}), (None, {"Authorization": "Bearer wrong"})):
        refused = rpc(door, "chat", send(data={"parts": 1}), caller=caller,
                      headers={**V1, **headers})
        assert "bearer token" in error(refused, 401)["message"]
        assert refused.headers["www-authenticate"].startswith("Bearer")
    limit = client.settings.payloads.max_payload_bytes
    big = error(rpc(door, "chat", send(data={"parts": 1, "pad": "x" * (3 * limit)}),
                    headers=V1), 413)
    assert "nothing was started" in big["message"]
    assert client.runs() == []


def test_bad_parts_and_inputs_start_nothing(door: A2AServer, worker: Any, client: Client,
                                            r: redis.Redis) -> None:
    worker()
    published(r, "chat", "asker")
    limit = client.settings.payloads.max_payload_bytes
    over = error(rpc(door, "asker", send("x" * (limit + 1)), headers=V1))
    assert over["code"] == -32602 and f"over the limit of {limit}" in over["message"]
    file_part = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {
        "messageId": "f", "role": "ROLE_USER", "parts": [{"url": "http://x/y.pdf"}]}}}
    refused_file = error(rpc(door, "asker", file_part, headers=V1))
    assert refused_file["code"] == -32005 and "a file (url part)" in refused_file["message"]
    schema = error(rpc(door, "chat", send(data={"parts": "three"}), headers=V1))
    assert schema["code"] == -32602 and "parts" in schema["message"]
    no_text = error(rpc(door, "chat", send("hello"), headers=V1))
    assert "no single text field" in no_text["message"]
    assert client.runs() == []


def test_reused_ids_busy_contexts_and_other_tenants_tasks(door: A2AServer, worker: Any,
                                                          client: Client,
                                                          r: redis.Redis) -> None:
    """acme's task is invisible to globex: get, cancel, subscribe and an answer naming it
    are refused as unknown, and the task is still waiting, untouched."""
    worker()
    published(r, "asker")

    async def go() -> None:
        async with door.client("asker", streaming=False) as acme:
            (first,) = [i async for i in acme.send_message(
                message({"text": "a"}, message_id="same", context_id="c-1"))]
            task = first.task
            assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            with pytest.raises(Exception, match="other content"):
                [i async for i in acme.send_message(
                    message({"text": "b"}, message_id="same", context_id="c-1"))]
            with pytest.raises(Exception, match="has a task that has not ended"):
                [i async for i in acme.send_message(message({"text": "c"}, context_id="c-1"))]
            with pytest.raises(Exception, match="invalid context id"):
                [i async for i in acme.send_message(message({"text": "d"}, context_id="a/b"))]
        async with door.client("asker", "globex-bot", streaming=False) as globex:
            with pytest.raises(TaskNotFoundError):
                await globex.get_task(GetTaskRequest(id=task.id))
            with pytest.raises(TaskNotFoundError):
                await globex.cancel_task(CancelTaskRequest(id=task.id))
            with pytest.raises(TaskNotFoundError):
                [i async for i in globex.send_message(SendMessageRequest(message=Message(
                    message_id="g", role=Role.ROLE_USER, task_id=task.id,
                    parts=[Part(text="answer")])))]
        async with door.client("asker", "globex-bot") as streaming:
            with pytest.raises(TaskNotFoundError):
                [i async for i in streaming.subscribe(SubscribeToTaskRequest(id=task.id))]

    asyncio.run(go())
    state = client.status(client.runs()[0].run_id)
    assert state.state == "waiting_input" and state.cancel is None
    assert [x.tenant for x in client.runs()] == ["acme"]


@pytest.mark.parametrize(("text", "error"), [
    ("not toml [", "not valid TOML"),
    ("title = 'none'\n", "no [tokens.NAME] entries"),
    ("[tokens.a]\nsha256 = 'abc'\n", "64 lowercase hex digits"),
    (f"[tokens.a]\nsha256 = '{'0' * 64}'\ntenant = 'bad tenant'\n", "invalid tenant"),
    (f"[tokens.a]\nsha256 = '{'0' * 64}'\n[tokens.b]\nsha256 = '{'0' * 64}'\n",
     "the same token as 'a'"),
])
def test_a_bad_tokens_file_is_refused_naming_what_is_wrong(tmp_path: Path, text: str,
                                                           error: str) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=re.escape(error)):
        Tokens.load(path, "a2a")


def test_the_command_refuses_to_serve_without_tokens_and_makes_them(
        settings: Any, tmp_path: Path) -> None:
    env = dict(os.environ)
    env.pop("DURABLE_A2A_TOKENS", None)
    env.pop("DURABLE_CONSOLE_USERS", None)
    out = run_durable("a2a", env=env)
    assert out.returncode != 0 and "DURABLE_A2A_TOKENS" in out.stderr
    out = run_durable("a2a", "--dev", "--host", "0.0.0.0", env=env)
    assert out.returncode != 0 and "only on a loopback address" in out.stderr
    made = run_durable("a2a", "--new-token", "bot", "--tenant", "acme", env=env)
    assert made.returncode == 0, made.stderr
    token = made.stdout.split("it is not kept): ")[1].split()[0]
    (tmp_path / "t.toml").write_text(made.stdout.split("\n\n", 1)[1])
    tokens = Tokens.load(tmp_path / "t.toml", "a2a")
    assert tokens.check(f"Bearer {token}") == Caller("bot", "acme", "a2a")
    assert tokens.check("Bearer nope") is None and tokens.check(token) is None


def test_a_console_operators_password_starts_a_task_a_wrong_one_nothing(
        server: Server, worker: Any, client: Client, r: redis.Redis, tmp_path: Path) -> None:
    """The console's users file (``--users``) admits its operators by HTTP Basic: through the
    SDK's client, an operator's name and password start a task, a run of the default tenant
    owned by ``a2a:user:<name>``. A wrong password or an unknown user get the protocol's 401
    error object, naming both schemes; a viewer's right password a 403: nothing started."""
    users = tmp_path / "users.toml"
    users.write_text(f'[users.ops]\npassword = "{hash_password("ops-pw")}"\n'
                     f'roles = ["operator"]\n[users.eve]\npassword = "{hash_password("eve-pw")}"\n')
    worker()
    published(r, "chat")
    with serving(server, tmp_path / "door", "--users", str(users)) as door:
        for name, password, status in (("ops", "wrong", 401), ("nobody", "ops-pw", 401),
                                       ("eve", "eve-pw", 403)):
            basic = "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()
            refused = error(rpc(door, "chat", send(data={"parts": 1}), caller=None,
                                headers={**V1, "Authorization": basic}), status)
            assert refused["code"] == -32600, refused
            assert ("Basic" in refused["message"]) if status == 401 else \
                "no operator role" in refused["message"]
        refused_http = rpc(door, "chat", send(data={"parts": 1}), caller=None, headers=V1)
        assert refused_http.headers["www-authenticate"] == \
            'Bearer realm="durable a2a", Basic realm="durable a2a"'
        assert client.runs() == []

        async def go() -> str:
            async with httpx.AsyncClient() as http:
                card = await door.card("chat", http)
            assert set(card.security_schemes) == {"bearer", "basic"}
            assert card.security_schemes["basic"].http_auth_security_scheme.scheme == "basic"
            async with door.client("chat", streaming=False,
                                   auth=httpx.BasicAuth("ops", "ops-pw")) as c:
                items = [i async for i in c.send_message(message({"parts": 1, "pause_s": 0}))]
                task_id = items[-1].task.id
                done = await c.get_task(GetTaskRequest(id=task_id))
                assert done.status.state == TaskState.TASK_STATE_COMPLETED, done
            with pytest.raises(Exception, match="401"):
                async with door.client("chat", streaming=False,
                                       auth=httpx.BasicAuth("ops", "wrong")) as c:
                    [i async for i in c.send_message(message({"parts": 1}))]
            return str(task_id)

        task_id = asyncio.run(go())
    assert [(x.run_id, x.tenant, x.owner) for x in client.runs()] == \
        [(task_id, "", "a2a:user:ops")]


def test_a_users_right_password_is_checked_once_a_wrong_one_every_time(tmp_path: Path) -> None:
    """HTTP Basic sends the password with every call: a right one is hashed (scrypt) once and
    then remembered for ``remember_s``; a wrong one, another user's, a viewer's and one past
    that time are each hashed again; a wrong password sent after the right one is still
    refused."""
    path = tmp_path / "users.toml"
    path.write_text(f'[users.ops]\npassword = "{hash_password("ops-pw")}"\n'
                    f'roles = ["operator"]\n[users.eve]\npassword = "{hash_password("eve-pw")}"\n')

    class Counted(Users):
        hashed = 0

        def check(self, name: str, password: str) -> User | None:
            Counted.hashed += 1
            return super().check(name, password)

    now = [1000.0]
    access = Access(None, Counted(Users.load(path).users), door="a2a", remember_s=60,
                    clock=lambda: now[0])

    def basic(name: str, password: str) -> str:
        return "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()

    assert [access.check(basic("ops", "ops-pw")) for _ in range(5)] == \
        [Caller("user:ops", door="a2a")] * 5
    assert Counted.hashed == 1
    assert access.check(basic("ops", "wrong")) is None
    assert access.check(basic("ops", "wrong")) is None
    assert Counted.hashed == 3
    for _ in range(2):
        with pytest.raises(NotAllowed):
            access.check(basic("eve", "eve-pw"))  # remembered, and still not an operator
    assert Counted.hashed == 4
    now[0] += 61
    assert access.check(basic("ops", "ops-pw")) == Caller("user:ops", door="a2a")
    assert Counted.hashed == 5
