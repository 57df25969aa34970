"""``Handoff``: the result a task of the event loop hands to a run's driver on another thread
(``durable.eventloop``). Each behaviour the worker relies on, across real threads and the
process's real loop: callbacks registered before and after the result, a waiter woken by
it, a timeout, an error and a cancel passed on, and a second settlement refused."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from durable.eventloop import EVENT_LOOP, Handoff


def test_a_callback_registered_before_the_result_runs_once_on_the_settling_thread() -> None:
    done: Handoff[int] = Handoff()
    seen: list[tuple[int, int]] = []
    done.add_done_callback(lambda h: seen.append((h.result(), threading.get_ident())))
    settler = threading.Thread(target=done.set_result, args=(7,))
    settler.start()
    settler.join()
    assert seen == [(7, settler.ident)]
    assert done.done() and not done.cancelled()


def test_a_callback_registered_after_the_result_runs_at_once() -> None:
    done: Handoff[str] = Handoff()
    done.set_result("x")
    seen: list[str] = []
    done.add_done_callback(lambda h: seen.append(h.result()))
    assert seen == ["x"]


def test_a_thread_waiting_on_the_result_is_woken_by_it_and_a_short_wait_times_out() -> None:
    done: Handoff[int] = Handoff()
    with pytest.raises(concurrent.futures.TimeoutError):
        done.result(timeout=0.01)
    threading.Timer(0.05, done.set_result, args=(3,)).start()
    assert done.result(timeout=10) == 3


def test_an_error_and_a_cancel_are_passed_on_and_a_second_settlement_is_refused() -> None:
    failed: Handoff[int] = Handoff()
    failed.set_exception(ValueError("boom"))
    assert isinstance(failed.exception(), ValueError)
    with pytest.raises(ValueError, match="boom"):
        failed.result()
    with pytest.raises(concurrent.futures.InvalidStateError):
        failed.set_result(1)
    dropped: Handoff[int] = Handoff()
    assert dropped.cancel() and dropped.cancelled()
    assert not dropped.cancel()
    with pytest.raises(concurrent.futures.CancelledError):
        dropped.result()


def test_a_task_submitted_to_the_loop_hands_over_its_result_its_error_and_its_cancel() -> None:
    async def value() -> int:
        await asyncio.sleep(0)
        return 5

    async def error() -> int:
        raise KeyError("k")

    async def cancelled() -> int:
        raise asyncio.CancelledError

    assert EVENT_LOOP.submit(value()).result(timeout=10) == 5
    with pytest.raises(KeyError):
        EVENT_LOOP.submit(error()).result(timeout=10)
    gone = EVENT_LOOP.submit(cancelled())
    with pytest.raises(concurrent.futures.CancelledError):
        gone.result(timeout=10)
    assert gone.cancelled()
