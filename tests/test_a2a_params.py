"""Every method's parameters and every A2A error, as A2A 1.0 says them, against a real
``durable a2a`` process and a real worker: a bad parameter is -32602 naming it (3.3.2:
validated before processing), a media type the agent does not take -32005 (3.1.1), each
A2A error its code and its ``ErrorInfo`` (5.4, 9.5); never -32603, never a traceback in the
process's log (``serving`` checks it at exit), and nothing started."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import redis

from durable.client import Client
from tests.agent2agent import V1, A2AServer, door, error, published, rpc

__all__ = ["door"]  # the fixture

pytestmark = pytest.mark.timeout(240)


def call(method: str, params: dict[str, Any], request_id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def msg(**fields: Any) -> dict[str, Any]:
    """A 1.0 message with ``fields`` (a field given None is left out)."""
    out = {"messageId": "m-bad", "role": "ROLE_USER", "parts": [{"text": "hi"}], **fields}
    return {"message": {k: v for k, v in out.items() if v is not None}}


def token(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


#: (method, params, the parameter refused).
INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("ListTasks", {"pageSize": 0}, "pageSize"),
    ("ListTasks", {"pageSize": 101}, "pageSize"),
    ("ListTasks", {"pageSize": -3}, "pageSize"),
    ("ListTasks", {"pageToken": "not a token"}, "pageToken"),
    ("ListTasks", {"pageToken": token("12:a/b")}, "pageToken"),
    ("ListTasks", {"pageToken": token("soon:a2a-x")}, "pageToken"),
    ("ListTasks", {"status": "TASK_STATE_BOGUS"}, "status"),
    ("ListTasks", {"status": 99}, "status"),
    ("ListTasks", {"status": True}, "status"),
    ("ListTasks", {"historyLength": -1}, "historyLength"),
    ("GetTask", {"id": "a2a-x", "historyLength": -1}, "historyLength"),
    ("GetTask", {}, "id"),
    ("CancelTask", {}, "id"),
    ("SubscribeToTask", {}, "id"),
    ("SendMessage", msg(role=None), "message.role"),
    ("SendMessage", msg(role="ROLE_BOGUS"), "message.role"),
    ("SendMessage", msg(role="ROLE_AGENT"), "message.role"),
    ("SendMessage", msg(role=7), "message.role"),
    ("SendMessage", msg(messageId=None), "message.messageId"),
    ("SendMessage", msg(parts=[]), "message.parts"),
    ("SendMessage", msg(parts=[{}]), "parts[0]"),
    ("SendMessage", {**msg(), "configuration": {"historyLength": -2}},
     "configuration.historyLength"),
    ("SendStreamingMessage", msg(role=None), "message.role"),
]

#: Parts of a media type the agent does not take (its card: application/json, text/plain).
UNTAKEN = [
    [{"url": "https://example.com/a.pdf", "mediaType": "application/pdf"}],
    [{"raw": "dGNr", "mediaType": "application/x-unsupported"}],
    [{"text": "hi", "mediaType": "image/png"}],
    [{"data": {"text": "hi"}, "mediaType": "text/csv"}],
]


def test_every_bad_parameter_is_refused_naming_it_and_nothing_starts(
        door: A2AServer, worker: Any, client: Client, r: redis.Redis) -> None:
    """3.3.2: each parameter out of its range, of an unknown enum name, missing or
    malformed is -32602 with the parameter in its ErrorInfo; 3.1.1: a part of a media type
    the agent does not take is -32005, as is a body that is not application/json. With a
    worker running, not one run was started."""
    worker()
    published(r, "asker")
    for method, params, field in INVALID:
        got = error(rpc(door, "asker", call(method, params, 5), headers=V1))
        assert got["code"] == -32602, (method, params, got)
        (info,) = got["data"]
        assert info["reason"] == "INVALID_PARAMS" and info["domain"] == "a2a-protocol.org"
        assert info["metadata"]["field"] == field, (method, params, got)
        assert "nothing was started" in got["message"]
    for parts in UNTAKEN:
        got = error(rpc(door, "asker", call("SendMessage", msg(parts=parts)), headers=V1))
        assert got["code"] == -32005, (parts, got)
        assert got["data"][0]["reason"] == "CONTENT_TYPE_NOT_SUPPORTED"
    plain = error(rpc(door, "asker", b'{"jsonrpc": "2.0"}',
                      headers={**V1, "Content-Type": "text/plain"}), 415)
    assert plain["code"] == -32005 and "application/json" in plain["message"]
    # The 0.3 methods go to the same checks (the SDK's 0.3 adapter refuses a message
    # without a role itself, as an invalid request).
    assert error(rpc(door, "asker", call("tasks/get", {"id": "a2a-x", "historyLength": -1})))[
        "code"] == -32602
    agent_said = {"messageId": "m-03", "role": "agent", "parts": [{"kind": "text", "text": "x"}]}
    assert error(rpc(door, "asker", call("message/send", {"message": agent_said})))["code"] == \
        -32602
    no_role = {"messageId": "m-03", "parts": [{"kind": "text", "text": "x"}]}
    assert error(rpc(door, "asker", call("message/send", {"message": no_role})))["code"] == \
        -32600
    assert client.runs() == []
    assert "Code=-32603" not in door.log.read_text()


def test_each_a2a_error_has_its_code_and_error_info(door: A2AServer, worker: Any,
                                                    client: Client, r: redis.Redis) -> None:
    """5.4 and 9.5: TaskNotFound -32001 (an unknown id, another agent's task),
    TaskNotCancelable -32002 (a completed task), PushNotificationNotSupported -32003 (every
    push config method, with push off), UnsupportedOperation -32004 (a message to or a
    subscription of a completed task, the extended card this agent does not declare),
    VersionNotSupported -32009; each with the ErrorInfo of its reason in ``data``."""
    worker()
    published(r, "chat", "asker")
    done = rpc(door, "chat", call("SendMessage", {"message": {
        "messageId": "m-done", "role": "ROLE_USER", "parts": [{"data": {"parts": 1}}]}}),
        headers=V1).json()["result"]["task"]
    assert done["status"]["state"] == "TASK_STATE_COMPLETED", done
    task_id = done["id"]

    def refused(agent: str, method: str, params: dict[str, Any], code: int, reason: str,
                headers: dict[str, str] = V1) -> None:
        got = error(rpc(door, agent, call(method, params), headers=headers))
        assert got["code"] == code, (method, params, got)
        assert got["data"][0] == {"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                                  "reason": reason, "domain": "a2a-protocol.org",
                                  "metadata": got["data"][0]["metadata"]}, got

    refused("chat", "GetTask", {"id": "a2a-unknown"}, -32001, "TASK_NOT_FOUND")
    refused("chat", "GetTask", {"id": "no/such/id"}, -32001, "TASK_NOT_FOUND")
    refused("asker", "GetTask", {"id": task_id}, -32001, "TASK_NOT_FOUND")  # chat's task
    refused("chat", "CancelTask", {"id": "a2a-unknown"}, -32001, "TASK_NOT_FOUND")
    refused("chat", "CancelTask", {"id": task_id}, -32002, "TASK_NOT_CANCELABLE")
    for method, params in (
            ("CreateTaskPushNotificationConfig", {"taskId": task_id, "url": "https://x.org"}),
            ("GetTaskPushNotificationConfig", {"taskId": task_id, "id": "c"}),
            ("ListTaskPushNotificationConfigs", {"taskId": task_id}),
            ("DeleteTaskPushNotificationConfig", {"taskId": task_id, "id": "c"})):
        refused("chat", method, params, -32003, "PUSH_NOTIFICATION_NOT_SUPPORTED")
    to_done = {"message": {"messageId": "m-late", "role": "ROLE_USER", "taskId": task_id,
                           "parts": [{"text": "more"}]}}
    refused("chat", "SendMessage", to_done, -32004, "UNSUPPORTED_OPERATION")
    refused("chat", "SubscribeToTask", {"id": task_id}, -32004, "UNSUPPORTED_OPERATION")
    refused("chat", "GetExtendedAgentCard", {}, -32004, "UNSUPPORTED_OPERATION")
    refused("chat", "SendMessage", msg(), -32009, "VERSION_NOT_SUPPORTED",
            headers={"A2A-Version": "99.0"})
    # 0.3's names answer the same errors.
    assert error(rpc(door, "chat", call("tasks/get", {"id": "a2a-unknown"})))["code"] == -32001
    assert error(rpc(door, "chat", call("tasks/cancel", {"id": task_id})))["code"] == -32002
    assert [x.run_id for x in client.runs()] == [task_id]
