"""What the security checks cost: cancel latency under a flood of forged cancel messages, and
the append script's tail check.

    python -m bench.flood [--rate 10000] [--runs 5] [--seconds 8] [--appends 5000]

1. A real worker (``DURABLE_CANCEL_SECRET`` set) holds ``count`` runs blocked in ``noop``;
   each is cancelled with ``Client.cancel`` while nothing else is published, then while
   another process-thread publishes forged messages at ``--rate`` per second. Reported: the
   ``canceled`` event's latency (request -> canceled) for both, the worker's log lines about
   refused messages and the HINCRBY calls the server saw during the flood (the worker
   reports every 2 s here).
2. ``--appends`` one-event commits to one run through ``append.lua``, alternately with the
   tail check (an ordinary write) and without it (the quarantine flag skips it): the
   median time of a commit each way.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

import redis

from bench.common import median, settings_for, worker
from durable.client import Client
from durable.log import events as ev
from durable.log import keys
from durable.log.state import RunState
from durable.log.store import EventLog, RunHandle, Spec, now_ms
from durable.testing import Server, wait_for

SECRET = "bench-secret"


def _latency(client: Client, run_id: str) -> float:
    assert wait_for(lambda: (a := client.status(run_id).actions.get(1)) is not None
                    and a.status == "dispatched", 60)
    client.cancel(run_id, "bench")
    final = client.wait(run_id, 60)
    assert final.state == "canceled", final.state
    (done,) = [e.event for e in client.events(run_id) if isinstance(e.event, ev.Canceled)]
    return float(done.latency_ms)


def _flood(url: str, rate: int, stop: threading.Event, sent: list[int]) -> None:
    r = redis.Redis.from_url(url)
    try:
        batch = max(1, rate // 100)
        while not stop.is_set():
            start = time.monotonic()
            pipe = r.pipeline(transaction=False)
            for i in range(batch):
                pipe.publish(keys.CANCEL_CHANNEL, json.dumps(
                    {"run": "victim", "reason": f"forged {i}", "scope": "run",
                     "ts": now_ms(), "sig": "00"}))
            pipe.execute()
            sent[0] += batch
            time.sleep(max(0.0, 0.01 - (time.monotonic() - start)))
    finally:
        r.close()


def cancels(url: str, workdir: Path, rate: int, runs: int,
            seconds: float) -> dict[str, object]:
    settings = settings_for(url, cancel_secret=SECRET)
    client = Client(settings)
    log = workdir / "worker.log"
    w = worker(url, log_path=log, DURABLE_CANCEL_SECRET=SECRET, DURABLE_CONCURRENCY="8",
               DURABLE_CANCEL_REPORT_INTERVAL_S="2")
    try:
        quiet = [_latency(client, client.start("count", {"steps": 2, "sleep_s": 30}).run_id)
                 for _ in range(runs)]
        before = int(client.redis.info("commandstats").get("cmdstat_hincrby", {})
                     .get("calls", 0))
        stop, sent = threading.Event(), [0]
        flood = threading.Thread(target=_flood, args=(url, rate, stop, sent))
        flood.start()
        started = time.monotonic()
        try:
            time.sleep(1.0)
            loud = [_latency(client, client.start("count", {"steps": 2, "sleep_s": 30}).run_id)
                    for _ in range(runs)]
            time.sleep(max(0.0, seconds - (time.monotonic() - started)))
        finally:
            stop.set()
            flood.join()
        elapsed = time.monotonic() - started
        time.sleep(3.0)  # the worker's next report
        writes = int(client.redis.info("commandstats").get("cmdstat_hincrby", {})
                     .get("calls", 0)) - before
    finally:
        w.stop()
        client.redis.close()
    lines = sum(1 for x in log.read_text().splitlines() if "cancel message" in x)
    return {"latency ms, quiet (median)": median(quiet),
            "latency ms, under flood (median)": median(loud),
            "forged messages sent": sent[0],
            "flood rate /s (achieved)": round(sent[0] / elapsed),
            "HINCRBY calls during the flood": writes,
            "worker log lines about refused messages": lines}


def appends(url: str, n: int) -> dict[str, object]:
    r = redis.Redis.from_url(url)
    elog = EventLog(r)
    handle = RunHandle("bench-tail", RunState(), actor="bench")
    elog.commit(handle, [Spec(ev.RunStarted, {"agent": "count", "input": {"steps": 1}})])
    with_check: list[float] = []
    without: list[float] = []
    for i in range(n):
        spec = [Spec(ev.LeaseAcquired, {"owner": "b", "epoch": i})]
        t0 = time.perf_counter()
        elog.commit(handle, spec, quarantine=i % 2 == 1)
        (without if i % 2 else with_check).append((time.perf_counter() - t0) * 1e6)
    r.close()
    return {"commit us, with the tail check (median)": round(median(with_check), 1),
            "commit us, without it (median)": round(median(without), 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.flood", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--seconds", type=float, default=8.0, help="how long the flood lasts")
    p.add_argument("--appends", type=int, default=5000)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-flood-") as tmp:
        srv = Server(fsync="everysec", data_dir=Path(tmp) / "redis").start()
        try:
            results = cancels(srv.url, Path(tmp), args.rate, args.runs, args.seconds)
            if args.appends:
                results.update(appends(srv.url, args.appends))
        finally:
            srv.stop()
    for name, value in results.items():
        print(f"{name:48} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
