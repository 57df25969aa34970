"""One execution of an ``async def`` code agent's function: a task on the process's event
loop (``durable.eventloop``), with no thread of its own.

Each step the function takes is handed to the worker as a decision (a future the worker
is called back on: ``begin``), and the function awaits the step's outcome (an asyncio
future the worker resolves from its own thread). The checks against the log (replay,
nondeterminism, values drawn, waits) are ``Session``'s, shared with plain functions.

Calls awaited together (``asyncio.gather``, tasks) are one parallel decision: each call
joins a batch, handed over once the loop has run every callback ready at that moment.

The function may end while a step it handed over is still in flight: it stopped awaiting
it (``asyncio.wait_for``), or its task was cancelled by code the step runs (a framework's
own cancel of the run it belongs to, such as pydantic-ai's ``RunContext.cancel()`` in a
tool). What it returned or raised then is kept (``early``) and handed over with the step's
outcome, at the worker's next ``begin``: the worker asks for nothing while the step runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from datetime import datetime
from typing import Any

from durable.agents import Decision
from durable.code.execution import (
    CURRENT,
    UNWIND,
    Session,
    Unwind,
)
from durable.code.steps import (
    ChildRun,
    StepFailed,
    finished,
    join_wait,
    joined,
    raised,
    sleep_wait,
)
from durable.errors import UsageError
from durable.eventloop import AGENT_TASK, EVENT_LOOP, Handoff, LoopBlocked
from durable.log.state import Action, RunState


class AsyncSession(Session):
    """``Session`` for an ``async def`` function (see the module doc)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        #: Calls waiting to be handed over together.
        self.batch: list[tuple[str, dict[str, Any], asyncio.Future[Any]]] = []
        #: The worker's side of the decision asked for: resolved by the function.
        self.decided: Handoff[Any] | None = None
        #: The function's side of the step handed over: resolved by the worker.
        self.answer: asyncio.Future[Any] | None = None
        self.task: asyncio.Task[Any] | None = None
        self.closed = False
        #: What the function ended with while the worker was not asking (a step in flight):
        #: handed over at the next ``begin``.
        self.early: list[Any] = []

    # The function's side (on the loop) -------------------------------------------------

    async def _amain(self) -> None:
        CURRENT.set(self)
        self.task = asyncio.current_task()
        if self.closed:
            return
        try:
            self._deliver(finished(await self.agent.fn(self.context(self), self.input)))
        except (Unwind, asyncio.CancelledError):
            return
        except LoopBlocked:
            self._deliver(UsageError(
                f"run {self.run_id}: the agent blocked the event loop of async agents past "
                f"{EVENT_LOOP.block_limit_s:g} s (time.sleep or a blocking call in an async "
                "def function: await asyncio.sleep, an async client, or asyncio.to_thread)"))
        except BaseException as exc:
            self._deliver(raised(exc))

    def _deliver(self, item: Any) -> None:
        """Give the worker what the function decided (or raised); kept for the next
        ``begin`` when the worker is not asking (it runs a step the function handed over)."""
        wanted = self.decided
        if wanted is None or (wanted.done() and not wanted.cancelled()):
            self.early.append(item)
            return
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # abandoned
            wanted.set_result(item)

    async def _hand_over_async(self, steps: list[int], decision: Decision) -> list[Action]:
        self.pending = steps
        answer = self.answer = asyncio.get_running_loop().create_future()
        self._deliver(decision)
        self.blocked = True
        try:
            got = await answer
        finally:
            self.blocked = False
            self.answer = None
        return self._kept(got)

    async def parallel_async(self, calls: list[tuple[str, dict[str, Any]]],
                             return_exceptions: bool) -> list[Any]:
        self._on_own_thread()
        got = self._plan_parallel(calls)
        acts = got if isinstance(got, list) else await self._hand_over_async(*got)
        return self._gathered(acts, return_exceptions)

    async def batched(self, tool: str, args: dict[str, Any]) -> Any:
        """A call that joins the batch handed over once the calls started together have
        all joined it (``asyncio.gather``)."""
        self._on_own_thread()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self.batch.append((tool, args, future))
        if len(self.batch) == 1:
            loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        batch, self.batch = self.batch, []
        asyncio.get_running_loop().create_task(self._send(batch),
                                               name=f"{AGENT_TASK}{self.run_id}")

    async def _send(self, batch: list[tuple[str, dict[str, Any], asyncio.Future[Any]]]
                    ) -> None:
        try:
            if len(batch) == 1:
                tool, args, _ = batch[0]
                got = self._plan_call(tool, args)
                acts = [got] if isinstance(got, Action) else await self._hand_over_async(*got)
            else:
                many = self._plan_parallel([(t, a) for t, a, _ in batch])
                acts = many if isinstance(many, list) else await self._hand_over_async(*many)
            results = self._gathered(acts, True)
        except BaseException as exc:  # Unwind, a nondeterminism: every caller gets it
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (*_, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, StepFailed):
                future.set_exception(result)
            else:
                future.set_result(result)

    async def wait_async(self, kind: str, reason: str, timeout_s: float, data: Any) -> Any:
        recorded, got = self._plan_wait(kind, reason, timeout_s, data)
        if recorded:
            return got
        await self._hand_over_async([], got)  # the worker lets go while it waits: an unwind
        raise Unwind

    async def join_async(self, child: ChildRun, timeout_s: float) -> Any:
        return joined(child, await self.wait_async(*join_wait(child, timeout_s)))

    async def sleep_async(self, seconds: float) -> None:
        await self.wait_async(*sleep_wait(seconds))

    async def sleep_until_async(self, when: datetime | float) -> None:
        await self.sleep_async(self.seconds_until(when))

    # The worker's side (any thread) --------------------------------------------------------

    def begin(self, state: RunState | None) -> Handoff[Any]:
        """Ask for the function's next decision: the future is resolved with it (or with
        what the function raised) on the loop's thread; nothing blocks meanwhile."""
        wanted: Handoff[Any] = Handoff()
        self.decided = wanted
        if not self.started:
            self.started = True
            EVENT_LOOP.spawn(self._amain(), name=f"{AGENT_TASK}{self.run_id}")
        elif self.pending:
            assert state is not None
            EVENT_LOOP.call_soon(self._reply, self._answered(state))
        return wanted

    def _reply(self, answer: Any) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_result(answer)
        if self.early:  # the function ended while the step ran: that is its decision
            self._deliver(self.early.pop())

    def close(self) -> None:
        """End the function: at the step it waits on (``Unwind``), else where it awaits
        (its task is cancelled)."""
        self.closed = True
        if self.started:
            EVENT_LOOP.call_soon(self._unwind)

    def _unwind(self) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_result(UNWIND)
        elif self.task is not None and not self.task.done():
            self.task.cancel()
