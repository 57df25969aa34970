"""The limiter's decisions (``durable.flow.limits``, ``limit_take.lua``, ``limit_release.lua``)
on the real Redis server, with a clock the test moves: permits in flight, calls per
period, tokens reserved and settled, a permit whose holder died, a 429 lowering the rate
for every worker. The processes' side is in ``tests/test_flow_control.py``."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from durable.errors import UsageError
from durable.flow.limit_usage import usage
from durable.flow.limits import Limit, Limiter, key_of
from durable.log import events as ev
from durable.log.state import RunState
from durable.log.store import Spec


class _Tool:
    name = "t"

    def __init__(self, *limits: Limit) -> None:
        self.limits = limits


class _Clock:
    def __init__(self) -> None:
        self.ms = 1_800_000_000_000

    def __call__(self) -> int:
        return self.ms


def _state(run: str, tenant: str = "") -> RunState:
    return RunState(run_id=run, agent="a", tenant=tenant)


@pytest.fixture()
def clock() -> _Clock:
    return _Clock()


def _limiter(r: redis.Redis, clock: _Clock, woken: list[str] | None = None) -> Limiter:
    return Limiter(r, wake=(woken.append if woken is not None else lambda run: None),
                   clock=clock)


def _ok(result: Any) -> Spec:
    return Spec(ev.ActionSucceeded, {"step": 1, "key": "k", "result": result})


def test_at_most_n_in_flight_and_a_release_wakes_the_oldest_waiter(
        r: redis.Redis, clock: _Clock) -> None:
    woken: list[str] = []
    lim = _limiter(r, clock, woken)
    tool = _Tool(Limit("api", in_flight=2))
    deadline = clock() + 10_000
    assert lim.take(_state("r1"), None, tool, 1, {}, deadline) is None
    assert lim.take(_state("r2"), None, tool, 1, {}, deadline) is None
    wait = lim.take(_state("r3"), None, tool, 1, {}, deadline)
    assert wait is not None and "2 in flight" in wait.reason, wait
    clock.ms += 5
    assert lim.take(_state("r4"), None, tool, 1, {}, deadline) is not None
    [use] = usage(r, clock())
    assert (use.in_flight, use.max_in_flight, use.waiting) == (2, 2, 2)
    lim.release("r1", 1, [_ok({})])
    assert woken == ["r3"]  # the oldest waiter first
    assert lim.take(_state("r3"), None, tool, 1, {}, deadline) is None
    assert usage(r, clock())[0].waiting == 1


def test_at_most_r_per_period_with_waiters_due_one_after_another(
        r: redis.Redis, clock: _Clock) -> None:
    lim = _limiter(r, clock)
    tool = _Tool(Limit("api", rate=3, per_s=1.0, margin_s=0.0))
    start = clock()
    for n in range(3):
        assert lim.take(_state(f"g{n}"), None, tool, 1, {}, start + 10_000) is None
        clock.ms += 100
    first = lim.take(_state("w1"), None, tool, 1, {}, start + 10_000)
    second = lim.take(_state("w2"), None, tool, 1, {}, start + 10_000)
    assert first is not None and second is not None
    assert first.retry_at == start + 1000  # when the oldest grant leaves the window
    assert second.retry_at == start + 1100  # staggered: not every waiter at once
    clock.ms = start + 1000
    assert lim.take(_state("w1"), None, tool, 1, {}, start + 10_000) is None
    assert lim.take(_state("w2"), None, tool, 1, {}, start + 10_000) is not None


def test_tokens_are_reserved_from_the_estimate_and_settled_from_the_usage(
        r: redis.Redis, clock: _Clock) -> None:
    lim = _limiter(r, clock)

    class Model(_Tool):
        def estimate_tokens(self, args: dict[str, Any]) -> int:
            return int(args["max_tokens"])

    tool = Model(Limit("tpm", tokens=10_000, per_s=60))
    deadline = clock() + 10_000
    for n in range(5):
        assert lim.take(_state(f"m{n}"), None, tool, 1, {"max_tokens": 2000}, deadline) is None
    assert lim.take(_state("m5"), None, tool, 1, {"max_tokens": 2000}, deadline) is not None
    assert usage(r, clock())[0].tokens == 10_000
    for n in range(5):  # each reply used 1,000: room for five more
        lim.release(f"m{n}", 1, [_ok({"usage": {"total_tokens": 1000}})])
    assert usage(r, clock())[0].tokens == 5000
    assert lim.take(_state("m5"), None, tool, 1, {"max_tokens": 2000}, deadline) is None
    clock.ms += 60_300
    assert usage(r, clock())[0].tokens == 0


def test_a_permit_whose_holder_died_lapses_at_its_deadline(r: redis.Redis,
                                                           clock: _Clock) -> None:
    """Window: the holder took the only permit and was SIGKILLed before releasing it."""
    lim = _limiter(r, clock)
    tool = _Tool(Limit("api", in_flight=1))
    assert lim.take(_state("dead"), None, tool, 1, {}, clock() + 2000) is None
    other = _limiter(r, clock)  # another worker: the dead one's memory is gone
    assert other.take(_state("next"), None, tool, 1, {}, clock() + 2000) is not None
    clock.ms += 2001
    assert other.take(_state("next"), None, tool, 1, {}, clock() + 2000) is None
    assert usage(r, clock())[0].in_flight == 1  # next's own; dead's lapsed


def test_a_429_lowers_the_rate_for_every_worker_and_it_recovers(r: redis.Redis,
                                                                 clock: _Clock) -> None:
    lim = _limiter(r, clock)
    tool = _Tool(Limit("api", rate=10, per_s=1.0, margin_s=0.0))
    assert lim.take(_state("a"), None, tool, 1, {}, clock() + 5000) is None
    lim.release("a", 1, [Spec(ev.ActionFailed, {"step": 1, "key": "k", "error": "429",
                                                "error_type": "RateLimited",
                                                "retry_at": clock() + 2000})])
    [use] = usage(r, clock())
    assert (use.factor, use.until, use.throttled) == (0.5, clock() + 2000, 1)
    other = _limiter(r, clock)
    wait = other.take(_state("b"), None, tool, 1, {}, clock() + 5000)
    assert wait is not None and "Retry-After" in wait.why
    clock.ms += 2000
    granted = sum(other.take(_state(f"c{n}"), None, tool, 1, {}, clock() + 5000) is None
                  for n in range(10))
    assert granted == 5  # half the declared rate
    clock.ms += 3000  # three periods without a 429: 0.5 + 3 x 0.1
    assert usage(r, clock())[0].factor == 0.8


def test_keys_come_from_the_run_and_the_arguments() -> None:
    limit = Limit("api", key="{tenant}:{args.account.id}", rate=1)
    state = RunState(run_id="r", tenant="acme")
    assert key_of(limit, state, "t", {"account": {"id": 7}}) == "acme:7"
    assert key_of(limit, state, "t", {}) == "acme:"
    assert key_of(Limit("api", key="{args.x}", rate=1), state, "t", {"x": "a{b} c"}) == "a_b__c"
    for bad in ({"name": "a b", "rate": 1}, {"name": "a"}, {"name": "a", "rate": -1},
                {"name": "a", "rate": 1, "key": "{nope}"}, {"name": "a", "rate": 1, "per_s": 0}):
        with pytest.raises(UsageError):
            Limit(**bad)


def test_a_call_gets_all_its_permits_or_none(r: redis.Redis, clock: _Clock) -> None:
    lim = _limiter(r, clock)
    wide, narrow = Limit("wide", in_flight=5), Limit("narrow", in_flight=1)
    assert lim.take(_state("first"), None, _Tool(narrow), 1, {}, clock() + 5000) is None
    wait = lim.take(_state("second"), None, _Tool(wide, narrow), 1, {}, clock() + 5000)
    assert wait is not None and wait.limit == "narrow"
    assert {u.limit: u.in_flight for u in usage(r, clock())} == {"wide": 0, "narrow": 1}
