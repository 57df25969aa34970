"""Profile: where a worker's time goes on no-op tools.

Two views, both in this process (no core change):

1. ``breakdown``: the real ``DurableWorker`` (RQ ``SimpleWorker`` subclass) driving K
   pre-enqueued 4-step runs, with light wrappers that account *exclusive* wall time to
   named parts of the hot path (Redis round trips, heartbeat hold/drop, tool call watcher,
   load, stage/commit, checks) and count Redis round trips. What is not wrapped is the
   residual of the enclosing part.
2. ``cprofile``: ``StepLoop.advance`` under cProfile (top functions by own time), written to
   ``bench/results/profile.txt``.
"""

from __future__ import annotations

import cProfile
import functools
import io
import pstats
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import msgspec
import redis
from rq.worker import BaseWorker

from bench.common import fresh, settings_for
from bench.throughput import start_runs
from durable import leases
from durable.agents import registry
from durable.client import Client
from durable.log import batching
from durable.log import store as eventlog
from durable.queue import make_queue
from durable.workers import admission, calls, decisions
from durable.workers import runtime as wr
from durable.workers.loop import StepLoop
from durable.workers.pool import RunPool


class Accounting:
    """Exclusive wall time per label (a tiny instrumenting profiler), in the threads that
    run RQ's loop (this one) or drive a run (a run slot's, while in ``advance``); the
    worker's other threads (heartbeats, watchers) are not counted."""

    def __init__(self) -> None:
        self.main = threading.get_ident()
        self._local = threading.local()
        self._lock = threading.Lock()
        self.excl: defaultdict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()
        self.restore: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, attr: str, label: Any) -> None:
        """``label``: a name, or a function returning the name at call time."""
        if not hasattr(owner, attr):  # the core moved on: update PARTS, don't measure nothing
            raise AttributeError(f"profile part {getattr(owner, '__name__', owner)}.{attr} "
                                 "no longer exists")
        orig = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        acct = self

        @functools.wraps(orig)
        def wrapper(*a: Any, **k: Any) -> Any:
            if threading.get_ident() != acct.main and not _driving():
                return orig(*a, **k)
            stack = acct.stack()
            name = label() if callable(label) else label
            stack.append(0.0)
            t = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                dt = time.perf_counter() - t
                child = stack.pop()
                with acct._lock:
                    acct.excl[name] += dt - child
                    acct.calls[name] += 1
                if stack:
                    stack[-1] += dt

        setattr(owner, attr, wrapper)
        self.restore.append((owner, attr, orig))

    def stack(self) -> list[float]:
        """This thread's stack of child time per open wrapped call."""
        stack: list[float] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def undo(self) -> None:
        for owner, attr, orig in reversed(self.restore):
            setattr(owner, attr, orig)
        self.restore.clear()


_phase = threading.local()


def _driving() -> bool:
    """Whether this thread is driving a run (inside ``StepLoop.advance``)."""
    return bool(getattr(_phase, "driver", False))


def _redis_label() -> str:
    return "Redis round trips: driver" if _driving() else "Redis round trips: RQ"


PARTS = [
    # (owner, attribute, label); time goes to the innermost wrapped call.
    (BaseWorker, "work", "RQ worker machinery, excl. Redis"),
    (StepLoop, "advance", "driver: other (advance/_drive/_step/_decide bodies)"),
    (redis.Redis, "execute_command", _redis_label),
    (redis.client.Pipeline, "execute", _redis_label),
    # A run thread's appends and lease acquisitions go out in the batcher's pipelines: the
    # run waits for its reply here (the batcher's own thread is not counted).
    (batching.ScriptBatcher, "call", "Redis round trips: driver"),
    # One Heartbeats thread per worker renews every held lease; a run only registers with it.
    (leases.Heartbeats, "hold", "driver: heartbeat hold/drop"),
    (leases.Heartbeats, "drop", "driver: heartbeat hold/drop"),
    (eventlog.EventLog, "handle_from", "driver: load (decode + fold, excl. Redis)"),
    (calls.CallWatch, "call", "driver: tool call under the watcher (no-op tool)"),
    (eventlog.EventLog, "load", "driver: load (decode + fold, excl. Redis)"),
    (eventlog.EventLog, "commit", "driver: commit (args, due, checkpoint check)"),
    (eventlog.EventLog, "stage", "driver: stage (stamp + encode + apply)"),
    (decisions, "plain", "driver: plain (JSON round trip of args/results)"),
    (msgspec.msgpack, "encode", "driver: args size check (msgpack encode)"),
    (admission, "check_replay", "driver: check_replay"),
    # Not wrapped: copy_state (the pre-intent snapshot in load). Each run here is loaded
    # once, before its first step, so there is no intent to snapshot; whatif's load item
    # measures it on long logs.
]


# durable.workers is the repository's workers/ folder, installed under durable/ (the
# package-dir of pyproject.toml): mypy does not follow that mapping, so its classes are Any.
class _InlinePool(RunPool):  # type: ignore[misc]
    """Drives the ready runs on the calling thread (RQ's), one at a time, so one thread's
    exclusive-time accounting sees the whole step protocol (the core's pool hands them to
    its run threads, which would overlap with RQ's loop in wall time)."""

    def _hand(self, run_id: str) -> None:
        self.slot(run_id)  # drives it, then each next ready run, on this thread


def breakdown(url: str, r: redis.Redis, runs: int) -> dict[str, Any]:
    settings = settings_for(url)
    client = Client(settings, r)
    start_runs(client, "pf", runs)
    wr._loop = StepLoop(settings, r, registry, "bench-profile:1:000000")
    # One slot, on RQ's thread: runs are driven one at a time, as the exclusive-time
    # accounting expects.
    wr._pool = _InlinePool(wr._loop, 1)
    queue = make_queue(r, settings.worker.queue)
    worker = wr.DurableWorker([queue], connection=r, name="bench-profile",
                              serializer=queue.serializer)
    acct = Accounting()
    for owner, attr, label in PARTS:
        acct.wrap(owner, attr, label)
    adv = StepLoop.advance

    def advance(self: StepLoop, run_id: str, *more: Any) -> Any:
        _phase.driver = True
        try:
            return adv(self, run_id, *more)
        finally:
            _phase.driver = False

    StepLoop.advance = advance
    t0 = time.perf_counter()
    try:
        worker.work(burst=True, logging_level="WARNING")
        wr._pool.slots.finish()
    finally:
        total = time.perf_counter() - t0
        StepLoop.advance = adv
        acct.undo()
        wr._loop = wr._pool = None
    per_run_us = {k: v / runs * 1e6 for k, v in sorted(acct.excl.items(), key=lambda kv: -kv[1])}
    return {"runs": runs, "steps_per_run": 4, "total_ms_per_run": total / runs * 1000,
            "us_per_run": per_run_us,
            "round_trips_per_run": {k.split(": ")[1]: acct.calls[k] / runs
                                    for k in acct.calls if k.startswith("Redis")},
            "calls_per_run": {k: v / runs for k, v in acct.calls.items()},
            # Wrapped but never called on the main thread: the core stopped going through it.
            "not_called": sorted({lbl for _o, _a, lbl in PARTS
                                  if isinstance(lbl, str) and not acct.calls[lbl]})}


def cprofile(url: str, r: redis.Redis, runs: int, path: Path) -> dict[str, Any]:
    settings = settings_for(url)
    client = Client(settings, r)
    ids = start_runs(client, "cp", runs, enqueue=False)
    driver = StepLoop(settings, r, registry, "bench-cprofile:1:000000")
    for rid in ids[:10]:
        driver.advance(rid)
    prof = cProfile.Profile()
    prof.enable()
    for rid in ids[10:]:
        driver.advance(rid)
    prof.disable()
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(50)
    path.write_text(f"cProfile of StepLoop.advance on {runs - 10} four-step no-op runs\n\n"
                    + buf.getvalue())
    return {"file": path.name, "runs": runs - 10}


def run(servers: Any, quick: bool = False, out_dir: Path | None = None,
        log: Any = print) -> dict[str, Any]:
    runs = 60 if quick else 150
    out: dict[str, Any] = {}
    for fsync in servers.fsyncs:
        srv = servers.get(fsync)
        r = srv.client()
        fresh(r)
        out[fsync] = breakdown(srv.url, r, runs)
        log(f"  profile {fsync}: {out[fsync]['total_ms_per_run']:.2f} ms per 4-step run")
        if out[fsync]["not_called"]:
            log(f"  profile {fsync}: parts never called: {', '.join(out[fsync]['not_called'])}")
        r.close()
    if out_dir is not None:
        srv = servers.get(servers.fsyncs[0])
        r = srv.client()
        fresh(r)
        out["cprofile"] = cprofile(srv.url, r, runs, out_dir / "profile.txt")
        r.close()
    return out
