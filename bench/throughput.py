"""Item 2: steps per second.

Configurations, each against a server with ``appendfsync everysec`` and one with ``always``:

- ``floor``: the fewest Redis round trips a durable step needs, done directly: one Lua call
  per step (``bench/floor.lua``) that XADDs the outcome and the next intent, claims the next
  key in the ledger and updates the projection under a version check. No agent, no RQ.
- ``plain loop``: the same four no-op tool calls in a Python loop (the non-durable limit).
- ``plain RQ``: four jobs per run of a no-op function on an in-process ``SimpleWorker``
  (burst mode, JSON serializer, ``result_ttl=0`` as the durable commands use), timed from
  the first job's start to the last job's end.
- ``driver in-process``: ``StepLoop.advance`` called in this process on pre-started runs (the
  durable step loop with its lease, heartbeat and tool thread, but no RQ and no worker).
- ``durable, N worker(s)``: K four-step ``count`` runs enqueued with ``Client.start``, then
  N ``durable worker --burst`` processes. Steps/s is measured from the runs' logs: from the
  first worker write (each log's second entry) to the last write (each projection's
  ``last`` entry id), which excludes worker process start-up. Wall time including start-up
  is reported too.

For the floor and the worker configurations, the CPU each process spends per step (the
worker processes and Redis, sampled by ``bench.sampling``) is reported as well: on a machine
with two cores, a worker and its Redis together cannot use more than both.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import msgspec
import psutil
import redis
from rq import Queue, SimpleWorker
from rq.serializers import JSONSerializer

from bench.common import AGENTS, fresh, median, run_window, settings_for, worker
from bench.sampling import CpuTrace
from durable.agents import ToolContext, registry
from durable.agents.cancel_token import CancelToken
from durable.client import Client
from durable.log import events as ev
from durable.log import keys
from durable.workers.loop import StepLoop

STEPS = 4
#: Runs per batch. A worker takes a few hundred milliseconds to fill its slots and reach a
#: steady rate; with 200 runs (800 steps, a window of about 0.3 s) that ramp was most of
#: what the window measured, and the ratio moved by a third between rounds.
RUNS = 1000
#: Runs of the plain RQ row, whatever the batch: its rate is per job.
PLAIN_RQ_RUNS = 200
FLOOR_LUA = (Path(__file__).parent / "floor.lua").read_text()


class Incomplete(TypedDict):
    """A batch whose runs did not all complete: how many did, and the states of all."""

    completed: int
    runs: int
    states: dict[str, int]


class Batch(TypedDict):
    """One batch of one configuration (a sample of ``results.json``): its steps, the
    seconds they took and the rate; what only some configurations measure is optional."""

    steps: int
    seconds: float
    steps_per_s: float
    #: CPU microseconds per step of each process ("client" and "redis" for the floor,
    #: "worker" and "redis" for the worker configurations).
    cpu_us_per_step: NotRequired[dict[str, float]]
    #: The plain RQ worker's whole ``work()``, start-up and teardown included.
    worker_total_s: NotRequired[float]
    wall_s: NotRequired[float]
    wall_steps_per_s: NotRequired[float]
    workers: NotRequired[int]
    incomplete: NotRequired[Incomplete]


def floor(r: redis.Redis, runs: int, steps: int = STEPS) -> Batch:
    script = r.register_script(FLOOR_LUA)
    enc = msgspec.msgpack.Encoder()
    actor = "bench-floor:1:000000"
    server = psutil.Process(int(r.info("server")["process_id"]))
    redis0, own0 = server.cpu_times(), time.process_time()
    t0 = time.perf_counter()
    for i in range(runs):
        rid = f"floor{i}"
        k_log, k_run, k_fx = f"dx:{{{rid}}}:log", f"dx:{{{rid}}}:run", f"dx:{{{rid}}}:fx"
        version = 0
        for step in range(1, steps + 1):
            ts = int(time.time() * 1000)
            key = f"{rid}:{step}"
            if step == 1:
                outcome = enc.encode(ev.LeaseAcquired(v=1, run=rid, seq=version + 1, ts=ts,
                                                      actor=actor, owner=actor, epoch=1))
            else:
                outcome = enc.encode(ev.ActionSucceeded(
                    v=1, run=rid, seq=version + 1, ts=ts, actor=actor, step=step - 1,
                    key=f"{rid}:{step - 1}", result={"n": step - 1}))
            intent = enc.encode(ev.StepDecided(v=1, run=rid, seq=version + 2, ts=ts, actor=actor,
                                               step=step, tool="noop",
                                               args={"n": step, "sleep_s": 0.0}, key=key))
            reply = script(keys=[k_log, k_run, k_fx],
                           args=[version, outcome, intent, key, f"claimed|{ts + 10000}", step, ts])
            assert reply[0] == b"ok", reply
            version = int(reply[1])
    dt = time.perf_counter() - t0
    redis1, own1 = server.cpu_times(), time.process_time()
    n = runs * steps
    return {"steps": n, "seconds": dt, "steps_per_s": n / dt,
            "cpu_us_per_step": {
                "client": (own1 - own0) / n * 1e6,
                "redis": (redis1.user + redis1.system - redis0.user - redis0.system) / n * 1e6}}


def plain_loop(runs: int, steps: int = STEPS) -> Batch:
    registry.load(AGENTS)
    tool = registry.tool("noop")
    token = CancelToken()
    t0 = time.perf_counter()
    for i in range(runs):
        for step in range(1, steps + 1):
            ctx = ToolContext(run_id=f"p{i}", step=step, key=f"p{i}:{step}",
                              deadline_ms=0, token=token)
            tool.run({"n": step, "sleep_s": 0.0}, ctx)
    dt = time.perf_counter() - t0
    return {"steps": runs * steps, "seconds": dt, "steps_per_s": runs * steps / dt}


class _TimedWorker(SimpleWorker):  # type: ignore[misc]
    """Times its jobs from the start of the first to the end of the last: the worker's
    start-up and teardown are not counted (subtracting a separately measured start-up
    gave negative rates on a busy machine)."""

    first: float | None = None
    last: float | None = None

    def execute_job(self, job: Any, queue: Any) -> Any:
        if self.first is None:
            self.first = time.perf_counter()
        try:
            return super().execute_job(job, queue)
        finally:
            self.last = time.perf_counter()


def plain_rq(r: redis.Redis, runs: int, steps: int = STEPS) -> Batch:
    q = Queue("bench-rq", connection=r, serializer=JSONSerializer)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    jobs = runs * steps
    try:
        q.enqueue_many([Queue.prepare_data("bench.rqjobs.noop", args=(n,), result_ttl=0,
                                           timeout=-1, failure_ttl=86400)
                        for n in range(jobs)])
        worker = _TimedWorker([q], connection=r, serializer=JSONSerializer)
        t0 = time.perf_counter()
        worker.work(burst=True, logging_level="WARNING")
        total = time.perf_counter() - t0
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    assert q.count == 0
    assert worker.first is not None and worker.last is not None
    dt = worker.last - worker.first
    return {"steps": jobs, "seconds": dt, "steps_per_s": jobs / dt,
            "worker_total_s": total}


def start_runs(client: Client, prefix: str, runs: int, steps: int = STEPS,
               enqueue: bool = True, sleep_s: float = 0.0) -> list[str]:
    ids = [f"{prefix}{i}" for i in range(runs)]
    for rid in ids:
        client.start("count", {"steps": steps, "sleep_s": sleep_s}, run_id=rid, enqueue=enqueue)
    return ids


def driver_inproc(url: str, r: redis.Redis, runs: int, steps: int = STEPS) -> Batch:
    settings = settings_for(url)
    client = Client(settings, r)
    ids = start_runs(client, "d", runs, steps, enqueue=False)
    driver = StepLoop(settings, r, registry, "bench-inproc:1:000000")
    t0 = time.perf_counter()
    for rid in ids:
        driver.advance(rid)
    dt = time.perf_counter() - t0
    _first, _last, done = run_window(r, ids)
    assert done == runs, f"{done}/{runs} completed"
    return {"steps": runs * steps, "seconds": dt, "steps_per_s": runs * steps / dt}


def durable(url: str, r: redis.Redis, runs: int, workers: int,
            steps: int = STEPS) -> Batch:
    client = Client(settings_for(url), r)
    ids = start_runs(client, "w", runs, steps)
    t0 = time.perf_counter()
    procs = [worker(url, burst=True) for _ in range(workers)]
    server = int(r.info("server")["process_id"])
    with CpuTrace([server, *(p.pid for p in procs)]) as cpu:
        for p in procs:
            try:
                p.wait(300)
            except subprocess.TimeoutExpired:  # a stuck worker is reported, not fatal
                p.kill()
    wall = time.perf_counter() - t0
    first, last, done = run_window(r, ids)
    window = max(last - first, 1) / 1000
    n = done * steps
    used = cpu.between(first / 1000, last / 1000)
    out: Batch = {"steps": n, "seconds": window,
                  "steps_per_s": n / window, "wall_s": wall,
                  "wall_steps_per_s": n / wall, "workers": workers,
                  "cpu_us_per_step": {"worker": sum(used[1:]) / max(n, 1) * 1e6,
                                      "redis": used[0] / max(n, 1) * 1e6}}
    if done != runs:
        pipe = r.pipeline(transaction=False)
        for rid in ids:
            pipe.hget(keys.UNSHARDED.run(rid), "state")
        states = Counter((s or b"?").decode() for s in pipe.execute())
        out["incomplete"] = {"completed": done, "runs": runs, "states": dict(states)}
    return out


CONFIGS = ("floor", "plain loop", "plain RQ", "driver in-process", "durable, 1 worker",
           "durable, 2 workers")


def measure(name: str, url: str, r: redis.Redis, runs: int) -> Batch:
    fresh(r)
    if name == "floor":
        return floor(r, runs)
    if name == "plain loop":
        return plain_loop(runs)
    if name == "plain RQ":
        # A rate per job: fewer jobs suffice (about 160 jobs/s, so a few hundred of them).
        return plain_rq(r, max(20, min(runs, PLAIN_RQ_RUNS) // 3))
    if name == "driver in-process":
        return driver_inproc(url, r, runs)
    if name.startswith("durable"):
        return durable(url, r, runs, workers=int(name.split(", ")[1].split()[0]))
    raise KeyError(name)


def run(servers: Any, quick: bool = False, rounds: int | None = None,
        runs: int | None = None, log: Any = print) -> dict[str, Any]:
    rounds = rounds or (1 if quick else 3)
    runs = runs or (60 if quick else RUNS)
    fsyncs = list(servers.fsyncs)
    samples: dict[str, dict[str, list[Batch]]] = {
        f: {c: [] for c in CONFIGS} for f in fsyncs}
    incomplete: list[dict[str, Any]] = []
    for rnd in range(rounds):
        # Interleave: every round measures every (fsync, config), in a rotated order.
        order = [(f, c) for c in CONFIGS for f in fsyncs]
        shift = rnd * 3 % len(order)
        order = order[shift:] + order[:shift]
        for fsync, cfg in order:
            if cfg == "plain loop" and fsync != fsyncs[0]:
                continue  # no Redis: measured once per round
            srv = servers.get(fsync)
            r = srv.client()
            res = measure(cfg, srv.url, r, runs)
            r.close()
            samples[fsync][cfg].append(res)
            log(f"  throughput round {rnd + 1}/{rounds} {fsync:8s} {cfg:20s} "
                f"{res['steps_per_s']:10.0f} steps/s")
            if "incomplete" in res:
                log(f"  WARNING: {fsync} {cfg}: {res['incomplete']}")
                incomplete.append({"fsync": fsync, "config": cfg, "round": rnd + 1,
                                   **res["incomplete"]})
    out: dict[str, Any] = {"runs_per_batch": runs, "steps_per_run": STEPS, "rounds": rounds,
                           "by_fsync": {}, "incomplete_batches": incomplete}
    loop = [s["steps_per_s"] for s in samples[fsyncs[0]]["plain loop"]]
    for fsync in fsyncs:
        row: dict[str, Any] = {}
        for cfg in CONFIGS:
            ss = samples[fsync][cfg] or samples[fsyncs[0]][cfg]
            row[cfg] = {"steps_per_s": median([s["steps_per_s"] for s in ss]),
                        "all": [round(s["steps_per_s"], 1) for s in ss]}
            if cfg.startswith("durable"):
                row[cfg]["wall_steps_per_s"] = median([s["wall_steps_per_s"] for s in ss])
            if ss and "cpu_us_per_step" in ss[0]:
                row[cfg]["cpu_us_per_step"] = {
                    part: median([s["cpu_us_per_step"][part] for s in ss])
                    for part in ss[0]["cpu_us_per_step"]}
        one = row["durable, 1 worker"]["steps_per_s"]
        row["ratios"] = {
            "durable_1w / floor": one / row["floor"]["steps_per_s"],
            "durable_1w steps/s / plain RQ jobs/s": one / row["plain RQ"]["steps_per_s"],
            "durable_2w / durable_1w": row["durable, 2 workers"]["steps_per_s"] / one,
            "durable_2w per worker process / floor": row["durable, 2 workers"]["steps_per_s"]
            / 2 / row["floor"]["steps_per_s"],
            "driver_inproc / floor": row["driver in-process"]["steps_per_s"]
            / row["floor"]["steps_per_s"],
            "plain loop / durable_1w": median(loop) / one,
        }
        out["by_fsync"][fsync] = row
    return out
