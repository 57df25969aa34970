"""The worker process: an RQ ``SimpleWorker`` that only runs durable command handlers, a
pool of run slots (``workers.pool``), one heartbeat thread for every held lease, and a
cancel listener for the runs it holds.

Why ``SimpleWorker``: a command only hands runs to the pool and returns; forking a horse
per command would add a process start to each for nothing.

Shutdown: SIGTERM or SIGINT stops taking commands and runs; in-flight calls get
``DURABLE_SHUTDOWN_GRACE_S`` to finish; the runs still held are then handed back (leases
released, runs ready again) so another worker continues at once. A second signal skips the
grace period.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
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
from workers.pool import RunPool

log = logging.getLogger("durable.worker")

_loop: StepLoop | None = None
_pool: RunPool | None = None


def current_loop() -> StepLoop:
    """The step loop of this worker process (the handlers RQ calls hand their work to it)."""
    if _loop is None:
        raise RuntimeError("durable command handlers run inside a durable worker process only")
    return _loop


def current_pool() -> RunPool:
    if _pool is None:
        raise RuntimeError("durable command handlers run inside a durable worker process only")
    return _pool


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
               hooks: Sequence[str] = (), concurrency: int | None = None) -> int:
    global _loop, _pool
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
    _pool = pool = RunPool(_loop, concurrency or settings.concurrency)
    listener = CancelListener(settings, connect(settings, check=False), _loop)
    listener.start()
    listener.ready.wait(5)
    queue = make_queue(client, queue_name or settings.queue)
    log.info("worker %s: queue %r, %d run slots, agents: %s", wid, queue.name, pool.size,
             ", ".join(sorted(registry.agents)) or "none")
    worker = DurableWorker([queue], connection=client, name=wid, serializer=queue.serializer)
    worker.work(burst=burst, logging_level="WARNING")
    if burst:
        pool.finish()
        return 0
    return _shut_down(pool, settings.shutdown_grace_s)


def _shut_down(pool: RunPool, grace_s: float) -> int:
    """After RQ's loop ended on a signal: finish or hand back what is held, then exit."""
    force = threading.Event()

    def again(signum: int, frame: object) -> None:
        log.warning("second signal: handing runs back now")
        force.set()

    signal.signal(signal.SIGTERM, again)
    signal.signal(signal.SIGINT, again)
    if pool.busy:
        log.info("shutting down: %d runs in flight, up to %.1f s to finish", pool.busy,
                 grace_s)
    handed = pool.shutdown(grace_s, force)
    if handed:
        log.warning("handed back %d runs: %s", len(handed), ", ".join(handed[:20]))
        logging.shutdown()
        # Their threads may still be inside a tool: nothing of theirs can be written now
        # (the leases are gone), so do not wait for them.
        os._exit(0)
    return 0
