"""The call watcher (``workers.calls``): a tool runs on its run's own thread, and one watcher
thread stops it at its deadline or after its cancel's grace period, or gives its run up when
it does not stop. Real threads, real clocks; no Redis is involved in this part."""

from __future__ import annotations

import threading
import time

import pytest

from durable.agents.cancel_token import Cancelled, CancelToken
from durable.testing import wait_for
from durable.workers.calls import CallAbandoned, CallWatch


def _spin(seconds: float) -> str:
    """Python code that ignores its token and swallows ``Exception``s (not the interrupt)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            time.sleep(0.005)
        except Exception:
            pass
    return "done"


def test_a_call_that_returns_is_returned() -> None:
    watch = CallWatch()
    result = watch.call(lambda: 42, 5.0, CancelToken(), 0.1)
    assert (result.outcome, result.value) == ("returned", 42)
    failed = watch.call(lambda: 1 / 0, 5.0, CancelToken(), 0.1)
    assert failed.outcome == "raised" and isinstance(failed.error, ZeroDivisionError)


def test_a_call_past_its_deadline_is_stopped_and_timed_out() -> None:
    """Window: the tool is still running at its deadline: it is interrupted there, not when
    it would have returned."""
    watch = CallWatch()
    t0 = time.monotonic()
    result = watch.call(lambda: _spin(10), 0.3, CancelToken(), 0.1)
    took = time.monotonic() - t0
    assert result.outcome == "timed_out"
    assert 0.3 <= took < 2.0, took


def test_a_cancel_stops_a_tool_that_ignores_it_after_the_grace_period() -> None:
    """Window: the run is canceled while its tool runs and ignores the token: the call is
    interrupted ``grace`` later; a tool that checks its token stops by itself at once."""
    watch = CallWatch()
    token = CancelToken()
    threading.Timer(0.2, token.cancel, args=("stop",)).start()
    t0 = time.monotonic()
    result = watch.call(lambda: _spin(10), 30.0, token, 0.3)
    took = time.monotonic() - t0
    assert result.outcome == "interrupted"
    assert 0.5 <= took < 2.5, took

    polite = CancelToken()
    threading.Timer(0.1, polite.cancel, args=("stop",)).start()

    def cooperative() -> None:
        polite.wait(10)
        polite.check()

    answer = watch.call(cooperative, 30.0, polite, 5.0)
    assert answer.outcome == "raised" and isinstance(answer.error, Cancelled)


def test_a_call_blocked_in_c_is_given_up_and_never_recorded() -> None:
    """Window: the tool blocks in C past its deadline (the interrupt cannot land): the
    watcher reports the thread stuck, and when the call finally returns its caller gets
    ``CallAbandoned`` instead of a result."""
    stuck: list[int] = []
    watch = CallWatch(on_stuck=stuck.append, escalate_s=0.2)
    caller = threading.get_ident()
    with pytest.raises(CallAbandoned):
        watch.call(lambda: time.sleep(1.5), 0.2, CancelToken(), 0.1)
    assert stuck == [caller]


def test_an_interrupt_never_lands_after_the_call_returned() -> None:
    """Window: the deadline passes as the tool returns. Whichever wins, the interrupt is
    raised inside the call or not at all: never in the caller's code after it."""
    watch = CallWatch()
    outcomes = set()

    def returns_as_the_deadline_passes() -> str:
        time.sleep(0.002)
        return "ok"

    for i in range(300):
        result = watch.call(returns_as_the_deadline_passes, 0.002, CancelToken(), 0.0)
        outcomes.add(result.outcome)
        # Code after the call: a late interrupt would raise here and fail the test.
        total = sum(range(2000))
        assert total == 1999000, i
    assert outcomes <= {"returned", "timed_out"}
    # Until the watcher has acted on every deadline it was given (it drops each entry as
    # its time comes), an interrupt could still come: wait for that, then run code.
    assert wait_for(lambda: not watch._heap, 10)
    assert sum(range(100000)) == 4999950000


def test_done_calls_do_not_pile_up_behind_long_deadlines() -> None:
    """Thousands of quick calls with an hour's deadline: the watcher keeps only about as
    many entries as calls are live, not one per call made."""
    watch = CallWatch()
    for _ in range(5000):
        assert watch.call(lambda: None, 3600.0, CancelToken(), 0.1).outcome == "returned"
    assert len(watch._heap) <= 1025  # compacted at 2 x live (none) + 1024
