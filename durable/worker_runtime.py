"""The worker process: an RQ ``SimpleWorker`` that only runs durable command handlers, and
listens for cancel hints for the runs it holds.

Why ``SimpleWorker``: a run's step loop already isolates tool calls on a thread with a
deadline; forking a horse per job would add a process start to every job for nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import uuid
from typing import Any

import redis
from rq import SimpleWorker
from rq.job import Job
from rq.queue import Queue

from durable import events as ev
from durable import keys
from durable.agents import registry
from durable.cancellation import BadMessage, decode_message
from durable.commands import HANDLERS, make_queue
from durable.connection import connect
from durable.driver import Driver
from durable.errors import ConflictError, DecodeError, ForbiddenJob, RunNotFound
from durable.eventlog import EventLog, RunHandle, Spec, Terminal, now_ms
from durable.settings import Settings

log = logging.getLogger("durable.worker")

_driver: Driver | None = None


def current_driver() -> Driver:
    if _driver is None:
        raise RuntimeError("advance() runs inside a durable worker process only")
    return _driver


def record_cancel(elog: EventLog, run_id: str, reason: str, scope: str, ts: int,
                  actor: str) -> RunHandle | None:
    """Make sure the log holds a cancel request for ``run_id``; returns the folded run.

    A published message is only a hint: this is what turns it into a fact (or finds that the
    fact is already there) before anyone acts on it.
    """
    for _ in range(5):
        try:
            handle = elog.load(run_id, actor=actor)
        except (RunNotFound, DecodeError):
            return None
        state = handle.state
        if state.terminal or state.cancel is not None:
            return handle
        try:
            elog.commit(handle, [Spec(ev.CancelRequested, {
                "reason": reason, "scope": scope, "requested_ts": ts or now_ms(), "by": actor})])
            return handle
        except ConflictError:
            continue
        except Terminal:
            return None
    return None


class CancelListener(threading.Thread):
    """Subscribes to the cancel channel; signals the token of runs this worker holds."""

    def __init__(self, settings: Settings, client: redis.Redis, driver: Driver) -> None:
        super().__init__(name="cancel-listener", daemon=True)
        self.settings, self.client, self.driver = settings, client, driver
        self.ready = threading.Event()

    def run(self) -> None:
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(keys.CANCEL_CHANNEL)
        self.ready.set()
        for message in pubsub.listen():
            try:
                self.handle(message.get("data", b""))
            except Exception:
                log.exception("cancel listener")

    def handle(self, data: bytes) -> None:
        try:
            msg = decode_message(data, self.settings.cancel_secret)
        except BadMessage as exc:
            self.client.hincrby(keys.STATS, f"cancel_{exc.kind}", 1)
            log.warning("%s", exc)
            return
        slot = self.driver.held.get(msg.run)
        if slot is None:
            return
        handle = record_cancel(self.driver.log, msg.run, msg.reason, msg.scope, msg.ts,
                               self.driver.worker_id)
        if handle is not None and handle.state.cancel is not None:
            slot.token.cancel(handle.state.cancel.reason or "canceled")


class DurableWorker(SimpleWorker):  # type: ignore[misc]
    """Refuses any job that names a function other than a durable command handler."""

    def perform_job(self, job: Job, queue: Queue, execution: Any) -> bool:
        name = job.func_name
        if name not in HANDLERS:
            self.connection.hincrby(keys.STATS, "forged_jobs", 1)
            log.error("%s", ForbiddenJob(name))
            try:
                raise ForbiddenJob(name)
            except ForbiddenJob:
                self.handle_job_failure(job, queue=queue, exc_string=str(ForbiddenJob(name)),
                                        execution=execution)
            return False
        return bool(super().perform_job(job, queue, execution))


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def run_worker(settings: Settings, *, burst: bool = False, queue_name: str | None = None) -> int:
    global _driver
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    client = connect(settings)
    registry.load(settings.agents)
    wid = worker_id()
    _driver = Driver(settings, client, registry, wid, queue_name)
    listener = CancelListener(settings, connect(settings, check=False), _driver)
    listener.start()
    listener.ready.wait(5)
    queue = make_queue(client, queue_name or settings.queue)
    worker = DurableWorker([queue], connection=client, name=wid, serializer=queue.serializer)
    worker.work(burst=burst, logging_level="WARNING")
    return 0
