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
import uuid
from collections.abc import Sequence
from typing import Any

from rq import SimpleWorker
from rq.job import Job
from rq.queue import Queue

from durable.agents import registry
from durable.connection import connect
from durable.errors import ForbiddenJob
from durable.log import keys
from durable.queue import HANDLERS, LEGACY_HANDLERS, make_queue
from durable.settings import Settings
from workers.hooks import load_hooks
from workers.listener import CancelListener
from workers.loop import StepLoop

log = logging.getLogger("durable.worker")

_loop: StepLoop | None = None


def current_loop() -> StepLoop:
    """The step loop of this worker process (the handlers RQ calls hand their work to it)."""
    if _loop is None:
        raise RuntimeError("durable command handlers run inside a durable worker process only")
    return _loop


class DurableWorker(SimpleWorker):  # type: ignore[misc]
    """Refuses any job that names a function other than a durable command handler."""

    def perform_job(self, job: Job, queue: Queue, execution: Any) -> bool:
        name = job.func_name
        if name in LEGACY_HANDLERS:
            job.func_name = name = LEGACY_HANDLERS[name]
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


def run_worker(settings: Settings, *, burst: bool = False, queue_name: str | None = None,
               hooks: Sequence[str] = ()) -> int:
    global _loop
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    chain = load_hooks(hooks)
    client = connect(settings)
    registry.load(settings.agents)
    if not registry.agents:
        log.warning("no agents registered: set DURABLE_AGENTS to the modules that define "
                    "them (every run this worker takes will be quarantined as unknown)")
    wid = worker_id()
    _loop = StepLoop(settings, client, registry, wid, queue_name, hooks=chain)
    listener = CancelListener(settings, connect(settings, check=False), _loop)
    listener.start()
    listener.ready.wait(5)
    queue = make_queue(client, queue_name or settings.queue)
    log.info("worker %s serving queue %r with agents: %s", wid, queue.name,
             ", ".join(sorted(registry.agents)) or "none")
    worker = DurableWorker([queue], connection=client, name=wid, serializer=queue.serializer)
    worker.work(burst=burst, logging_level="WARNING")
    return 0
