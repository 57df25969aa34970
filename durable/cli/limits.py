"""``durable limits``: every limiter in use, its use against its bounds, the calls waiting
for it and its adaptive rate (``durable.flow.limits``)."""

from __future__ import annotations

import argparse

from durable.cli.output import OK, Add, age, client, json_out, local_time, table
from durable.flow.limit_usage import Use, usage
from durable.log.store import now_ms


def _of(n: int, bound: int) -> str:
    return f"{n}/{bound}" if bound else str(n)


def _rate(u: Use, now: int) -> str:
    if u.factor >= 1 and u.until <= now:
        return "declared"
    held = f", held until {local_time(u.until)}" if u.until > now else ""
    return f"{u.factor:.0%} of declared{held}"


def cmd_limits(args: argparse.Namespace) -> int:
    now = now_ms()
    found = [u for u in usage(client().redis, now) if not args.limit or u.limit == args.limit]
    if args.json:
        for u in found:
            json_out(u.to_json())
        return OK
    table("limits (in use / bound; per period of the limit)",
          ["limit", "key", "in flight", "calls", "tokens", "period", "waiting", "rate",
           "granted", "waited", "429s", "used"],
          [(u.limit, u.key or "-", _of(u.in_flight, u.max_in_flight),
            _of(u.calls, int(u.rate * u.factor) or u.rate if u.rate else 0),
            _of(u.tokens, u.max_tokens), f"{u.period_ms / 1000:g} s", u.waiting,
            _rate(u, now), u.granted, u.waited, u.throttled, age(u.at, now))
           for u in found])
    return OK


def register(add: Add) -> None:
    sp = add("limits", cmd_limits, "limits shared by every worker: use, waiting calls, "
             "adaptive rate")
    sp.add_argument("--limit", default=None, help="only this limit's keys")
