"""The CPU floor of ``bench.styles``' run: the least CPU a run can cost, measured in the
same ``python -m bench`` as the rows it is the floor of.

- ``nondurable``: the program without durability: ``runs`` ``asyncio`` coroutines of
  ``STEPS`` sleeps of ``SLEEP_S`` each, gathered in this process; its CPU time per run.
- ``recorded``: the same run's events recorded in Redis and nothing else: for each run the
  12 events a durable run of the style rows writes (``run_started``, ``lease_acquired``,
  per step ``step_decided``, ``action_dispatched``, ``action_succeeded``, ``completed``),
  each encoded by the log's codec and appended by one Lua transition
  (``bench/transition.lua``: version check, ``XADD``, the projection, the ledger key of a
  step's claim and outcome), the runs' transitions pipelined from one client
  (``PIPELINE`` calls per round trip), against the ``appendfsync everysec`` server. Its CPU
  per run: this process's (encoding, sending, reading the replies) and Redis's
  (``INFO cpu``, user + system).

The floor of a row is the two together: what a team would pay for the program and its
events' record had durability no overhead of its own. ``ratio`` divides a row's CPU per run
(workers + Redis) by it.

- ``on_threads``: beside the floor, not part of it: the same program with its sleeps on
  threads, as a style whose user code is plain functions runs it (sync code agents,
  ``decide()`` with a plain tool): each run on a thread of its own, ``held`` at once (a
  worker's slots), calling ``STEPS`` times a function that sleeps ``SLEEP_S``
  (``Event.wait``), no Redis. What it costs over the ``asyncio`` program is what those
  styles pay for their threads alone, durable or not.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from bench.common import fresh, median
from bench.sampling import redis_cpu_s
from durable.log import events as ev
from durable.log import keys

STEPS = 3
SLEEP_S = 0.5
#: Script calls per pipeline (one round trip).
PIPELINE = 1000
TRANSITION_LUA = (Path(__file__).parent / "transition.lua").read_text()
ACTOR = "bench-floor:1:000000"


async def _gather(runs: int, steps: int, sleep_s: float) -> None:
    async def one() -> None:
        for _ in range(steps):
            await asyncio.sleep(sleep_s)

    await asyncio.gather(*(one() for _ in range(runs)))


def nondurable(runs: int, steps: int = STEPS, sleep_s: float = SLEEP_S) -> dict[str, float]:
    """The program alone: CPU microseconds per run and the wall."""
    c0, t0 = time.process_time(), time.perf_counter()
    asyncio.run(_gather(runs, steps, sleep_s))
    c1, t1 = time.process_time(), time.perf_counter()
    return {"cpu_per_run_us": 1e6 * (c1 - c0) / runs, "wall_s": t1 - t0}


def on_threads(runs: int, held: int, steps: int = STEPS,
               sleep_s: float = SLEEP_S) -> dict[str, float]:
    """The program on threads (see the module doc): CPU microseconds per run and the wall."""
    slots = threading.BoundedSemaphore(held)

    def one() -> None:
        try:
            asleep = threading.Event()
            for _ in range(steps):
                asleep.wait(sleep_s)
        finally:
            slots.release()

    threads = []
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(runs):
        slots.acquire()
        threads.append(threading.Thread(target=one, daemon=True))
        threads[-1].start()
    for thread in threads:
        thread.join()
    c1, t1 = time.process_time(), time.perf_counter()
    return {"cpu_per_run_us": 1e6 * (c1 - c0) / runs, "wall_s": t1 - t0}


def _events(rid: str, ts: int, steps: int, sleep_s: float) -> list[tuple[ev.Event, str, str]]:
    """A run's events as the style rows write them: (event, state after it, ledger key)."""
    seq = iter(range(1, 4 * steps + 10))
    out: list[tuple[ev.Event, str, str]] = [
        (ev.RunStarted(v=4, run=rid, seq=next(seq), ts=ts, actor="client", agent="count",
                       input={"steps": steps, "sleep_s": sleep_s}, tools=["noop"]),
         "pending", ""),
        (ev.LeaseAcquired(v=4, run=rid, seq=next(seq), ts=ts, actor=ACTOR, owner=ACTOR,
                          epoch=1), "running", "")]
    for step in range(1, steps + 1):
        key = f"{rid}:{step}"
        out += [
            (ev.StepDecided(v=4, run=rid, seq=next(seq), ts=ts, actor=ACTOR, step=step,
                            tool="noop", args={"n": step, "sleep_s": sleep_s}, key=key),
             "running", ""),
            (ev.ActionDispatched(v=4, run=rid, seq=next(seq), ts=ts, actor=ACTOR, step=step,
                                 key=key, deadline=ts + 10_000), "running", key),
            (ev.ActionSucceeded(v=4, run=rid, seq=next(seq), ts=ts, actor=ACTOR, step=step,
                                key=key, result={"n": step}), "running", key)]
    out.append((ev.Completed(v=4, run=rid, seq=next(seq), ts=ts, actor=ACTOR,
                             result={"steps": steps}), "completed", ""))
    return out


def recorded(r: redis.Redis, runs: int, steps: int = STEPS, sleep_s: float = SLEEP_S,
             reset: Callable[[redis.Redis], object] = fresh) -> dict[str, float]:
    """The runs' events recorded, one transition each, pipelined: CPU microseconds per run
    of this process (``client``) and of Redis, and the script calls per run. ``reset``
    empties the server first."""
    reset(r)
    sha = r.script_load(TRANSITION_LUA)
    ids = [f"floor-{i}" for i in range(runs)]
    calls = 0
    redis0, c0 = redis_cpu_s(r), time.process_time()
    ts = int(time.time() * 1000)
    runs_keys = [(keys.UNSHARDED.log(rid), keys.UNSHARDED.run(rid),
                  keys.UNSHARDED.ledger(rid)) for rid in ids]
    plans = [_events(rid, ts, steps, sleep_s) for rid in ids]
    # The i-th event of every run, then the next: a run's transitions in order, each
    # checked against the version the previous one left.
    for i in range(len(plans[0])):
        for lo in range(0, runs, PIPELINE):
            pipe = r.pipeline(transaction=False)
            for (k_log, k_run, k_fx), plan in zip(runs_keys[lo:lo + PIPELINE],
                                                 plans[lo:lo + PIPELINE], strict=True):
                event, state, ledger = plan[i]
                pipe.execute_command(
                    "EVALSHA", sha, 3, k_log, k_run, k_fx, i, ev.encode(event), state,
                    getattr(event, "step", 0), int(time.time() * 1000), ledger,
                    "claimed" if ledger else "")
            replies = pipe.execute()
            calls += len(replies)
            bad = [x for x in replies if x[0] != b"ok"]
            if bad:
                raise RuntimeError(f"floor transition refused: {bad[0]}")
    c1, redis1 = time.process_time(), redis_cpu_s(r)
    return {"client_cpu_per_run_us": 1e6 * (c1 - c0) / runs,
            "redis_cpu_per_run_us": 1e6 * (redis1 - redis0) / runs,
            "script_calls_per_run": calls / runs}


def measure(r: redis.Redis, runs: int, rounds: int = 3, log: Any = print,
            held: int = 0) -> dict[str, Any]:
    """Both floors, ``rounds`` times interleaved; medians (per run, µs) and every round;
    with ``held``, the program on threads too (``on_threads``, ``held`` at once)."""
    a: list[dict[str, float]] = []
    b: list[dict[str, float]] = []
    c: list[dict[str, float]] = []
    for _ in range(rounds):
        a.append(nondurable(runs))
        b.append(recorded(r, runs))
        if held:
            c.append(on_threads(runs, held))
    fresh(r)
    out: dict[str, Any] = {
        "runs": runs, "rounds": rounds,
        "program_cpu_per_run_us": median([x["cpu_per_run_us"] for x in a]),
        "record_client_cpu_per_run_us": median([x["client_cpu_per_run_us"] for x in b]),
        "record_redis_cpu_per_run_us": median([x["redis_cpu_per_run_us"] for x in b]),
        "script_calls_per_run": b[0]["script_calls_per_run"],
        "all": {"program": a, "record": b, "program_on_threads": c}}
    if c:
        out["held"] = held
        out["threads_cpu_per_run_us"] = median([x["cpu_per_run_us"] for x in c])
    out["record_cpu_per_run_us"] = (out["record_client_cpu_per_run_us"]
                                    + out["record_redis_cpu_per_run_us"])
    out["floor_cpu_per_run_us"] = out["program_cpu_per_run_us"] + out["record_cpu_per_run_us"]
    log(f"  styles floor, {runs:,} runs: the program {out['program_cpu_per_run_us']:.0f} us, "
        f"its events recorded {out['record_client_cpu_per_run_us']:.0f} (client) + "
        f"{out['record_redis_cpu_per_run_us']:.0f} (Redis) us per run: floor "
        f"{out['floor_cpu_per_run_us']:.0f} us per run"
        + (f"; the program on threads ({held:,} at once) {out['threads_cpu_per_run_us']:.0f} "
           "us per run" if c else ""))
    return out
