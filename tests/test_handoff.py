"""``Handoff``: the result a task of the event loop hands to a run's driver on another thread
(``durable.eventloop``). Each behaviour the worker relies on, across real threads and the
process's real loop: callbacks registered before and after the result, a waiter woken by
it, a timeout, an error and a cancel passed on, and a second settlement refused."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import ctypes
import threading

import pytest

from durable.agents import resolve_awaitable
from durable.agents.cancel_token import Cancelled, CancelToken, Overrun
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


def test_an_awaited_tool_call_runs_on_the_process_loop_whichever_thread_waits() -> None:
    """``resolve_awaitable`` (a plain caller's ``async def`` tool or lookup: a run thread,
    the reconciler): the coroutine is a task of the process's loop, in the caller's context,
    so what a tool keeps across calls (a client, a session) stays on one loop; a cancel of
    its token cancels it where it awaits, as a deadline does."""
    var: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="")

    async def where() -> tuple[asyncio.AbstractEventLoop, str]:
        return asyncio.get_running_loop(), var.get()

    def call(name: str, out: list[tuple[asyncio.AbstractEventLoop, str]]) -> None:
        var.set(name)
        out.append(resolve_awaitable(where()))

    seen: list[tuple[asyncio.AbstractEventLoop, str]] = []
    threads = [threading.Thread(target=call, args=(f"t{i}", seen)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {loop for loop, _ in seen} == {EVENT_LOOP.loop}
    assert sorted(name for _, name in seen) == ["t0", "t1"]

    token = CancelToken()
    threading.Timer(0.05, token.cancel, args=("stop",)).start()
    with pytest.raises(Cancelled, match="stop"):
        resolve_awaitable(asyncio.sleep(30), token)
    with pytest.raises(Overrun):
        resolve_awaitable(asyncio.sleep(30), None, timeout=0.05)


def test_a_thread_interrupted_while_it_waits_for_a_task_cancels_the_task() -> None:
    """``EventLoop.wait``: an exception raised in the waiting thread by another (the call
    watcher's ``Overrun``) lands within its polling interval; the task is cancelled."""
    ended: concurrent.futures.Future[str] = concurrent.futures.Future()
    began = threading.Event()

    async def long() -> None:
        began.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            ended.set_result("cancelled")
            raise

    caught: list[BaseException] = []

    def waiter() -> None:
        try:
            EVENT_LOOP.wait(long())
        except BaseException as exc:  # the interrupt
            caught.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    assert began.wait(5) and t.ident is not None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(t.ident),
                                               ctypes.py_object(Overrun))
    t.join(5)
    assert not t.is_alive() and len(caught) == 1 and isinstance(caught[0], Overrun)
    assert ended.result(timeout=5) == "cancelled"
