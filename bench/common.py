"""Shared helpers: statistics, servers, settings and the log timestamps of runs."""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from durable.agents import registry
from durable.log import events as ev
from durable.log import keys
from durable.settings import Settings
from durable.testing import Server, Worker

FSYNCS = ("everysec", "always")

#: Modules defining the agents and tools measured here (``count`` and its ``noop`` tool).
#: Nothing is registered by default: this process loads them in ``settings_for``, and the
#: worker processes get them through ``worker``.
AGENTS = "examples.agents"


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def percentile(xs: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = min(len(s), max(1, math.ceil(p / 100 * len(s))))
    return float(s[k - 1])


def event_type(event: ev.Event) -> str:
    """The event's type name, as the log writes it (its msgspec tag, a string for every type
    of the schema)."""
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str), tag
    return tag


def ms_of(entry_id: bytes | str) -> int:
    """Milliseconds part of a stream entry id (the server's clock at XADD)."""
    s = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(s.split("-", 1)[0])


def settings_for(url: str, **kw: Any) -> Settings:
    """Settings for ``url`` with the bench agents, also registered in this process."""
    kw.setdefault("agents", AGENTS)
    registry.load(kw["agents"])
    return Settings.from_env(redis_url=url, **kw)


def worker(url: str, **kw: Any) -> Worker:
    """A ``durable worker`` process serving the bench agents."""
    kw.setdefault("DURABLE_AGENTS", AGENTS)
    return Worker(url, **kw)


@dataclass
class Servers:
    """One embedded server per appendfsync policy, started once and shared by the items."""

    fsyncs: Sequence[str] = FSYNCS
    servers: dict[str, Server] = field(default_factory=dict)

    def get(self, fsync: str) -> Server:
        srv = self.servers.get(fsync)
        if srv is None:
            srv = Server(fsync=fsync).start()
            self.servers[fsync] = srv
        return srv

    def client(self, fsync: str) -> redis.Redis:
        return self.get(fsync).client()

    def stop(self) -> None:
        for srv in self.servers.values():
            srv.stop()
        self.servers.clear()


@contextlib.contextmanager
def servers(fsyncs: Sequence[str] = FSYNCS) -> Iterator[Servers]:
    s = Servers(fsyncs)
    try:
        yield s
    finally:
        s.stop()


def fresh(r: redis.Redis) -> None:
    """Empty the server and rewrite its AOF so each measurement starts from the same place."""
    r.flushall()
    with contextlib.suppress(redis.ResponseError):
        r.bgrewriteaof()
    # Wait for the rewrite: it competes for CPU and disk with what follows.
    for _ in range(500):
        info = r.info("persistence")
        if not info.get("aof_rewrite_in_progress") and not info.get("aof_rewrite_scheduled"):
            break
        time.sleep(0.01)


def run_window(r: redis.Redis, run_ids: Sequence[str],
               layout: keys.KeyLayout = keys.UNSHARDED) -> tuple[int, int, int]:
    """(first worker write ms, last write ms, runs completed) read from the runs' logs
    (of the key layout ``layout``).

    The first worker write is the second entry of a run's log (the first is the client's
    ``run_started``); the last write is the projection's ``last`` entry id.
    """
    pipe = r.pipeline(transaction=False)
    for rid in run_ids:
        pipe.xrange(layout.log(rid), "-", "+", count=2)
        pipe.hmget(layout.run(rid), "last", "state")
    out = pipe.execute()
    first, last, done = None, None, 0
    for i in range(0, len(out), 2):
        entries, (last_id, state) = out[i], out[i + 1]
        if len(entries) >= 2:
            t = ms_of(entries[1][0])
            first = t if first is None else min(first, t)
        if last_id:
            t = ms_of(last_id)
            last = t if last is None else max(last, t)
        if state == b"completed":
            done += 1
    return first or 0, last or 0, done


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))
