"""The harness of the ``durable mcp`` tests: a real ``durable mcp`` process (random port, a
tokens file of two callers of two tenants) and the official ``mcp`` SDK's client, as an MCP
host calls it.

The SDK's client speaks the 2025-11-25 revision's task methods through its typed requests
(``CallToolRequest`` with ``task``, ``GetTaskRequest``, ...): it ships their wire types, and
its runtime for them is not written yet. ``TaskStatuses`` observes
``notifications/tasks/status`` through the SDK's extension bindings (its 2025 surface leaves
that notification out). On 2026-07-28, ``TasksExtension`` is the client side of the tasks
extension (SEP-2663) on the SDK's extension seam: it declares the extension, claims a
call's ``resultType: "task"`` answer and resolves it by polling ``tasks/get``, answering
its ``inputRequests`` with ``tasks/update``: the runtime the SDK leaves to a later
release."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import anyio
import httpx
import httpx2
import pytest
from mcp import Client, types
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT

from durable.backend.embedded import free_port
from durable.security.callers import new_token
from durable.testing import Server, wait_for
from durable.testing.processes import Process
from tests.agent2agent import elapsed_ms

#: Caller -> tenant, as the tokens file says.
CALLERS = {"acme-bot": "acme", "globex-bot": "globex"}


@dataclass
class TaskStatuses(ClientExtension):
    """The ``notifications/tasks/status`` a client receives, in order."""

    identifier = "io.github.durable-agents/test-task-status"
    seen: list[types.TaskStatusNotificationParams] = field(default_factory=list)

    def notifications(self) -> list[NotificationBinding[Any]]:
        async def keep(params: types.TaskStatusNotificationParams) -> None:
            self.seen.append(params)

        return [NotificationBinding(method="notifications/tasks/status",
                                    params_type=types.TaskStatusNotificationParams,
                                    handler=keep)]


class TaskHandle(types.Result):
    """A call's answer as a task (2026-07-28: ``resultType: "task"``, the task's fields)."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None


class DetailedTask(types.Result):
    """``tasks/get``'s answer on 2026-07-28: the task, its outcome or what it waits for."""

    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    result: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None


class UpdateTaskParams(types.RequestParams):
    task_id: str
    input_responses: dict[str, Any]


class UpdateTaskRequest(types.Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateTaskParams


Answer = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass
class TasksExtension(ClientExtension):
    """The client side of the tasks extension (see the module). ``answer``: what the user
    answers an elicitation the task asks for (its params -> an ``ElicitResult`` dict)."""

    identifier = "io.modelcontextprotocol/tasks"
    answer: Answer | None = None
    handles: list[TaskHandle] = field(default_factory=list)
    polled: list[DetailedTask] = field(default_factory=list)

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=self.resolve)]

    async def resolve(self, handle: TaskHandle, ctx: ClaimContext) -> types.CallToolResult:
        self.handles.append(handle)
        answered: set[str] = set()
        while True:
            got = await modern_get(ctx.session, handle.task_id)
            self.polled.append(got)
            if got.status == "completed":
                return types.CallToolResult.model_validate(got.result, by_name=False)
            if got.status in ("failed", "cancelled"):
                return types.CallToolResult(is_error=True, content=[types.TextContent(
                    type="text", text=f"task {got.status}: {got.status_message}")])
            for key, request in (got.input_requests or {}).items():
                if key not in answered and self.answer is not None:
                    answered.add(key)
                    await modern_update(ctx.session, handle.task_id,
                                        {key: await self.answer(request["params"])})
            await anyio.sleep(0.05)  # faster than its pollIntervalMs: a test


async def modern_get(session: Any, task_id: str) -> DetailedTask:
    got: DetailedTask = await session.send_request(
        types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id)), DetailedTask)
    return got


async def modern_update(session: Any, task_id: str, responses: dict[str, Any]) -> None:
    params = UpdateTaskParams(task_id=task_id, input_responses=responses)
    await session.send_request(UpdateTaskRequest(params=params), types.EmptyResult)


@dataclass
class McpDoor:
    url: str
    proc: Process
    log: Path
    tokens: dict[str, str]  # caller -> token

    @property
    def endpoint(self) -> str:
        return f"{self.url}/mcp"

    def headers(self, caller: str = "acme-bot") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[caller]}"}

    @contextlib.asynccontextmanager
    async def client(self, caller: str = "acme-bot", *, auth: httpx2.Auth | None = None,
                     mode: str = "legacy", **options: Any) -> AsyncIterator[Client]:
        """The SDK's client on this door's endpoint, as ``caller`` (or with ``auth``), on
        the handshake era (the 2025-11-25 revision's task methods) or, ``mode="auto"``, the
        newest (2026-07-28: the tasks extension); ``options`` are ``Client``'s
        (``elicitation_callback``, ``extensions``...)."""
        async with httpx2.AsyncClient(headers={} if auth else self.headers(caller), auth=auth,
                                      timeout=httpx2.Timeout(30, read=300)) as http:
            async with Client(streamable_http_client(self.endpoint, http_client=http),
                              mode=mode, **options) as client:
                yield client


async def call_with_task(client: Client, name: str, arguments: dict[str, Any], *,
                         progress: ProgressFnT | None = None,
                         meta: dict[str, Any] | None = None) -> types.CreateTaskResult:
    """A task-augmented ``tools/call``: the task, at once (``meta``: the request's
    ``_meta``)."""
    request = types.CallToolRequest(params=types.CallToolRequestParams(
        name=name, arguments=arguments, task=types.TaskMetadata(ttl=600_000),
        _meta=cast(types.RequestParamsMeta, meta)))
    got: types.CreateTaskResult = await client.session.send_request(
        request, types.CreateTaskResult, progress_callback=progress)
    return got


class Progress:
    """A progress callback that keeps what it is told, and when (ms since ``t0``)."""

    def __init__(self, t0: float | None = None) -> None:
        self.t0 = time.perf_counter() if t0 is None else t0
        self.seen: list[tuple[float, str]] = []  # (ms since t0, message)

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.seen.append((elapsed_ms(self.t0), message or ""))

    @property
    def messages(self) -> list[str]:
        return [m for _, m in self.seen]

    async def until(self, message: str, timeout: float = 60) -> float:
        """Wait until ``message`` has been told; when it was (ms since ``t0``)."""
        with anyio.fail_after(timeout):
            while True:
                for ms, said in self.seen:
                    if said == message:
                        return ms
                await anyio.sleep(0.01)


def text_of(result: types.CallToolResult) -> str:
    """The text of a tool result's first content block."""
    block = result.content[0]
    assert isinstance(block, types.TextContent), block
    return block.text


async def get_task(client: Client, task_id: str) -> types.GetTaskResult:
    got: types.GetTaskResult = await client.session.send_request(
        types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id)),
        types.GetTaskResult)
    return got


async def task_result(client: Client, task_id: str, *,
                      progress: ProgressFnT | None = None) -> types.CallToolResult:
    """``tasks/result``: blocks until the task has ended (the payload is a
    ``CallToolResult``, the result type of the call that created it)."""
    got: types.CallToolResult = await client.session.send_request(
        types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task_id)),
        types.CallToolResult, progress_callback=progress)
    return got


async def cancel_task(client: Client, task_id: str) -> types.CancelTaskResult:
    got: types.CancelTaskResult = await client.session.send_request(
        types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task_id)),
        types.CancelTaskResult)
    return got


async def list_tasks(client: Client, cursor: str | None = None) -> types.ListTasksResult:
    got: types.ListTasksResult = await client.session.send_request(
        types.ListTasksRequest(params=types.PaginatedRequestParams(cursor=cursor)),
        types.ListTasksResult)
    return got


def tokens_file(folder: Path) -> tuple[Path, dict[str, str]]:
    """A tokens file of ``CALLERS`` in ``folder``, and each caller's token."""
    tokens: dict[str, str] = {}
    lines = []
    for caller, tenant in CALLERS.items():
        token, digest = new_token()
        tokens[caller] = token
        lines.append(f'[tokens.{caller}]\nsha256 = "{digest}"\ntenant = "{tenant}"\n')
    path = folder / "tokens.toml"
    path.write_text("\n".join(lines))
    return path, tokens


@contextlib.contextmanager
def serving(server: Server, folder: Path, *args: str, **env: str) -> Iterator[McpDoor]:
    """A ``durable mcp`` process on the session's Redis (the test's environment)."""
    folder.mkdir(parents=True, exist_ok=True)
    path, tokens = tokens_file(folder)
    port = free_port()
    log = folder / f"mcp-{port}.log"
    # It imports no agent (DURABLE_AGENTS empty): it knows them from the catalog the
    # workers publish, as a front door deployed apart from the agents' code does.
    proc = Process(server.url, ["mcp", "--port", str(port), "--tokens", str(path), *args],
                   log_path=log, env=env, DURABLE_AGENTS="")
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        assert wait_for(up, 60, interval=0.1), log.read_text()
        yield McpDoor(url, proc, log, tokens)
    finally:
        proc.stop()
    assert "Traceback" not in log.read_text(), log.read_text()


@pytest.fixture()
def door(server: Server, settings: Any, tmp_path: Path) -> Iterator[McpDoor]:
    """A ``durable mcp`` process (``serving``) for the test."""
    with serving(server, tmp_path) as running:
        yield running
