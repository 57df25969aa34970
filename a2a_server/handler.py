"""The A2A SDK's ``RequestHandler`` over ``durable.client.Client``: a task is a run.

The SDK's own ``DefaultRequestHandler`` runs an ``AgentExecutor`` in this process and keeps a
task's events in this process's memory: a resubscribe after this process restarted, or to
another replica, would find nothing. Here the agent runs on the workers and every answer is
read from the run's log, so any ``durable a2a`` process answers for any task, and a stream
that broke is taken up again (``tasks/resubscribe``) from the log.

**Starting nothing twice.** A message that starts a task starts the run
``a2a-<digest of tenant, agent, message id>``: a caller's retry of the same message (same
id, same content) finds the run already started and follows it; the same id with other
content is refused. An answer to a waiting task records its message id with the answer: a
retried answer is recognised and changes nothing.

**Refused, nothing started**: an unknown agent, a file part, a part over
``DURABLE_MAX_PAYLOAD_BYTES``, an input the agent's schema refuses, a task id of another
tenant or agent (answered as an unknown task: whether it exists elsewhere is not told), a
message to a task that does not wait for input, a context whose last task has not ended.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncGenerator

import redis.asyncio
from a2a.server.context import ServerCallContext
from a2a.server.events import Event
from a2a.server.request_handlers import RequestHandler
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
)
from a2a.utils.errors import (
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.task import apply_history_length

from durable import catalog
from durable.client import Client
from durable.controls import sessions
from durable.errors import DurableError, RunIdConflict, RunNotFound, SessionBusy
from durable.log import keys
from durable.log.state import RunState
from durable.security.callers import Caller
from durable.streams.async_streaming import last_id
from durable.streams.streaming import async_twin

from . import listing, messages, tasks
from .params import check_message, history_length, invalid
from .push import Pusher

#: Seconds ``tasks/cancel`` waits for the run to be canceled before it answers with the
#: task as it is (a step that cannot be stopped is let finish, then recorded interrupted).
CANCEL_WAIT_S = 10.0


def run_id_for(tenant: str, agent: str, message_id: str) -> str:
    """The run a message starts: the same for a retry of the same message."""
    raw = "\0".join((tenant, agent, message_id)).encode()
    return "a2a-" + hashlib.sha256(raw).hexdigest()[:32]


def caller_of(context: ServerCallContext) -> Caller:
    caller = context.state.get("caller")
    if not isinstance(caller, Caller):  # the app admits no request without one
        raise InvalidParamsError(message="no caller")
    return caller


class DurableRequestHandler(RequestHandler):
    """Every method reads or acts on runs through ``client`` (its sync calls on threads);
    ``aredis`` follows logs and partial output. The agent is the one of the endpoint called
    (``context.state["agent"]``, set by ``app``)."""

    def __init__(self, client: Client, *, push_secret: bytes | None = None,
                 push_private_urls: bool = False) -> None:
        self.client = client
        self.max_bytes = client.settings.payloads.max_payload_bytes
        self._aredis: redis.asyncio.Redis | None = None
        #: Push notifications, when a secret signs them (``push``).
        self.pusher = None if push_secret is None else \
            Pusher(client, lambda: self.aredis, push_secret, private_urls=push_private_urls)

    @property
    def aredis(self) -> redis.asyncio.Redis:
        """One async client (one pool) for every follower, made in the serving loop."""
        if self._aredis is None:
            self._aredis = async_twin(self.client.redis)
        return self._aredis

    async def aclose(self) -> None:
        if self.pusher is not None:
            await self.pusher.aclose()
        if self._aredis is not None:
            await self._aredis.aclose()
            self._aredis = None

    # Reading -------------------------------------------------------------------------

    async def _run(self, run_id: str, context: ServerCallContext,
                   field: str = "id") -> RunState:
        """The run of ``run_id`` (the parameter ``field``) if it is the caller's tenant's and
        the endpoint's agent's; else ``TaskNotFoundError``."""
        caller = caller_of(context)
        if not run_id:
            raise invalid(field, "a task id is required")
        proj = await asyncio.to_thread(self.client.log.projection, run_id) \
            if keys.RUN_ID_RE.match(run_id) else {}
        if not proj or proj.get("tenant", "") != caller.tenant or \
                proj.get("agent") != context.state.get("agent"):
            raise TaskNotFoundError(message=f"no task {run_id!r}")
        return await asyncio.to_thread(self.client.status, run_id)

    async def _last(self, run_id: str) -> str:
        return last_id(await self.aredis.xrevrange(self.client.log.keys.log(run_id),
                                                   count=1)) or "0"

    async def on_get_task(self, request: GetTaskRequest,
                          context: ServerCallContext) -> Task | None:
        history_length(request)
        return apply_history_length(tasks.task(await self._run(request.id, context)), request)

    async def on_list_tasks(self, request: ListTasksRequest,
                            context: ServerCallContext) -> ListTasksResponse:
        return await listing.list_tasks(self.client, request, str(context.state.get("agent")),
                                        caller_of(context).tenant)

    # Acting --------------------------------------------------------------------------

    async def on_cancel_task(self, params: CancelTaskRequest,
                             context: ServerCallContext) -> Task | None:
        state = await self._run(params.id, context)
        if state.terminal:
            raise TaskNotCancelableError(message=f"task {params.id} is {state.state}")
        caller = caller_of(context)
        await asyncio.to_thread(self.client.cancel, params.id, "canceled by an A2A caller",
                                by=caller.owner)
        end = asyncio.get_running_loop().time() + CANCEL_WAIT_S
        delay = 0.01
        while not state.terminal and asyncio.get_running_loop().time() < end:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)
            state = await asyncio.to_thread(self.client.status, params.id)
        return tasks.task(state)

    async def _begin(self, params: SendMessageRequest,
                     context: ServerCallContext) -> tuple[RunState, str]:
        """Start the run the message asks for, or give the task it names its answer; the
        run's state and the log entry to follow from ("0": from its start)."""
        msg = params.message
        check_message(msg)
        history_length(params.configuration, "configuration.historyLength")
        if msg.task_id:
            return await self._answer(msg, context)
        caller = caller_of(context)
        agent = str(context.state.get("agent"))
        item = await asyncio.to_thread(catalog.published, self.client.redis, agent)
        if item is None:
            raise InvalidParamsError(message=f"no agent {agent!r} is published here")
        data = messages.run_input(msg, item.schema, self.max_bytes)
        push = params.configuration.task_push_notification_config \
            if params.configuration.HasField("task_push_notification_config") else None
        if push is not None:
            await self._push_ok(push)
        run_id = run_id_for(caller.tenant, agent, msg.message_id)
        context_id = msg.context_id or f"ctx-{run_id}"
        session = tasks.session_of(agent, context_id)
        if not sessions.NAME_RE.match(session):
            raise InvalidParamsError(message=f"invalid context id {context_id!r}: use 1-"
                                     f"{127 - len(agent)} of A-Z a-z 0-9 _ . : @ + -")
        try:
            started = await asyncio.to_thread(
                self.client.start, agent, data, run_id, tenant=caller.tenant or None,
                owner=caller.owner, session=session)
        except RunIdConflict:
            raise InvalidParamsError(message=f"message id {msg.message_id!r} was sent "
                                     "already with other content: a new message needs a "
                                     "new id; nothing was started") from None
        except SessionBusy as exc:
            raise InvalidParamsError(message=f"context {context_id!r} has a task that has not "
                                     f"ended ({exc}): send again when it has; nothing was "
                                     "started") from None
        except DurableError as exc:
            raise InvalidParamsError(message=f"{exc}; nothing was started") from None
        after = "0" if started.created else await self._last(run_id)
        if push is not None and self.pusher is not None:
            await self.pusher.store.set_info(run_id, push, context)
            self.pusher.watch(run_id)
        return await asyncio.to_thread(self.client.status, run_id), after

    async def _answer(self, msg: Message, context: ServerCallContext) -> tuple[RunState, str]:
        state = await self._run(msg.task_id, context)
        if msg.context_id and msg.context_id != tasks.context_of(state):
            raise InvalidParamsError(message=f"task {msg.task_id} is of context "
                                     f"{tasks.context_of(state)!r}, not {msg.context_id!r}")
        by = f"{caller_of(context).owner} message {msg.message_id}"[:200]
        after = await self._last(msg.task_id)
        if state.state != "waiting_input":
            if state.last_wait is not None and state.last_wait.by == by:
                return state, after  # this answer, sent again: it was taken already
            if state.terminal:
                raise UnsupportedOperationError(
                    message=f"task {msg.task_id} is {state.state}: a message without a task "
                    "id, in the same context, starts the next one")
            raise InvalidParamsError(message=f"task {msg.task_id} does not wait for input "
                                     f"({tasks.status_text(state) or state.state})")
        assert state.wait is not None
        data = messages.answer(msg, self.max_bytes)
        try:
            state = await asyncio.to_thread(self.client.respond, msg.task_id, data,
                                            request=state.wait.request, by=by)
        except DurableError as exc:
            raise InvalidParamsError(message=f"{exc}; nothing was written") from None
        return state, after

    async def _follow(self, state: RunState, after: str) -> AsyncGenerator[tasks.Event]:
        """The task's events after entry ``after``, until a final or interrupted status."""
        run_id, context = state.run_id, tasks.context_of(state)
        seen: set[int] = set()
        items = self.client.afollow(run_id, from_id=after, client=self.aredis)
        try:
            async for item in items:
                for event in tasks.events(item, run_id, context, seen):
                    yield event
                    if tasks.ends(event):
                        return
        except RunNotFound:
            raise TaskNotFoundError(message=f"task {run_id} expired") from None
        finally:
            await items.aclose()  # type: ignore[attr-defined]

    async def on_message_send(self, params: SendMessageRequest,
                              context: ServerCallContext) -> Task | Message:
        state, after = await self._begin(params, context)
        if not params.configuration.return_immediately and not _stops(state):
            async for _ in self._follow(state, after):
                pass
        state = await asyncio.to_thread(self.client.status, state.run_id)
        return apply_history_length(tasks.task(state), params.configuration)

    async def on_message_send_stream(self, params: SendMessageRequest,
                                     context: ServerCallContext) -> AsyncGenerator[Event]:
        state, after = await self._begin(params, context)
        yield apply_history_length(tasks.task(state), params.configuration)
        if _stops(state) and after != "0":
            return
        async for event in self._follow(state, after):
            yield event

    async def on_subscribe_to_task(self, params: SubscribeToTaskRequest,
                                   context: ServerCallContext) -> AsyncGenerator[Event]:
        after = await self._last(params.id)
        state = await self._run(params.id, context)
        if state.terminal:
            raise UnsupportedOperationError(
                message=f"task {params.id} is {state.state}: nothing more to stream "
                "(tasks/get returns it)")
        yield tasks.task(state)
        async for event in self._follow(state, after):
            yield event

    # Push notifications ----------------------------------------------------------------

    def _pushing(self) -> Pusher:
        if self.pusher is None:
            raise PushNotificationNotSupportedError(
                message="push notifications are off (no DURABLE_A2A_PUSH_SECRET)")
        return self.pusher

    async def _push_ok(self, config: TaskPushNotificationConfig) -> None:
        if not await self._pushing().url_ok(config.url):
            raise InvalidParamsError(message=f"push URL {config.url!r} refused: a public "
                                     "http(s) address only; nothing was started")

    async def on_create_task_push_notification_config(
            self, params: TaskPushNotificationConfig,
            context: ServerCallContext) -> TaskPushNotificationConfig:
        pusher = self._pushing()
        await self._run(params.task_id, context)
        await self._push_ok(params)
        stored = await pusher.store.set_info(params.task_id, params, context)
        pusher.watch(params.task_id)
        return stored

    async def on_get_task_push_notification_config(
            self, params: GetTaskPushNotificationConfigRequest,
            context: ServerCallContext) -> TaskPushNotificationConfig:
        pusher = self._pushing()
        await self._run(params.task_id, context)
        for config in await pusher.store.get_info(params.task_id, context):
            if config.id == params.id:
                return config
        raise TaskNotFoundError(message=f"no push config {params.id!r} of {params.task_id}")

    async def on_list_task_push_notification_configs(
            self, params: ListTaskPushNotificationConfigsRequest,
            context: ServerCallContext) -> ListTaskPushNotificationConfigsResponse:
        pusher = self._pushing()
        await self._run(params.task_id, context)
        return ListTaskPushNotificationConfigsResponse(
            configs=await pusher.store.get_info(params.task_id, context))

    async def on_delete_task_push_notification_config(
            self, params: DeleteTaskPushNotificationConfigRequest,
            context: ServerCallContext) -> None:
        pusher = self._pushing()
        await self._run(params.task_id, context)
        await pusher.store.delete_info(params.task_id, context, params.id)

    async def on_get_extended_agent_card(self, params: GetExtendedAgentCardRequest,
                                         context: ServerCallContext) -> AgentCard:
        # The card does not declare capabilities.extendedAgentCard: A2A 1.0 (3.3.4) answers
        # UnsupportedOperationError (ExtendedAgentCardNotConfigured is for a card that does).
        raise UnsupportedOperationError(message="this agent has no extended card: its "
                                        "public card is all there is")


def _stops(state: RunState) -> bool:
    """Whether a stream of the task has nothing to wait for: it has ended or waits."""
    return tasks.task_state(state) in tasks.TERMINAL | tasks.INTERRUPTED

