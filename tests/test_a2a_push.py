"""Push notifications of ``durable a2a``: a task's events POSTed, signed, to a real HTTP
receiver that records them; a ``durable a2a`` process that restarts goes on with the tasks
whose notifications it was sending, from the entry it notified last."""

from __future__ import annotations

import asyncio
import hmac
import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from a2a.types import (
    ListTaskPushNotificationConfigsRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError

from durable.a2a.push import signature
from durable.backend.embedded import free_port
from durable.log import keys
from durable.testing import Server, wait_for
from tests.agent2agent import A2AServer, message, published, serving

pytestmark = pytest.mark.timeout(240)

SECRET = "push-secret-" + "s" * 20


class Receiver(http.server.ThreadingHTTPServer):
    """Records every POST: (headers, body)."""

    def __init__(self) -> None:
        self.posts: list[tuple[dict[str, str], bytes]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(h) -> None:
                body = h.rfile.read(int(h.headers["Content-Length"]))
                self.posts.append(({k.lower(): v for k, v in h.headers.items()}, body))
                h.send_response(200)
                h.end_headers()

            def log_message(h, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"

    def states(self) -> list[str]:
        out = []
        for _, body in self.posts:
            data = json.loads(body)
            if "statusUpdate" in data:
                out.append(data["statusUpdate"]["status"]["state"])
            elif "artifactUpdate" in data:
                out.append("artifact:" + data["artifactUpdate"]["artifact"]["artifactId"])
        return out


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    rec = Receiver()
    thread = threading.Thread(target=rec.serve_forever, daemon=True)
    thread.start()
    yield rec
    rec.shutdown()
    rec.server_close()


def test_notifications_are_signed_and_survive_a_restart_of_the_server(
        server: Server, settings: Any, worker: Any, r: redis.Redis, tmp_path: Path,
        receiver: Receiver, layout: keys.KeyLayout) -> None:
    """The task waits for input (notified), the ``durable a2a`` process that was sending its
    notifications stops, another starts and answers it: the rest is notified, each event
    once, each POST signed over its body."""
    worker()
    published(r, "asker")
    args = ("--push-secret", SECRET, "--push-private-urls")
    push = TaskPushNotificationConfig(url=receiver.url, token="tok-123")

    async def first(door: A2AServer) -> str:
        async with door.client("asker", streaming=False) as c:
            refused = message({"text": "x"})
            refused.configuration.task_push_notification_config.CopyFrom(
                TaskPushNotificationConfig(url="ftp://example.com/x"))
            with pytest.raises(InvalidParamsError, match="refused"):
                [i async for i in c.send_message(refused)]
            request = message({"text": "hello"}, context_id="pushed")
            request.configuration.task_push_notification_config.CopyFrom(push)
            (got,) = [i async for i in c.send_message(request)]
            listed = await c.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=got.task.id))
            assert [x.url for x in listed.configs] == [receiver.url]
            # A second receiver the caller named, where nothing listens: each POST to it
            # (of the events after this one) fails, logged as one line (``serving`` finds no
            # traceback in the log).
            await c.create_task_push_notification_config(TaskPushNotificationConfig(
                task_id=got.task.id, id="dead", url=f"http://127.0.0.1:{free_port()}/hook"))
        async with door.client("asker", "globex-bot", streaming=False) as other:
            with pytest.raises(TaskNotFoundError):
                await other.list_task_push_notification_configs(
                    ListTaskPushNotificationConfigsRequest(task_id=got.task.id))
        return str(got.task.id)

    with serving(server, tmp_path / "a", *args) as door:
        task_id = asyncio.run(first(door))
        assert wait_for(lambda: "TASK_STATE_INPUT_REQUIRED" in receiver.states(), 60), \
            receiver.states()
        # Stopped once it has noted what it notified (a stop before would notify it again).
        assert wait_for(lambda: r.hget(keys.a2a_push(task_id), "_cursor") ==
                        r.xrevrange(layout.log(task_id), count=1)[0][0], 30)

    async def answer(door: A2AServer) -> None:
        async with door.client("asker", streaming=False) as c:
            (done,) = [i async for i in c.send_message(
                message(text="go on", task_id=task_id))]
            assert done.task.status.state == TaskState.TASK_STATE_COMPLETED

    with serving(server, tmp_path / "b", *args) as door:
        asyncio.run(answer(door))
        assert wait_for(lambda: "TASK_STATE_COMPLETED" in receiver.states(), 60), \
            receiver.states()
        assert wait_for(lambda: "Error sending push-notification" in door.log.read_text(), 60)
        failed = [line for line in door.log.read_text().splitlines()
                  if "Error sending push-notification" in line]
        assert "ConnectError" in failed[0] and "WARNING" in failed[0], failed
    assert receiver.states() == ["TASK_STATE_INPUT_REQUIRED", "TASK_STATE_WORKING",
                                 "artifact:result", "TASK_STATE_COMPLETED"]
    now = int(time.time() * 1000)
    for headers, body in receiver.posts:
        assert headers["x-a2a-notification-token"] == "tok-123"
        t = int(headers["x-durable-signature"].split(",")[0].removeprefix("t="))
        assert now - 120_000 < t <= now
        assert hmac.compare_digest(headers["x-durable-signature"],
                                   signature(SECRET.encode(), body, t))
