"""The real processes a scenario runs against, and the handle a scenario works through.

:class:`Stack` is a Redis server (the embedded one in a temporary directory, or any URL)
and the world (in its non-deduplicating mode by default: only the system's ledger and
lookups stand between a retry and a duplicate). :class:`Scene` is one scenario's share of
it: its own RQ queue, its own worker processes, its own recovery, and a client; closing
it stops every process it started.
"""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable.backend.cluster import LocalCluster
from durable.client import Client
from durable.log.state import RunState
from durable.settings import Settings
from durable.testing import AdminKey, Server, Worker, wait_for
from examples.scenarios.recovery import Recovery
from examples.world import WorldClient, WorldProcess

#: Lease TTL the scenarios run with: short, so that a dead worker's runs come back fast.
LEASE_TTL_MS = 1000

#: The input the scenarios start ``pipeline`` with (``Scene.start``'s default).
INPUT = {"source": "orders", "recipient": "ops@example.com", "threshold": 250.0}


@dataclass
class Stack:
    redis_url: str
    world: WorldProcess
    workdir: Path
    #: Set when the log is on a Redis Cluster: the plain server RQ uses.
    queue_url: str | None = None
    #: The approver registry's admin for this stack (``DURABLE_ADMIN_KEYS`` of every
    #: process the scenes start): scenes register approvers signed with it.
    admin: AdminKey = field(default_factory=AdminKey.make)

    @classmethod
    @contextlib.contextmanager
    def up(cls, redis_url: str | None = None, *, dedupe: bool = False, fsync: str = "always",
           workdir: Path | None = None, cluster: bool = False) -> Iterator[Stack]:
        """Start what is missing (Redis, the world); stop it all on exit. ``cluster``: the
        log on a local 3-master Redis Cluster, RQ on a plain server."""
        with contextlib.ExitStack() as stack:
            if workdir is None:
                workdir = Path(stack.enter_context(
                    tempfile.TemporaryDirectory(prefix="durable-scenarios-")))
            queue_url = None
            if cluster:
                nodes = LocalCluster(3, 0, data_dir=workdir / "cluster", fsync=fsync)
                stack.callback(nodes.stop)
                redis_url = nodes.start().url
                queue = Server(fsync=fsync, data_dir=workdir / "queue")
                stack.callback(queue.stop)
                queue_url = queue.start().url
            if redis_url is None:
                server = Server(fsync=fsync, data_dir=workdir / "redis")
                stack.callback(server.stop)
                redis_url = server.start().url
            world = WorldProcess(dedupe=dedupe, data_dir=workdir / "world",
                                 log_path=workdir / "world.log")
            stack.callback(world.stop)
            world.start()
            yield cls(redis_url, world, workdir, queue_url)

    @contextlib.contextmanager
    def scene(self, name: str) -> Iterator[Scene]:
        scene = Scene(self, name)
        try:
            yield scene
        finally:
            scene.close()


@dataclass
class Scene:
    stack: Stack
    name: str
    queue: str = ""
    workers: list[Worker] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.queue = f"scenario-{self.name}-{uuid.uuid4().hex[:6]}"
        self.settings = Settings.from_env(redis_url=self.stack.redis_url, queue=self.queue,
                                          lease_ttl_ms=LEASE_TTL_MS,
                                          agents="examples.agents",
                                          redis_cluster=self.stack.queue_url is not None,
                                          queue_url=self.stack.queue_url,
                                          admin_keys=self.stack.admin.public)
        self.client = Client(self.settings)
        self.world: WorldClient = self.stack.world.client
        self.world.reset_faults()

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of this scene's child processes."""
        cluster = {"DURABLE_REDIS_CLUSTER": "1", "DURABLE_QUEUE_URL": self.stack.queue_url} \
            if self.stack.queue_url else {}
        return {"DURABLE_QUEUE": self.queue, "DURABLE_LEASE_TTL_MS": str(LEASE_TTL_MS),
                "DURABLE_AGENTS": "examples.agents", **cluster,
                "DURABLE_ADMIN_KEYS": self.stack.admin.public,
                **self.stack.world.env(), **extra}

    def log_path(self, what: str) -> Path:
        return self.stack.workdir / f"{self.name}-{what}.log"

    def worker(self, *, burst: bool = False, kill_at: str | None = None, **env: str) -> Worker:
        n = len(self.workers) + 1
        w = Worker(self.stack.redis_url, burst=burst, queue=self.queue, kill_at=kill_at,
                   log_path=self.log_path(f"worker{n}"), env=self.env(**env))
        self.workers.append(w)
        return w

    def recovery(self, **env: str) -> Recovery:
        rec = Recovery(self.stack.redis_url, self.env(**env),
                       log_path=self.log_path("reconciler"))
        self.recoveries.append(rec.start())
        return rec

    def start(self, data: dict[str, Any] | None = None, *, agent: str = "pipeline") -> str:
        run_id = f"{self.name}-{uuid.uuid4().hex[:8]}"
        self.client.start(agent, data if data is not None else INPUT, run_id=run_id)
        return run_id

    def wait(self, run_id: str, timeout: float = 30.0) -> RunState:
        """Until the run is terminal, waiting or quarantined."""
        return self.client.wait(run_id, timeout)

    def wait_for(self, what: str, predicate: Callable[[], object], timeout: float = 15.0) -> None:
        if not wait_for(predicate, timeout, 0.02):
            raise TimeoutError(f"{self.name}: no {what} within {timeout}s")

    def stop_processes(self) -> None:
        """Stop this scene's workers and recovery (stopped ones stay in the lists)."""
        for rec in self.recoveries:
            rec.stop()
        for w in self.workers:
            w.stop()

    def close(self) -> None:
        self.stop_processes()
        self.client.close()
        self.client.redis.close()
