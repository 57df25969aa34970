"""What sealing sensitive fields costs (``durable.security.sealing``): one AES-GCM seal and open, an
event written with a sealed field against one without, and a worker's recovery fold of a
log with and without envelopes (the path every worker takes, sealed or not).

    python -m bench.sealing [--quick]

No Redis is needed: the fold is timed over entries as ``XRANGE`` returns them.
"""

from __future__ import annotations

import argparse
import base64
import gc
import os
import statistics
import time
from collections.abc import Callable
from typing import Any, TypedDict

import msgspec
import redis

from durable.log import events as ev
from durable.log.store import EventLog
from durable.security.sealing import Keyring, seal_payloads

RUN = "r-7f3a9c2e41d05b68"


class _Envelope(TypedDict):
    """The fields every event of the sampled log shares (``ts`` differs by type)."""

    v: int
    run: str
    actor: str


def _per_call_us(fn: Callable[[], object], n: int, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(times)


def _log(steps: int, ring: Keyring | None) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """A run's log of ``steps`` card payments, as XRANGE returns it."""
    base: _Envelope = {"v": ev.SCHEMA_VERSION, "run": RUN, "actor": "w"}
    names = {"card_number", "auth_code"}
    out: list[ev.Event] = [ev.RunStarted(**base, seq=1, ts=1, agent="pay", agent_version="1",
                                         input={"n": steps})]
    for s in range(1, steps + 1):
        key = f"{RUN}:{s}"
        out.append(ev.StepDecided(**base, seq=len(out) + 1, ts=2, step=s, tool="charge",
                                  args={"card_number": "4111222233334444", "amount": s},
                                  key=key))
        out.append(ev.ActionDispatched(**base, seq=len(out) + 1, ts=3, step=s, key=key,
                                       deadline=10))
        out.append(ev.ActionSucceeded(**base, seq=len(out) + 1, ts=4, step=s, key=key,
                                      result={"auth_code": f"A-{s}", "amount": s}))
    raw = []
    for i, event in enumerate(out):
        data = msgspec.to_builtins(event)
        if ring is not None:
            seal_payloads(data, names, ring)
        blob = ev.encode(msgspec.convert(data, type(event)))
        raw.append((f"1-{i}".encode(), {b"e": blob}))
    return raw


def run(quick: bool = False) -> dict[str, Any]:
    ring = Keyring.parse("k1:" + base64.b64encode(os.urandom(32)).decode())
    n, reps, steps = (2000, 3, 300) if quick else (20000, 5, 3000)
    envelope = ring.seal("4111222233334444")
    event = ev.StepDecided(v=ev.SCHEMA_VERSION, run=RUN, seq=3, ts=1, actor="w", step=1,
                           tool="charge", args={"card_number": "4111222233334444",
                                                "amount": 7}, key=f"{RUN}:1")
    client = redis.Redis()  # never connected: the fold reads no key
    plain_log = EventLog(client)
    sealing_log = EventLog(client, keyring=ring, open_sealed=True,
                           sealed_names={"card_number", "auth_code"})
    clear, sealed = _log(steps, None), _log(steps, ring)
    res: dict[str, Any] = {
        "seal_us": _per_call_us(lambda: ring.seal("4111222233334444"), n, reps),
        "open_us": _per_call_us(lambda: ring.open(envelope), n, reps),
        "encode_plain_us": _per_call_us(lambda: plain_log._encode(event), n, reps),
        "encode_sealed_us": _per_call_us(lambda: sealing_log._encode(event), n, reps),
        "events": len(clear),
        "envelope_bytes": len(msgspec.json.encode(envelope)),
    }
    folds: dict[str, Callable[[], object]] = {
        "fold_plain_log_ms": lambda: plain_log.handle_from(RUN, len(clear), clear),
        "fold_plain_log_opening_ms": lambda: sealing_log.handle_from(RUN, len(clear), clear),
        "fold_sealed_log_opening_ms": lambda: sealing_log.handle_from(RUN, len(sealed), sealed),
    }
    times: dict[str, list[float]] = {name: [] for name in folds}
    for _ in range(reps * 2):  # interleaved, so that load on the machine hits all alike
        for name, fold in folds.items():
            gc.collect()  # garbage of the previous fold must not be collected in this one
            times[name].append(_per_call_us(fold, 1, 1) / 1000)
    res.update({name: statistics.median(t) for name, t in times.items()})
    client.close()
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    for name, value in run(quick=args.quick).items():
        print(f"{name:28} {value:10.2f}" if isinstance(value, float) else f"{name:28} {value:10}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
