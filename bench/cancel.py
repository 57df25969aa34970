"""Item 3: cancellation latency of runs blocked in the cancellable ``noop`` tool.

A real worker process holds each run (``count`` with ``sleep_s`` = 30, so step 1 blocks in
``noop``). Once the log shows step 1 dispatched, ``Client.cancel`` is called and the
benchmark waits (XREAD BLOCK on the run's log) for the ``canceled`` event. Reported:

- ``event latency_ms``: what the ``canceled`` event records (request -> canceled, ms,
  stamped by the worker; the same number is in ``dx:cancel_latency_ms``);
- ``client wall``: from just before ``Client.cancel`` to the client seeing ``canceled``;
- ``cancel() call``: how long ``Client.cancel`` itself takes (durable request + publish).
"""

from __future__ import annotations

import time
from typing import Any, TypeVar

import redis

from bench.common import event_type, fresh, median, percentile, settings_for, worker
from durable.client import Client
from durable.log import events as ev
from durable.log import keys

E = TypeVar("E", bound=ev.Event)


def _wait_for(r: redis.Redis, run_id: str, cls: type[E], last: bytes,
              timeout_s: float = 20.0) -> tuple[E, bytes]:
    """Block on the run's log until an event of type ``cls`` appears after ``last``."""
    end = time.monotonic() + timeout_s
    stream = keys.UNSHARDED.log(run_id)
    while time.monotonic() < end:
        reply = r.xread({stream: last}, block=1000)
        for _name, entries in reply or []:
            for eid, fields in entries:
                last = eid
                event = ev.decode(fields[b"e"])
                if isinstance(event, cls):
                    return event, last
    raise TimeoutError(f"{run_id}: no {cls.__name__} within {timeout_s}s")


PHASES = ("phase: request -> cancel_requested in log",
          "phase: cancel_requested -> call_canceled (hint, tool stop, commit)",
          "phase: call_canceled -> canceled")


def _phases(r: redis.Redis, run_ids: list[str]) -> dict[str, list[float]]:
    """Per run, from the log: the client's request time and the server times (entry ids,
    ms) of ``cancel_requested``, ``call_canceled`` and ``canceled``."""
    out: dict[str, list[float]] = {k: [] for k in PHASES}
    for rid in run_ids:
        at: dict[str, float] = {}
        requested = 0
        for eid, fields in r.xrange(keys.UNSHARDED.log(rid)):
            event = ev.decode(fields[b"e"])
            at.setdefault(event_type(event), float(eid.split(b"-")[0]))
            if isinstance(event, ev.CancelRequested):
                requested = event.requested_ts
        if {"cancel_requested", "call_canceled", "canceled"} <= set(at) and requested:
            out[PHASES[0]].append(at["cancel_requested"] - requested)
            out[PHASES[1]].append(at["call_canceled"] - at["cancel_requested"])
            out[PHASES[2]].append(at["canceled"] - at["call_canceled"])
    return out


def run(servers: Any, quick: bool = False, n: int | None = None,
        log: Any = print) -> dict[str, Any]:
    n = n or (30 if quick else 200)
    fsyncs = list(servers.fsyncs)
    ctx: dict[str, dict[str, Any]] = {}
    for fsync in fsyncs:
        srv = servers.get(fsync)
        r = srv.client()
        fresh(r)
        ctx[fsync] = {"r": r, "client": Client(settings_for(srv.url), r),
                      "worker": worker(srv.url), "samples": {"event": [], "wall": [], "call": []}}
    try:
        for i in range(n):  # interleaved: one cancel on each server in turn
            for fsync in fsyncs:
                c = ctx[fsync]
                r, client = c["r"], c["client"]
                rid = f"c{i}"
                client.start("count", {"steps": 4, "sleep_s": 30}, run_id=rid)
                _, last = _wait_for(r, rid, ev.ActionDispatched, b"0-0", 30.0)
                t0 = time.perf_counter()
                client.cancel(rid, reason="bench")
                t1 = time.perf_counter()
                canceled, _ = _wait_for(r, rid, ev.Canceled, last, 10.0)
                t2 = time.perf_counter()
                c["samples"]["event"].append(float(canceled.latency_ms))
                c["samples"]["wall"].append((t2 - t0) * 1000)
                c["samples"]["call"].append((t1 - t0) * 1000)
            if (i + 1) % 50 == 0:
                log(f"  cancel {i + 1}/{n}")
        out: dict[str, Any] = {"cancels_per_fsync": n}
        for fsync in fsyncs:
            c = ctx[fsync]
            c["samples"].update(_phases(c["r"], [f"c{i}" for i in range(n)]))
            stored = {k.decode(): float(v) for k, v in
                      c["r"].hgetall(keys.CANCEL_LATENCY).items()}
            row = {}
            for name, xs in (("event latency_ms", c["samples"]["event"]),
                             ("dx:cancel_latency_ms", list(stored.values())),
                             ("client wall ms", c["samples"]["wall"]),
                             ("cancel() call ms", c["samples"]["call"]),
                             *[(k, c["samples"][k]) for k in PHASES]):
                row[name] = {"n": len(xs), "p50": percentile(xs, 50), "p99": percentile(xs, 99),
                             "max": max(xs) if xs else float("nan"), "median": median(xs)}
            out[fsync] = row
        return out
    finally:
        for c in ctx.values():
            c["worker"].stop()
            c["r"].close()
