"""What-if measurements for suggested core changes, made in this process by swapping one
piece at a time (monkeypatching in the benchmark only; no core file changes).

- ``driver``: ``StepLoop.advance`` in-process on four-step no-op runs, baseline (the tool
  called on the run's thread under the ``CallWatch`` that enforces its deadline) against
  the bare call without the watcher: what the watcher costs. Interleaved rounds, medians.
  (A "no per-run heartbeat thread" variant is gone: the core now has one ``Heartbeats``
  thread per worker, and what a run still pays for it, ``hold``/``drop``, is about a
  microsecond per step, shown in the profile item's breakdown; below this item's noise.)
- ``load``: ``load.lua`` (XRANGE inside Lua) against HMGET + a direct XRANGE, and
  ``EventLog.load`` with and without its ``copy_state`` snapshot of the state before the
  last ``step_decided`` (``durable.log.recovery.copy_state``: the name the fold of
  ``EventLog.load`` calls).
- ``models``: the worker's two drivers on the same ``StepLoop`` code: the run threads
  (``RunPool``, ``DURABLE_DRIVER=threads``: one thread per held run, each blocking on its
  batched Redis calls) against the hub (``RunHub``, the default: one thread resumes every
  run's coroutine and sends their calls in pipelines). Both in this process on the
  ``everysec`` server, interleaved rounds of four-step no-op runs; steps/s and process
  CPU per step.
- ``memory``: bytes per step at several ``stream-node-max-bytes`` (the first listpack node
  of a stream is preallocated up to this size), and the step triplet's size without the
  per-event ``run`` and ``actor`` fields.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from bench.common import fresh, median, settings_for
from bench.throughput import start_runs
from durable.agents import registry
from durable.client import Client
from durable.log import keys, recovery
from durable.log.chain import split_last
from durable.log.store import EventLog
from durable.queue import enqueue_many
from durable.workers.calls import CallResult, CallWatch
from durable.workers.hub import RunHub
from durable.workers.loop import StepLoop
from durable.workers.pool import RunPool

#: Runs each model holds at once (the worker's default concurrency).
MODEL_CONCURRENCY = 64


@contextlib.contextmanager
def _patched(bare_call: bool) -> Iterator[None]:
    """Patch ``CallWatch.call`` on the class, so the loop's dispatcher calls the tool
    without registering it with the watcher."""
    saved_call = CallWatch.call
    if bare_call:
        def call(self: CallWatch, fn: Any, timeout: float, token: Any,
                 grace: float) -> CallResult:
            try:
                return CallResult("returned", fn())
            except BaseException as exc:
                return CallResult("raised", error=exc)
        CallWatch.call = call
    try:
        yield
    finally:
        CallWatch.call = saved_call


VARIANTS = {"baseline": False, "tool call without the watcher": True}


def driver_variants(servers: Any, blocks: int, block: int = 10) -> dict[str, Any]:
    """Fine-grained interleaving: every block of ``block`` runs is timed once per variant,
    in a rotated order, so background load hits every variant alike."""
    out: dict[str, Any] = {}
    variants = VARIANTS
    for fsync in servers.fsyncs:
        srv = servers.get(fsync)
        r = srv.client()
        fresh(r)
        settings = settings_for(srv.url)
        names = list(variants)
        ids = start_runs(Client(settings, r), "wi", blocks * block * len(names), enqueue=False)
        driver = StepLoop(settings, r, registry, "bench-whatif:1:000000")
        samples: dict[str, list[float]] = {v: [] for v in variants}
        pos = 0
        for b in range(blocks):
            order = names[b % len(names):] + names[:b % len(names)]
            for name in order:
                batch = ids[pos:pos + block]
                pos += block
                with _patched(variants[name]):
                    t0 = time.perf_counter()
                    for rid in batch:
                        driver.advance(rid)
                    dt = time.perf_counter() - t0
                samples[name].append(dt / (block * 4) * 1e6)  # us per step
        base = median(samples["baseline"])
        out[fsync] = {name: {"us_per_step": median(xs), "steps_per_s": 1e6 / median(xs),
                             "vs_baseline": base / median(xs),
                             "us_per_step_saved": base - median(xs)}
                      for name, xs in samples.items()}
        r.close()
    return out


def model_variants(servers: Any, runs: int, rounds: int) -> dict[str, Any]:
    """The run threads (``RunPool``) against the hub (``RunHub``), on the same code (see
    the module doc); rounds interleaved, medians."""
    srv = servers.get("everysec")
    r = srv.client()
    fresh(r)
    settings = settings_for(srv.url)
    client = Client(settings, r)
    pooled = StepLoop(settings, r, registry, "bench-whatif-pool:1:000000")
    hubbed = StepLoop(settings, r, registry, "bench-whatif-hub:1:000000")
    drivers = {"run threads": RunPool(pooled, MODEL_CONCURRENCY),
               "hub (the worker)": RunHub(hubbed, MODEL_CONCURRENCY)}

    def drive(driver: RunPool | RunHub) -> Any:
        def run(ids: list[str]) -> None:
            enqueue_many(r, driver.loop.log.keys, driver.loop.queue, ids)
            driver.slots.finish()
        return run

    models = {name: drive(driver) for name, driver in drivers.items()}
    samples: dict[str, list[tuple[float, float]]] = {m: [] for m in models}
    for rnd in range(rounds):
        names = list(models)
        for name in names[rnd % 2:] + names[:rnd % 2]:
            ids = [f"wm{rnd}-{len(samples[name])}-{name[:3]}-{i}" for i in range(runs)]
            client.start_many("count", [{"steps": 4}] * runs, run_ids=ids, enqueue=False)
            c0, t0 = time.process_time(), time.perf_counter()
            models[name](ids)
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            pipe = r.pipeline(transaction=False)
            for rid in ids:
                pipe.hget(keys.UNSHARDED.run(rid), "state")
            done = sum(state == b"completed" for state in pipe.execute())
            assert done == runs, f"{name}: {done} of {runs} runs completed"
            samples[name].append((runs * 4 / dt, cpu / (runs * 4) * 1e6))
    for driver in drivers.values():
        driver.slots.shutdown(0)
    r.close()
    out = {name: {"steps_per_s": median([s for s, _ in xs]),
                  "cpu_us_per_step": median([c for _, c in xs])}
           for name, xs in samples.items()}
    base = out["run threads"]["steps_per_s"]
    for row in out.values():
        row["vs_threads"] = row["steps_per_s"] / base
    return out


def load_variants(servers: Any, sizes: tuple[int, ...], reps: int) -> dict[str, Any]:
    from bench.recovery import build

    srv = servers.get("everysec")
    r = srv.client()
    fresh(r)
    elog = EventLog(r)
    fns: dict[str, dict[str, Any]] = {}
    for size in sizes:
        rid = f"wl{size}"
        build(elog, rid, size)
        load_lua = r.register_script((Path(__file__).parent / "load.lua").read_text())

        def direct(rid: str = rid) -> None:
            _version, ckpt, last = r.hmget(keys.UNSHARDED.run(rid), "version", "ckpt", "last")
            r.xrange(keys.UNSHARDED.log(rid), ckpt or "-", split_last(last)[0])

        def script(rid: str = rid, load_lua: Any = load_lua) -> None:
            load_lua(keys=[keys.UNSHARDED.log(rid), keys.UNSHARDED.run(rid)])

        def load(rid: str = rid) -> None:
            elog.load(rid)

        def load_nocopy(rid: str = rid) -> None:
            # recovery.py imports copy_state by name: patch the name its fold (which
            # EventLog.load runs) calls, in the module's namespace.
            names = vars(recovery)
            saved = names["copy_state"]
            names["copy_state"] = lambda s: s
            try:
                elog.load(rid)
            finally:
                names["copy_state"] = saved

        fns[str(size)] = {"load.lua ms": script, "HMGET + XRANGE(ckpt..last) ms": direct,
                          "EventLog.load ms": load,
                          "EventLog.load without the pre-intent copy_state ms": load_nocopy}
    xs: dict[str, dict[str, list[float]]] = {s: {k: [] for k in f} for s, f in fns.items()}
    for _ in range(reps):  # interleaved
        for label, f in fns.items():
            for name, fn in f.items():
                t = time.perf_counter()
                fn()
                xs[label][name].append((time.perf_counter() - t) * 1000)
    r.close()
    return {size: {name: median(v) for name, v in row.items()} for size, row in xs.items()}


def memory_variants(servers: Any, long_steps: int) -> dict[str, Any]:
    srv = servers.get("everysec")
    r = srv.client()
    settings = settings_for(srv.url)
    default = r.config_get("stream-node-max-bytes")["stream-node-max-bytes"]
    out: dict[str, Any] = {"stream-node-max-bytes": {}}
    try:
        for nbytes in ("4096", "1024", "512"):
            fresh(r)
            r.config_set("stream-node-max-bytes", nbytes)
            client = Client(settings, r)
            driver = StepLoop(settings, r, registry, "bench-whatif:1:000000")
            row = {}
            for steps in (4, long_steps):
                rid = f"wm{steps}"
                client.start("count", {"steps": steps}, run_id=rid, enqueue=False)
                while driver.advance(rid).get("more"):
                    pass
                total = sum(int(r.memory_usage(k, samples=0) or 0) for k in
                            (keys.UNSHARDED.log(rid), keys.UNSHARDED.run(rid),
                             keys.UNSHARDED.ledger(rid)))
                row[f"{steps}-step B/step"] = total / steps
            out["stream-node-max-bytes"][nbytes] = row
    finally:
        r.config_set("stream-node-max-bytes", default)
        r.close()
    # The step triplet with and without the per-event run id and actor.
    enc = msgspec.msgpack.Encoder()
    from bench.codec import STEP_MIX, sample_events

    events = sample_events()
    full = sum(len(enc.encode(events[t])) for t in STEP_MIX)
    slim = sum(len(enc.encode(msgspec.structs.replace(events[t], run="", actor="")))
               for t in STEP_MIX)
    no_dispatch = sum(len(enc.encode(events[t])) for t in ("step_decided", "action_succeeded"))
    out["step triplet bytes"] = {"as written": full, "without run and actor": slim,
                                 "decided+succeeded only (dispatch merged into intent)":
                                 no_dispatch + 8}
    return out


def run(servers: Any, quick: bool = False, log: Any = print) -> dict[str, Any]:
    out = {"driver": driver_variants(servers, 3 if quick else 24, block=8)}
    log("  whatif: driver variants done")
    out["models"] = model_variants(servers, 100 if quick else 1000, 1 if quick else 4)
    log("  whatif: driver models done")
    out["load"] = load_variants(servers, (100, 10_000), 5 if quick else 30)
    log("  whatif: load variants done")
    out["memory"] = memory_variants(servers, 200 if quick else 1000)
    return out
