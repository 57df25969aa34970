"""Push notifications: a task's events POSTed to the URLs its caller registered, signed.

Configs are kept in Redis (``keys.a2a_push``), through the SDK's
``PushNotificationConfigStore`` interface; the SDK's ``BasePushNotificationSender`` POSTs
each event (a ``StreamResponse`` as JSON, the config's token in
``X-A2A-Notification-Token``). This process adds a signature over the body, from the
secret ``DURABLE_A2A_PUSH_SECRET``::

    X-Durable-Signature: t=<ms since the epoch>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>

A receiver recomputes it and refuses a stale ``t``. The events are the task's status updates
and its result (no partial output), read from the run's log from the entry notified last
(``_cursor``): a ``durable a2a`` process that restarts goes on with the tasks whose
notifications it was sending. Delivery is a hint, as the SDK's: a failed POST is logged, not
retried; ``tasks/get`` is the truth. URLs are screened by the SDK's policy (public
http(s) addresses only) unless ``--push-private-urls`` allows private and loopback ones.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from collections.abc import Awaitable, Callable

import httpx
import redis.asyncio
from a2a.server.context import ServerCallContext
from a2a.server.tasks import BasePushNotificationSender, PushNotificationConfigStore
from a2a.server.tasks.push_notification_config_store import (
    normalize_push_notification_config,
)
from a2a.types import TaskPushNotificationConfig
from a2a.utils.push_url_validator import validate_push_notification_url
from google.protobuf.json_format import MessageToJson, Parse

from durable.client import Client
from durable.errors import RunNotFound
from durable.log import keys
from durable.log.store import Entry

from . import tasks

log = logging.getLogger("durable.a2a")

CURSOR = "_cursor"
TTL_S = 7 * 24 * 3600


def signature(secret: bytes, body: bytes, t_ms: int) -> str:
    mac = hmac.new(secret, f"{t_ms}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t_ms},v1={mac}"


class RedisPushStore(PushNotificationConfigStore):
    """The SDK's config store, in Redis. Who may read or change a task's configs is checked
    by the handler (the task's tenant) before it gets here."""

    def __init__(self, aredis: Callable[[], redis.asyncio.Redis]) -> None:
        self._r = aredis

    async def set_info(self, task_id: str, notification_config: TaskPushNotificationConfig,
                       context: ServerCallContext) -> TaskPushNotificationConfig:
        config = normalize_push_notification_config(task_id, notification_config)
        config.tenant = ""
        pipe = self._r().pipeline(transaction=True)
        pipe.hset(keys.a2a_push(task_id), config.id, MessageToJson(config))
        pipe.expire(keys.a2a_push(task_id), TTL_S)
        await pipe.execute()
        return config

    async def get_info(self, task_id: str,
                       context: ServerCallContext) -> list[TaskPushNotificationConfig]:
        return await self.get_info_for_dispatch(task_id)

    async def get_info_for_dispatch(self, task_id: str) -> list[TaskPushNotificationConfig]:
        raw = await self._r().hgetall(keys.a2a_push(task_id))
        return [Parse(v, TaskPushNotificationConfig()) for k, v in sorted(raw.items())
                if not k.startswith(b"_")]

    async def delete_info(self, task_id: str, context: ServerCallContext,
                          config_id: str | None = None) -> None:
        await self._r().hdel(keys.a2a_push(task_id), config_id or task_id)


class Pusher:
    """Sends the notifications of the tasks that have configs, one follower per task."""

    def __init__(self, client: Client, aredis: Callable[[], redis.asyncio.Redis],
                 secret: bytes, *, private_urls: bool = False) -> None:
        self.client, self._r, self.secret = client, aredis, secret
        self.store = RedisPushStore(aredis)
        self.validator: Callable[[str], Awaitable[bool]] | None = \
            None if private_urls else validate_push_notification_url
        self.http = httpx.AsyncClient(timeout=10, event_hooks={"request": [self._sign]})
        self.sender = BasePushNotificationSender(self.http, self.store,
                                                 push_url_validator=self.validator)
        self.running: dict[str, asyncio.Task[None]] = {}

    async def _sign(self, request: httpx.Request) -> None:
        request.headers["X-Durable-Signature"] = signature(
            self.secret, request.content, int(time.time() * 1000))

    async def url_ok(self, url: str) -> bool:
        if not url.startswith(("http://", "https://")):
            return False
        return self.validator is None or await self.validator(url)

    def watch(self, run_id: str) -> None:
        """Send the task's notifications from where they were left, if no one here does."""
        if run_id not in self.running:
            task = asyncio.create_task(self._send(run_id))
            self.running[run_id] = task
            task.add_done_callback(lambda _: self.running.pop(run_id, None))

    async def resume(self) -> None:
        """At start: go on with every task that has configs and has not ended."""
        async for key in self._r().scan_iter(match=keys.A2A_PUSH_MATCH, count=500):
            run_id = key.decode().removeprefix(keys.a2a_push(""))
            state = await asyncio.to_thread(self.client.log.projection, run_id)
            if state and state.get("state") not in ("completed", "failed", "canceled",
                                                    "expired"):
                self.watch(run_id)

    async def _send(self, run_id: str) -> None:
        r = self._r()
        cursor = (await r.hget(keys.a2a_push(run_id), CURSOR) or b"0").decode()
        state = await asyncio.to_thread(self.client.status, run_id)
        context, seen = tasks.context_of(state), set[int]()
        items = self.client.afollow(run_id, from_id=cursor, partial=False, client=r)
        try:
            async for item in items:
                for event in tasks.events(item, run_id, context, seen):
                    await self.sender.send_notification(run_id, event)
                if isinstance(item, Entry):
                    await r.hset(keys.a2a_push(run_id), CURSOR, item.id)
        except RunNotFound:
            pass
        except Exception:
            log.exception("push notifications of task %s stopped", run_id)
        finally:
            await items.aclose()  # type: ignore[attr-defined]

    async def aclose(self) -> None:
        for task in list(self.running.values()):
            task.cancel()
        await asyncio.gather(*self.running.values(), return_exceptions=True)
        await self.http.aclose()
