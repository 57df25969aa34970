"""What the limiters hold now (``durable.flow.limits``): their use against their bounds, the
calls waiting and the adaptive rate, for ``durable limits``, the metrics and the console."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis

from durable.flow.limits import RECOVER
from durable.log import keys


@dataclass(frozen=True)
class Use:
    """One limiter as ``durable limits`` shows it: the use now against the declared bound
    (0: none), the calls waiting, the adaptive share of the rate and its hold."""

    limit: str
    key: str
    in_flight: int
    max_in_flight: int
    calls: int
    rate: int
    tokens: int
    max_tokens: int
    period_ms: int
    waiting: int
    factor: float
    until: int
    granted: int
    waited: int
    throttled: int
    at: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def usage(client: redis.Redis, now: int | None = None) -> list[Use]:
    """Every limiter noted in ``keys.LIMITERS`` (those idle for a day are dropped)."""
    now = now if now is not None else int(time.time() * 1000)
    noted = []
    for tag, raw in sorted(client.hgetall(keys.LIMITERS).items()):
        name, _, key = tag.decode().partition("|")
        try:
            info = json.loads(raw)
        except ValueError:
            continue
        if now - int(info.get("at", 0)) > 86_400_000:
            client.hdel(keys.LIMITERS, tag)
            continue
        noted.append((name, key, info))
    pipe = client.pipeline(transaction=False)
    for name, key, info in noted:
        inflight, calls, tokens, state, waiting = (
            keys.limiter(name, key, part)
            for part in ("inflight", "calls", "tokens", "state", "waiting"))
        period = int(info.get("period_ms", 60_000))
        pipe.zcount(inflight, f"({now}", "+inf")
        pipe.zcount(calls, f"({now - period}", "+inf")
        pipe.zrangebyscore(tokens, f"({now - period}", "+inf")
        pipe.hgetall(state)
        pipe.zcard(waiting)
    replies = pipe.execute()
    pipe = client.pipeline(transaction=False)
    for i, (name, key, _info) in enumerate(noted):
        members = replies[5 * i + 2]
        if members:
            pipe.hmget(keys.limiter(name, key, "used"), members)
        else:
            pipe.echo("")
    spent = pipe.execute() if noted else []
    out = []
    for i, (name, key, info) in enumerate(noted):
        n_inflight, n_calls, _, raw_state, n_waiting = replies[5 * i:5 * i + 5]
        st = {k.decode(): v.decode() for k, v in raw_state.items()}
        period = int(info.get("period_ms", 60_000))
        factor = float(st.get("factor", 1))
        if factor < 1:
            since = max(0, (now - int(st.get("lowered", now))) // period)
            factor = min(1.0, factor + RECOVER * since)
        in_tokens = sum(int(v) for v in spent[i] if v) if isinstance(spent[i], list) else 0
        out.append(Use(name, key, int(n_inflight), int(info.get("in_flight", 0)),
                       int(n_calls), int(info.get("rate", 0)), in_tokens,
                       int(info.get("tokens", 0)), period, int(n_waiting),
                       round(factor, 3), int(st.get("until", 0)),
                       int(st.get("granted", 0)), int(st.get("waited", 0)),
                       int(st.get("throttled", 0)), int(info.get("at", 0))))
    return out
