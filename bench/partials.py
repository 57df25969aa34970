"""``python -m bench.partials [--quick]``: what keeping partial output costs (not part of
``python -m bench``; about 20 s, its own embedded server).

A step's ``ctx.emit`` used to be one ``PUBLISH``; it is now ``partial_emit.lua`` (keep the
message in the step's bounded list, then publish it), so a follower that joins late gets
the text so far (``durable.streams.partials``). Measured, interleaved over rounds, on one
connection with one follower subscribed (draining on a thread of its own):

- microseconds per emit of a model token (a 6-byte delta), ``PUBLISH`` alone against the
  script, as the worker's ``CallOutput`` sends it;
- what a late follower reads on joining: ``kept()`` of one step that emitted N tokens
  (the whole list, or the newest 1 MiB past it), its time, messages and the Redis memory
  the list takes.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

import redis

from durable.log import keys
from durable.streams.partials import Publisher, encode_partial, kept
from durable.testing import Server

RUN = "bench-partials"


def _drain(r: redis.Redis, stop: threading.Event) -> None:
    pubsub = r.pubsub()
    pubsub.subscribe(keys.UNSHARDED.stream(RUN))
    try:
        while not stop.is_set():
            pubsub.get_message(timeout=0.1)
    except redis.RedisError:
        pass
    finally:
        pubsub.close()


def _publish_only(r: redis.Redis, n: int) -> float:
    channel = keys.UNSHARDED.stream(RUN)
    t0 = time.perf_counter()
    for i in range(n):
        r.publish(channel, encode_partial(RUN, 1, 1, i + 1, f"tok{i % 100} ", 262144))
    return (time.perf_counter() - t0) / n * 1e6


def _kept_and_published(pub: Publisher, n: int, step: int) -> float:
    out = pub.for_call(RUN, step, 1)
    t0 = time.perf_counter()
    for i in range(n):
        out(f"tok{i % 100} ")
    took = (time.perf_counter() - t0) / n * 1e6
    out.close()
    return took


def _join(r: redis.Redis, pub: Publisher, n: int, step: int) -> dict[str, Any]:
    out = pub.for_call(RUN, step, 1)
    for i in range(n):
        out(f"tok{i % 100} ")
    t0 = time.perf_counter()
    got = kept(r, keys.UNSHARDED, RUN)
    took = (time.perf_counter() - t0) * 1000
    memory = r.memory_usage(keys.UNSHARDED.partial(RUN, step)) or 0
    result = {"tokens": n, "kept": len(got), "first_seq": got[0].seq if got else 0,
              "read_ms": round(took, 2), "redis_bytes": int(memory)}
    out.close()
    return result


def run(quick: bool = False) -> dict[str, Any]:
    n, rounds = (2000, 2) if quick else (20000, 3)
    srv = Server(fsync="everysec").start()
    stop = threading.Event()
    try:
        r = srv.client()
        r.hset(keys.UNSHARDED.run(RUN), "state", "pending")
        drain = threading.Thread(target=_drain, args=(srv.client(), stop), daemon=True)
        drain.start()
        time.sleep(0.2)
        pub = Publisher(r, 262144)
        plain, keeping = [], []
        for k in range(rounds):
            plain.append(_publish_only(r, n))
            keeping.append(_kept_and_published(pub, n, 10 + k))
        joins = [_join(r, pub, size, 100 + i)
                 for i, size in enumerate((200, 2000, 100_000 if not quick else 20_000))]
        stop.set()
        drain.join(5)
        return {"emits_per_round": n, "rounds": rounds,
                "publish_us": round(statistics.median(plain), 1),
                "keep_and_publish_us": round(statistics.median(keeping), 1),
                "joins": joins}
    finally:
        stop.set()
        srv.stop()


def markdown(res: dict[str, Any]) -> str:
    lines = [f"## Partial output kept for late followers ({res['emits_per_round']} emits x "
             f"{res['rounds']} rounds, one follower subscribed)\n",
             "| emit of a 6-byte token | µs per emit (median of rounds) |", "|---|---:|",
             f"| `PUBLISH` alone (before) | {res['publish_us']} |",
             f"| `partial_emit.lua`: keep + publish (now) | {res['keep_and_publish_us']} |",
             "", "| a follower joins after N tokens | messages read | first seq | read ms | "
             "Redis bytes of the list |", "|---:|---:|---:|---:|---:|"]
    for j in res["joins"]:
        lines.append(f"| {j['tokens']} | {j['kept']} | {j['first_seq']} | {j['read_ms']} | "
                     f"{j['redis_bytes']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.partials", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    print(markdown(run(quick=args.quick)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
