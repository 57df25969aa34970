"""The worker process: an RQ ``SimpleWorker`` that only runs durable command handlers, a
pool of run slots (``workers.pool``), one heartbeat thread for every held lease, and a
cancel listener for the runs it holds.

Why ``SimpleWorker``: a command only hands runs to the pool and returns; forking a horse
per command would add a process start to each for nothing.

Shutdown: SIGTERM or SIGINT stops taking commands and runs; in-flight calls get
``DURABLE_SHUTDOWN_GRACE_S`` to finish; the runs still held are then handed back (leases
released, runs ready again) so another worker continues at once. A second signal skips the
grace period. A signal (or a restart the step loop asks for) that arrives while the worker
is still starting, before RQ's loop has its own handlers, is kept and ends that loop as soon
as it starts: the runs the pool took meanwhile are handed back all the same.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import redis
from redis.exceptions import NoPermissionError
from rq import SimpleWorker
from rq.exceptions import StopRequested
from rq.job import Job
from rq.queue import Queue

from durable import catalog
from durable.agents import registry
from durable.backend.connection import client_url, connect, safe_url
from durable.backend.outages import Backoff
from durable.errors import ForbiddenJob
from durable.eventloop import EVENT_LOOP
from durable.log import keys
from durable.queue import HANDLERS, LEGACY_HANDLERS
from durable.security.sealing import require_keys
from durable.settings import Settings
from durable.streams.streaming import Publisher
from durable.telemetry.liveness import Presence

from . import metrics as worker_metrics
from .hooks import load_hooks
from .hub import RunHub
from .listener import CancelListener
from .loop import StepLoop
from .pool import RunPool
from .slots import Driver, routes

log = logging.getLogger("durable.worker")

_loop: StepLoop | None = None
_pool: Driver | None = None
#: How long RQ's pub/sub thread waits for a message before it looks whether it should stop.
PUBSUB_POLL_S = 0.25
#: The longest RQ's dequeue (``BLMOVE``) holds the main thread. A signal's Python handler
#: runs on the main thread only, at its next bytecode; a SIGTERM the kernel delivered to
#: another thread (or just before the main thread blocked) waits until that call returns.
DEQUEUE_POLL_S = 1
#: Set by a SIGTERM/SIGINT received before RQ's loop installed its own handlers.
_early_stop = threading.Event()


def _stop_early(signum: int, frame: object) -> None:
    _early_stop.set()


def current_loop() -> StepLoop:
    """The step loop of this worker process (the handlers RQ calls hand their work to it)."""
    if _loop is None:
        raise RuntimeError("durable command handlers run inside a durable worker process only")
    return _loop


def current_pool() -> Driver:
    if _pool is None:
        raise RuntimeError("durable command handlers run inside a durable worker process only")
    return _pool


class DurableWorker(SimpleWorker):  # type: ignore[misc]
    """Runs durable command handlers only. A job that cannot be decoded (pickled, garbage)
    or that names any other function is refused and counted before anything is imported or
    unpickled (the queue's serializer is JSON), and the worker goes on."""

    def perform_job(self, job: Job, queue: Queue, execution: Any) -> bool:
        try:
            name = job.func_name
        except Exception as exc:  # rq's DeserializationError, raised from the decode error
            cause = exc.__cause__ or exc
            return self._refuse(job, queue, execution, "poison_jobs",
                                f"refused job {job.id}: undecodable ({cause!r:.200})")
        if name in LEGACY_HANDLERS:
            job.func_name = name = LEGACY_HANDLERS[name]
        if name not in HANDLERS:
            return self._refuse(job, queue, execution, "forged_jobs", str(ForbiddenJob(name)))
        return bool(super().perform_job(job, queue, execution))

    @property
    def dequeue_timeout(self) -> int:
        """RQ's dequeue blocks ``DEQUEUE_POLL_S`` at a time (RQ's own: its TTL less 15 s, 405 s),
        so it holds up a stop for a second at most."""
        return DEQUEUE_POLL_S

    @property
    def connection_timeout(self) -> int:
        """The socket timeout RQ raises the client's pool to: where RQ's own dequeue timeout
        put it, as before (a shorter one would fail a slow command of the runs' client)."""
        return max(1, int(self.worker_ttl) - 15) + 10

    def subscribe(self) -> None:
        """RQ's subscription to its worker channel (its ``kill-horse`` and ``stop-job``
        commands), its thread looking ``PUBSUB_POLL_S`` at a time instead of RQ's 60 s:
        redis-py 8.2's ``PubSubWorkerThread.stop`` waits for the thread, so a stop (SIGTERM,
        the end of a burst) waited up to a minute for it."""
        self.log.info("Worker %s: subscribing to channel %s", self.name,
                      self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(
            sleep_time=PUBSUB_POLL_S, daemon=True,
            exception_handler=getattr(self, "_pubsub_exception_handler", None))

    def _install_signal_handlers(self) -> None:
        """RQ's handlers, then any stop that came before them: its loop ends at once."""
        super()._install_signal_handlers()
        if _early_stop.is_set():
            self._shutdown_requested_date = datetime.now(UTC)
            self._stop_requested = True

    def _refuse(self, job: Job, queue: Queue, execution: Any, stat: str, why: str) -> bool:
        log.error("%s", why)
        try:
            (_loop.redis if _loop else self.connection).hincrby(keys.STATS, stat, 1)
            self.handle_job_failure(job, queue=queue, exc_string=why, execution=execution)
        except Exception as exc:  # the job is unreadable even to RQ's bookkeeping: drop it
            log.warning("job %s could not be recorded as failed (%r); deleted", job.id, exc)
            with contextlib.suppress(Exception):
                self.connection.delete(job.key)
        return False


class _QuietReconnects(logging.Filter):
    """RQ logs each retry of its dequeue, and a traceback when Redis fails under it, while
    Redis is away; the worker's ``Outage`` says it once and RQ's loop is started again."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "could not connect to Redis" in str(record.msg):
            return False
        exc = record.exc_info[1] if record.exc_info else None
        while exc is not None:
            if isinstance(exc, redis.RedisError):
                return False
            exc = exc.__cause__ or exc.__context__
        return True


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def run_worker(settings: Settings, *, burst: bool = False, queue_name: str | None = None,
               hooks: Sequence[str] = (), concurrency: int | None = None,
               metrics_port: int | None = None, metrics_host: str = "127.0.0.1") -> int:
    global _loop, _pool
    # Until RQ's loop installs its handlers, a stop is kept (not the default: die holding
    # the runs the pool may already have taken).
    signal.signal(signal.SIGTERM, _stop_early)
    signal.signal(signal.SIGINT, _stop_early)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("rq.worker").addFilter(_QuietReconnects())
    # SIGUSR1 prints every thread's stack to the log: what an operator (or a test) asks
    # of a process that looks stuck, without stopping it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    chain = load_hooks(hooks)
    if metrics_port is not None:
        worker_metrics.listen(metrics_host, metrics_port)
        chain.hooks.append(worker_metrics.MetricsHook())
    client = connect(settings)
    registry.load(settings.worker.agents)
    if not registry.agents:
        log.warning("no agents registered: set DURABLE_AGENTS to the modules that define "
                    "them (every run this worker takes will be quarantined as unknown)")
    wid = worker_id()
    publish_agents(client, f"worker:{wid}")
    require_keys(registry.sensitive_names(), settings)
    # Too many stuck tool calls: shut down, then start afresh (a burst worker ends soon).
    # Given before the pool takes a run: a restart asked for from then on is not lost.
    _loop = StepLoop(settings, client, registry, wid, queue_name, hooks=chain,
                     on_restart=(lambda: None) if burst else
                     (lambda: os.kill(os.getpid(), signal.SIGTERM)))
    # A tool's ctx.emit publishes on its run's stream channel (Client.follow reads it).
    _loop.dispatcher.publisher = Publisher(client, settings.payloads.max_payload_bytes,
                                           settings.payloads.partial_keep_bytes, _loop.log.keys)
    _pool = pool = make_pool(_loop, concurrency or settings.worker.concurrency)
    if metrics_port is not None:
        worker_metrics.watch(_loop, pool)
    threading.Thread(target=_watchdog, args=(_loop,), name="watchdog", daemon=True).start()
    threading.Thread(target=pool.slots.poll, name="ready-poll", daemon=True).start()
    # Before the first run is taken: the reconciler releases the leases of a worker whose
    # liveness key expired (``durable.telemetry.liveness``). On a client of its own: the runs'
    # client, busy retrying calls to a failed cluster master, must not delay the beats.
    presence = Presence(connect(settings, check=False), wid, settings.leases.liveness_ttl_ms,
                        _loop.outage, serves=routes(registry))
    presence.start()
    listener = CancelListener(settings, connect(settings, check=False), _loop)
    listener.start()
    listener.ready.wait(5)
    queue = _loop.queue
    log.info("worker %s started: queue %r, %s, agents: %s, Redis %s", wid, queue.name,
             driver_line(_loop, pool), ", ".join(sorted(registry.agents)) or "none",
             safe_url(client_url(client)))
    tune_collector(settings.worker.gc_threshold)
    _serve(queue, queue.connection, wid, _loop, burst)
    if burst:
        pool.slots.finish()
        presence.leave()
        EVENT_LOOP.close_resources()
        return 0
    code = _shut_down(pool, settings.worker.shutdown_grace_s, presence)
    # Its runs ended or were handed back: what the tools kept on the process's event loop
    # (the model step's HTTP clients) is closed.
    EVENT_LOOP.close_resources()
    if _loop.restart_requested.is_set():
        _restart()
    return code


def publish_agents(client: redis.Redis, by: str) -> None:
    """Publish the agents to the catalog (``durable.catalog``), from which producers that
    do not import them start them by name. When Redis does not answer (it went away after
    the worker connected), a thread of its own publishes them once it does: the worker
    serves its agents from then on, and they would stay unlisted until another worker
    started. When Redis refuses it (an ACL without the catalog's key), trying again cannot
    help: the worker says so as an error, once, and serves on."""
    try:
        catalog.publish(client, registry.agents.values(), by)
        return
    except NoPermissionError as exc:
        _refused(exc)
        return
    except redis.RedisError as exc:
        log.warning("could not publish the agents to %s (%r): again once Redis answers",
                    keys.AGENTS, exc)
    threading.Thread(target=_publish_later, args=(client, by), name="catalog",
                     daemon=True).start()


def _refused(exc: NoPermissionError) -> None:
    log.error("Redis refused the catalog %s (%s): producers that start this worker's agents "
              "by name will not find them; the worker's user needs write access to that key",
              keys.AGENTS, exc)


def _publish_later(client: redis.Redis, by: str) -> None:
    """Retries with a backoff until the catalog is written, or Redis refuses it
    (``NoPermissionError``). Quietly: the threads that need Redis to serve (the beats, RQ's
    loop) say when it goes away and comes back."""
    backoff = Backoff()
    while True:
        backoff.wait()
        try:
            names = catalog.publish(client, registry.agents.values(), by)
        except NoPermissionError as exc:
            _refused(exc)
            return
        except redis.RedisError:
            continue
        log.info("published the agents to %s: %s", keys.AGENTS, ", ".join(names))
        return


def make_pool(loop: StepLoop, size: int) -> Driver:
    """The driver the settings name (``choose_driver``)."""
    driver, why = choose_driver(loop)
    if why and driver != loop.settings.worker.driver:
        log.warning("DURABLE_DRIVER=%s cannot run here: %s; the run threads drive instead",
                    loop.settings.worker.driver, why)
    return RunHub(loop, size) if driver == "hub" else RunPool(loop, size)


def choose_driver(loop: StepLoop) -> tuple[str, str]:
    """The driver of this worker, ``hub`` (``workers.hub``) or ``threads`` (one thread per
    held run, ``workers.pool``), and why, for the start line: the settings'
    ``DURABLE_DRIVER``. The hub runs on one server, on a Redis Cluster (a pipeline per
    master) and with ``DURABLE_MIN_REPLICAS`` (a ``WAIT`` per pipeline) alike; it needs the
    step loop's script calls batched (``EventLog.batch_appends``), and says so if not."""
    if loop.settings.worker.driver == "threads":
        return "threads", "DURABLE_DRIVER=threads"
    if loop.leases.batcher is None:
        return "threads", "the step loop's script calls are not batched"
    return "hub", ""


def driver_line(loop: StepLoop, pool: Driver) -> str:
    """``driver hub`` or ``driver threads (why)``, then where the log is, for the start
    line."""
    driver, why = choose_driver(loop)
    where = [f"{len(loop.redis.get_primaries())} cluster masters"
             if hasattr(loop.redis, "nodes_manager") else "one server"]
    if loop.settings.cluster.min_replicas:
        where.append(f"appends wait for {loop.settings.cluster.min_replicas} replicas")
    return f"driver {driver}" + (f" ({why})" if why else "") + \
        f", {pool.slots.size} run slots ({pool.model}), log on " + ", ".join(where)


def _restart() -> None:
    """Replace this process's image with a fresh worker: same pid, same command line and
    environment (a process manager sees nothing), none of the old threads -- stuck tool
    calls included."""
    log.warning("restarting in place (the runs were handed back)")
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, sys.orig_argv)


def _serve(queue: Queue, client: redis.Redis, wid: str, loop: StepLoop, burst: bool) -> None:
    """RQ's loop, again after any Redis fault: RQ ends its loop when Redis fails outside
    its dequeue (recording a job, a heartbeat). Returns on a signal or, in burst mode, when
    the queue is empty."""
    generation = 0
    backoff = Backoff()
    while True:
        if not loop.outage.down:
            backoff.reset()
        name = wid if not generation else f"{wid}.{generation}"
        worker: DurableWorker | None = None
        try:
            # RQ's constructor calls Redis too (CLIENT SETNAME, CLIENT INFO): after a fault
            # that ended RQ's loop, the next one may fail there as well.
            worker = DurableWorker([queue], connection=client, name=name,
                                   serializer=queue.serializer)
            worker.work(burst=burst, logging_level="WARNING")
        except redis.RedisError as exc:  # its teardown could not reach Redis either
            loop.outage.failed(exc)
        if burst or getattr(worker, "_shutdown_requested_date", None) is not None:
            return
        try:
            backoff.wait()
            loop.outage.wait_until_up(client, backoff=backoff)
        except StopRequested:  # a signal while waiting for Redis
            return
        generation += 1


def _watchdog(loop: StepLoop) -> None:
    """Abandons runs whose agent code overran ``DURABLE_DECIDE_TIMEOUT_MS``."""
    interval = min(1.0, loop.settings.worker.decide_timeout_ms / 4000)
    while True:
        time.sleep(interval)
        try:
            loop.check_overruns()
        except Exception:
            log.exception("watchdog")


def _shut_down(pool: Driver, grace_s: float, presence: Presence) -> int:
    """After RQ's loop ended on a signal: finish or hand back what is held, leave the
    workers' set, then exit."""
    force = threading.Event()

    def again(signum: int, frame: object) -> None:
        log.warning("second signal: handing runs back now")
        force.set()

    signal.signal(signal.SIGTERM, again)
    signal.signal(signal.SIGINT, again)
    if pool.slots.busy:
        log.info("shutting down: %d runs in flight, up to %.1f s to finish", pool.slots.busy,
                 grace_s)
    handed = pool.slots.shutdown(grace_s, force)
    presence.leave()
    if handed:
        log.warning("handed back %d runs: %s", len(handed), ", ".join(handed[:20]))
        logging.shutdown()
        # Their threads may still be inside a tool: nothing of theirs can be written now
        # (the leases are gone), so do not wait for them.
        if _loop is not None and _loop.restart_requested.is_set():
            _restart()
        os._exit(0)
    return 0


def tune_collector(threshold: int) -> None:
    """Python's cycle collector, set for a process that holds many runs.

    What start-up made (modules, agents, settings) lives as long as the process: it is
    frozen out of the collector's full passes, which would otherwise walk all of it again
    and again. And the collector runs once ``threshold`` more objects are alive than at its
    last pass (allocated and not freed yet) instead of 700
    (``DURABLE_GC_THRESHOLD``; 0 keeps the interpreter's): most of what a held run allocates
    lives for a step or two, so at 700 a pass finds thousands of objects alive that die
    soon after, and moves them to the older generations, whose passes walk everything held
    (a full pass took 150 ms at 5,000 held runs). Cycles are still collected, at most
    ``threshold`` objects later; what refcounting frees (nearly everything) is freed at once.
    """
    gc.freeze()
    if threshold > 0:
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(threshold, older, oldest)
