"""Calling a tool once: its deadline, quick retries for the errors it names, and the
events that record what the call observed.

The call runs on the thread that makes it, watched by the worker's ``CallWatch``
(``workers.calls``): a deadline or a cancel stops it even when the tool itself does not.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import tenacity

from durable import costs
from durable.agents import OutcomeUnknown, Tool, ToolContext, resolve_awaitable
from durable.agents.cancel_token import Cancelled, CancelToken, Overrun
from durable.errors import DurableError, RateLimited
from durable.eventloop import EVENT_LOOP, Handoff
from durable.log import events as ev
from durable.log.state import Action, EvidenceRef
from durable.log.store import Spec, now_ms
from durable.settings import Settings
from durable.streams.streaming import Publisher

from .calls import CallResult, CallWatch

#: A tool's effect as the dispatcher calls it: ``tool.run`` or a compensation.
Effect = Callable[[dict[str, Any], ToolContext], Any]

#: How much later than an ``async`` tool's own deadline the watcher interrupts it.
ASYNC_MARGIN_S = 0.05


class _Retryable(DurableError):
    """Internal: carries a call that raised one of its tool's retryable errors (never leaves
    ``Dispatcher``: each retry loop that raises it takes it back)."""

    def __init__(self, result: CallResult) -> None:
        self.result = result
        super().__init__(repr(result.error))


class _StopWhen(tenacity.stop.stop_base):
    """Stop retrying when a condition holds (the deadline is near, or a cancel came)."""

    def __init__(self, condition: Callable[[], bool]) -> None:
        self.condition = condition

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self.condition()


def _pause(token: CancelToken, seconds: float) -> None:
    token.wait(max(seconds, 0.0))  # a cancel ends the pause early


class Dispatcher:
    """Calls tools for every run of a worker, each on the thread that asks; one
    ``CallWatch`` stops calls past their deadline or their cancel's grace."""

    def __init__(self, grace_ms: int, max_payload_bytes: int,
                 publisher: Publisher | None = None,
                 on_stuck: Callable[[int], object] = lambda tid: None) -> None:
        self.grace_ms = grace_ms
        #: The inline limit: a larger result is kept whole beside the run, or fails its
        #: step past the ceiling -- the log decides when it stages the outcome
        #: (``durable.log.blobs``), so the reconciler's lookups are held to it too.
        self.max_payload_bytes = max_payload_bytes
        #: Where a call's ``ctx.emit`` goes (the run's stream channel); None: nowhere.
        self.publisher = publisher
        self.watch = CallWatch(on_stuck)
        #: Tool name -> (the tool, whether its ``run`` is ``async def``): asked per call.
        self._async: dict[str, tuple[Tool, bool]] = {}
        #: The built-in model step's API (``DURABLE_MODEL_BASE_URL``): its provider, priced.
        self.model_base_url = ""

    @classmethod
    def of(cls, settings: Settings, on_stuck: Callable[[int], object] = lambda tid: None
           ) -> Dispatcher:
        """The dispatcher of a worker with ``settings``."""
        made = cls(settings.cancel.grace_ms, settings.payloads.max_payload_bytes,
                   on_stuck=on_stuck)
        made.model_base_url = settings.models.base_url
        return made

    def is_async(self, tool: Tool) -> bool:
        """Whether ``tool.run`` is ``async def``: its calls are tasks on the event loop."""
        known = self._async.get(tool.name)
        if known is None or known[0] is not tool:
            known = self._async[tool.name] = (tool, inspect.iscoroutinefunction(tool.run))
        return known[1]

    def dispatch(self, run_id: str, tool: Tool, act: Action, token: CancelToken,
                 args: Any = None, effect: Effect | None = None) -> list[Spec]:
        """Call the tool once (quick retries for its named retryable errors) with ``args``
        (the recorded ones by default). Raises ``CallAbandoned`` when the call got stuck and
        the worker gave its run up. ``effect``: what is called instead of ``tool.run`` (a
        compensation, ``workers.compensation``)."""
        ctx = ToolContext(run_id=run_id, step=act.step, key=act.key, deadline_ms=act.deadline,
                          token=token, attempt=act.attempts)
        output = None
        if self.publisher is not None:
            ctx.publish = output = self.publisher.for_call(run_id, act.step, act.attempts)
        try:
            return self._dispatch(tool, act, token, ctx, args, effect or tool.run)
        finally:
            if output is not None:
                output.close()  # the step in flight is over: its partial output is not kept

    def _dispatch(self, tool: Tool, act: Action, token: CancelToken, ctx: ToolContext,
                  args: Any, effect: Effect) -> list[Spec]:
        args = dict((act.args if args is None else args) or {})
        grace = self.grace_ms / 1000

        # An async tool stops itself at its deadline (its task is cancelled); the watcher
        # is its backstop, a moment later.
        margin = ASYNC_MARGIN_S if self.is_async(tool) else 0.0

        def attempt() -> CallResult:
            ctx.refs.clear()  # what a failed attempt recorded is not the result's
            left = ctx.remaining()
            result = self.watch.call(lambda: resolve_awaitable(effect(args, ctx), token,
                                                               left),
                                     left + margin, token, grace)
            if result.outcome == "raised" and isinstance(result.error, tool.retryable):
                raise _Retryable(result)
            return result

        if not tool.retryable or tool.max_quick_retries <= 0:  # nothing to retry here
            try:
                return self._outcome(tool, act, token, attempt(), args, ctx.refs)
            except _Retryable as once:
                return self._outcome(tool, act, token, once.result, args, ctx.refs)
        # Quick retries, for the tool's named retryable errors only, within the deadline.
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Retryable),
            stop=tenacity.stop_after_attempt(tool.max_quick_retries + 1)
            | _StopWhen(lambda: ctx.remaining() < 0.1 or token.cancelled),
            wait=tenacity.wait_exponential(multiplier=0.05, max=1.0),
            sleep=lambda seconds: _pause(token, min(seconds, ctx.remaining() / 2)),
            reraise=True,
        )
        try:
            result = retrying(attempt)
        except _Retryable as spent:
            result = spent.result
        return self._outcome(tool, act, token, result, args, ctx.refs)

    def dispatch_soon(self, run_id: str, tool: Tool, act: Action, token: CancelToken,
                      args: Any = None) -> Handoff[list[Spec]]:
        """``dispatch`` for an ``async def`` tool, as a task on the process's event loop:
        the future is resolved with the events its call observed; nothing blocks. Its
        deadline and a cancel stop it where it awaits (its task is cancelled at once)."""
        ctx = ToolContext(run_id=run_id, step=act.step, key=act.key, deadline_ms=act.deadline,
                          token=token, attempt=act.attempts)
        output = None
        if self.publisher is not None:
            ctx.publish = output = self.publisher.for_call(run_id, act.step, act.attempts)

        async def call() -> list[Spec]:
            try:
                return await self._dispatch_async(tool, act, token, ctx, args)
            finally:
                if output is not None:
                    output.close()

        return EVENT_LOOP.submit(call(), name=f"tool:{tool.name}:{run_id}")

    async def _dispatch_async(self, tool: Tool, act: Action, token: CancelToken,
                              ctx: ToolContext, args: Any) -> list[Spec]:
        args = dict((act.args if args is None else args) or {})

        grace = None if tool.cancellable else self.grace_ms / 1000

        async def attempt() -> CallResult:
            ctx.refs.clear()
            result = await awaited(tool.run(args, ctx), token, ctx.remaining(), grace)
            if result.outcome == "raised" and isinstance(result.error, tool.retryable):
                raise _Retryable(result)
            return result

        if not tool.retryable or tool.max_quick_retries <= 0:
            try:
                return self._outcome(tool, act, token, await attempt(), args, ctx.refs)
            except _Retryable as once:
                return self._outcome(tool, act, token, once.result, args, ctx.refs)
        retrying = tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception_type(_Retryable),
            stop=tenacity.stop_after_attempt(tool.max_quick_retries + 1)
            | _StopWhen(lambda: ctx.remaining() < 0.1 or token.cancelled),
            wait=tenacity.wait_exponential(multiplier=0.05, max=1.0),
            sleep=lambda seconds: asyncio.sleep(max(min(seconds, ctx.remaining() / 2), 0.0)),
            reraise=True,
        )
        try:
            result: CallResult = await retrying(attempt)
        except _Retryable as spent:
            result = spent.result
        return self._outcome(tool, act, token, result, args, ctx.refs)

    def _outcome(self, tool: Tool, act: Action, token: CancelToken,
                 result: CallResult, args: Any = None,
                 refs: Sequence[EvidenceRef] = ()) -> list[Spec]:
        """The events that record what one dispatch observed (with a success, the
        evidence references the tool recorded: ``durable.agents.evidence``)."""
        base = {"step": act.step, "key": act.key}
        if result.outcome == "returned":
            try:
                value = _plain(result.value)
            except (TypeError, ValueError) as exc:
                # The effect happened, but what it returned cannot be recorded: the step
                # fails with the reason (never a placeholder passed off as its result).
                return [Spec(ev.ActionFailed, {
                    **base, "error": f"the result is not plain data: {exc}"[:500],
                    "error_type": "TypeError"})]
            more: dict[str, Any] = {"evidence": list(refs)} if refs else {}
            if tool.model:  # what it cost, priced now (durable.costs)
                more["cost"] = costs.price(tool, args, value, self.model_base_url)
            return [Spec(ev.ActionSucceeded, {**base, "result": value, **more})]
        if result.outcome == "timed_out":
            return [Spec(ev.ActionTimedOut, base)]
        if result.outcome == "interrupted":
            return [Spec(ev.ActionInterrupted, {**base, "reason": token.reason
                                                or "did not stop in time"})]
        err = result.error
        if isinstance(err, OutcomeUnknown):
            return [Spec(ev.ActionInterrupted, {**base, "reason": f"outcome unknown: {err}"
                                                [:500]})]
        if isinstance(err, Cancelled):
            if tool.cancellable:
                return [Spec(ev.CallCanceled, {**base, "reason": token.reason
                                               or "canceled"})]
            return [Spec(ev.ActionInterrupted, {**base, "reason": "canceled mid-flight"})]
        assert err is not None
        if isinstance(err, RateLimited):  # refused by the provider: nothing was applied
            return rate_limited(act, err)
        retryable = isinstance(err, tool.retryable)
        fields = {**base, "error": str(err)[:2000] or type(err).__name__,
                  "error_type": type(err).__name__, "retryable": retryable}
        if retryable and act.attempts < tool.attempts_for(args):
            # Longer backoff: the run waits (no worker held), the step keeps its key.
            until = now_ms() + int(tool.retry_delay_s(err, act.attempts) * 1000)
            return [Spec(ev.ActionFailed, {**fields, "retry_at": until}),
                    Spec(ev.WaitEntered, {"kind": "retry", "until": until,
                                          "reason": f"{type(err).__name__}: {err}"[:500],
                                          "request": act.key})]
        return [Spec(ev.ActionFailed, fields)]


async def awaited(call: Any, token: CancelToken, timeout: float,
                  grace: float | None = None) -> CallResult:
    """Await one call of an ``async def`` tool in the running task: cancelled where it
    awaits at ``timeout`` (``timed_out``), and when ``token`` fires: at once for a tool that
    can be cancelled (``Cancelled``), ``grace`` seconds later for one that cannot (None: at
    once), which may finish meanwhile (else ``interrupted``, as a plain tool the worker's
    call watcher stops after the same grace). One timer and one listener per call, no task
    of its own: the worker holds thousands."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    why: list[str] = []

    def stop(reason: str) -> None:
        if not why:
            why.append(reason)
            task.cancel()

    def cancel() -> None:  # the token fires on any thread
        if grace is None:
            loop.call_soon_threadsafe(stop, "cancel")
        else:
            loop.call_soon_threadsafe(loop.call_later, grace, stop, "grace")

    timer = loop.call_later(max(timeout, 0.0), stop, "deadline")
    token.add_listener(cancel)
    try:
        return CallResult("returned", await call)
    except asyncio.CancelledError:
        if not why:  # the call's own task was cancelled from outside: not ours to record
            raise
        task.uncancel()
        if why[0] == "deadline":
            return CallResult("timed_out")
        if why[0] == "grace":
            return CallResult("interrupted")
        return CallResult("raised", error=Cancelled(token.reason or "canceled"))
    except Overrun:
        return CallResult("timed_out")
    except BaseException as exc:  # Cancelled from ctx.check() among them
        return CallResult("raised", error=exc)
    finally:
        why.append("over")  # a stop that comes later cancels nothing
        timer.cancel()
        token.remove_listener(cancel)


def rate_limited(act: Action, err: RateLimited) -> list[Spec]:
    """A call the provider refused for its rate (429): the step waits its Retry-After and
    is sent again with the same key, whatever the tool's own retries (``durable.flow.limits``
    lowers the rate of the limits it held)."""
    until = now_ms() + max(int(err.retry_after_s * 1000), 1)
    return [Spec(ev.ActionFailed, {"step": act.step, "key": act.key, "error": str(err)[:2000],
                                   "error_type": "RateLimited", "retryable": True,
                                   "retry_at": until}),
            Spec(ev.WaitEntered, {"kind": "retry", "until": until, "request": act.key,
                                  "reason": str(err)[:500]})]


def _plain(value: Any) -> Any:
    """A tool's result as plain data (what the log and every reader can decode); raises
    ``TypeError``/``ValueError`` when it is not."""
    return msgspec.json.decode(msgspec.json.encode(value))
