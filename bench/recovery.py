"""Item 4: recovery time against log length.

Runs whose logs hold ~100, ~10k and ~100k events are written directly with
``EventLog.commit`` (whole steps per commit: ``step_decided``, ``action_dispatched``,
``action_succeeded``; ``commit`` adds a checkpoint every ``checkpoint_every`` events when no
action is open). Then ``EventLog.load`` (what a worker does to recover: the projection and
the log from the last checkpoint, one script call, then the fold) is timed, interleaved
across sizes, and compared with a full refold (``EventLog.read`` + ``fold``).
"""

from __future__ import annotations

import time
from typing import Any

import redis

from bench.common import fresh, median
from durable.log import events as ev
from durable.log import keys
from durable.log.fold import fold
from durable.log.state import RunState
from durable.log.store import EventLog, RunHandle, Spec, now_ms

STEPS_PER_COMMIT = 4


def build(elog: EventLog, run_id: str, n_events: int) -> int:
    handle = RunHandle(run_id, RunState(), actor="client")
    elog.commit(handle, [Spec(ev.RunStarted, {"agent": "count", "agent_version": "1",
                                              "input": {"steps": n_events, "sleep_s": 0.0},
                                              "tools": ["noop"]})],
                extra={"agent": "count", "created": str(now_ms())})
    handle.actor = "bench-builder:1:000000"
    step = 0
    while handle.state.version + 3 <= n_events:
        specs = []
        room = (n_events - handle.state.version) // 3
        for _ in range(min(STEPS_PER_COMMIT, room)):
            step += 1
            key = f"{run_id}:{step}"
            specs += [
                Spec(ev.StepDecided, {"step": step, "tool": "noop",
                                      "args": {"n": step, "sleep_s": 0.0}, "key": key}),
                Spec(ev.ActionDispatched, {"step": step, "key": key,
                                           "deadline": now_ms() + 10_000}),
                Spec(ev.ActionSucceeded, {"step": step, "key": key, "result": {"n": step}}),
            ]
        elog.commit(handle, specs)
    return handle.state.version


def tail_len(elog: EventLog, run_id: str) -> int:
    ckpt = elog.redis.hget(elog.keys.run(run_id), "ckpt")
    return len(elog.redis.xrange(elog.keys.log(run_id), ckpt or "-", "+"))


def run(servers: Any, quick: bool = False, log: Any = print) -> dict[str, Any]:
    sizes = (100, 1_000, 10_000) if quick else (100, 10_000, 100_000)
    srv = servers.get("everysec")
    r: redis.Redis = srv.client()
    fresh(r)
    elog = EventLog(r)
    info: dict[int, dict[str, Any]] = {}
    for size in sizes:
        t0 = time.perf_counter()
        version = build(elog, f"rec{size}", size)
        info[size] = {"events": r.xlen(keys.UNSHARDED.log(f"rec{size}")), "version": version,
                      "folded_on_load": tail_len(elog, f"rec{size}"),
                      "build_s": time.perf_counter() - t0}
        log(f"  recovery: built {info[size]['events']} events in {info[size]['build_s']:.1f}s")
    load_t: dict[int, list[float]] = {s: [] for s in sizes}
    refold_t: dict[int, list[float]] = {s: [] for s in sizes}
    reps = 10 if quick else 40
    for rep in range(reps):
        for size in sizes:
            rid = f"rec{size}"
            t0 = time.perf_counter()
            handle = elog.load(rid)
            load_t[size].append((time.perf_counter() - t0) * 1000)
            assert handle.state.version == info[size]["version"]
            if rep < (3 if size >= 100_000 else 5 if size >= 10_000 else 10):
                t0 = time.perf_counter()
                # Entry.event is None only for an entry that does not decode; this log is
                # the bench's own (no check inside the timed fold).
                state = fold(e.event for e in elog.read(rid))  # type: ignore[misc]
                refold_t[size].append((time.perf_counter() - t0) * 1000)
                assert state.version == handle.state.version
    r.close()
    rows = {}
    small = median(load_t[sizes[0]])
    for size in sizes:
        rows[str(size)] = {**info[size], "load_ms": median(load_t[size]),
                           "load_ms_all": [round(x, 3) for x in load_t[size]],
                           "refold_ms": median(refold_t[size]),
                           "load_vs_smallest": median(load_t[size]) / small}
    return {"sizes": [str(s) for s in sizes], "rows": rows, "repeats": reps,
            "checkpoint_every": elog.checkpoint_every, "steps_per_commit": STEPS_PER_COMMIT}
