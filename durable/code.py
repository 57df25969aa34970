"""Agents as ordinary code: a function, sync or async, whose steps go through a context.

::

    @agent(input_model=CheckoutInput, tools=("charge", "email"))
    def checkout(ctx: RunContext, inp: CheckoutInput) -> dict:
        receipt = ctx.call("charge", {"amount": inp.amount})
        ctx.call("email", {"to": inp.email, "receipt": receipt})
        return receipt

The worker drives a code agent through the same step protocol as a ``decide(state)`` agent
(intent, ledger claim, dispatch with key and deadline, outcome; waits, approvals, cancel,
budgets, ``verify``): the function runs on a thread of its own, and each ``ctx.call`` hands
its call to the worker and blocks until the outcome is in the log.

Recovery re-executes the function from the start. Every step already in the log returns its
recorded outcome without being sent; an open intent is resolved as for any agent (lookup
after its deadline, or sent again at once when the tool is ``effect_free``); the first step
not in the log is recorded and dispatched. Each step's identity — its position, tool and the
digest of its arguments — is checked against the log: a difference quarantines the run with
a ``NondeterminismError``. The function's variables (a conversation, say) are rebuilt by
re-execution: there is no window. So the function must decide the same calls from the same
outcomes: no clock, randomness or I/O outside the context. ``ctx.now()``, ``ctx.time()``,
``ctx.random()`` and ``ctx.uuid()`` are recorded with the next decision (in its intent or
wait event) and return the recorded value when the function is executed again;
``ctx.sleep(s)`` is a durable timer (the run waits ``waiting_timer``, holding no worker, and
the reconciler wakes it).

A worker that keeps holding a run keeps its function running between jobs: the function is
executed again only when the run comes back after a crash, a hand-back, a wait or to
another worker (see ``CodeAgent.park``).

Several steps at once are one decision: ``ctx.parallel([(tool, args), ...])``, or
``asyncio.gather`` of ``ctx.call`` in an ``async def`` agent; steps are numbered in the
order the calls were issued, and recovery finds them in that order. A step taken from
another thread than the function's own is refused (``UsageError``).
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar

import msgspec
from pydantic import BaseModel, ConfigDict

from durable.agents import (
    Agent,
    Call,
    Decision,
    Fail,
    Finish,
    Parallel,
    Wait,
    call_difference,
    call_signature,
    is_placeholder,
    registry,
)
from durable.children import CHILD_POLL_MS
from durable.errors import NondeterminismError, UsageError
from durable.log import events as ev
from durable.log.fold import fold
from durable.log.keys import CHILD_TOOL
from durable.log.state import Action, RunState, WaitInfo
from durable.log.store import EventLog

#: Every action of the run is kept when its history is rebuilt (no window).
_ALL = 1 << 62


class StepFailed(Exception):
    """Raised by ``ctx.call`` when the step failed, was canceled or its approval rejected.
    Not caught, it fails the run with this message."""

    def __init__(self, act: Action) -> None:
        self.step, self.tool, self.status = act.step, act.tool, act.status
        self.error, self.error_type = act.error or act.status, act.error_type
        #: Raised by ``ctx.parallel``: every call's result, a ``StepFailed`` for each failure.
        self.outcomes: list[Any] | None = None
        super().__init__(f"step {act.step} ({act.tool}) {act.status}: {self.error}")


class ChildFailed(StepFailed):
    """Raised by ``ctx.child`` / ``ctx.join`` when the child run did not complete (it
    failed, was canceled or expired): ``child`` is its run id, ``status`` its state."""

    def __init__(self, child: str, state: str, error: str | None) -> None:
        self.child, self.step, self.tool, self.status = child, 0, CHILD_TOOL, state
        self.error, self.error_type = error or state, "ChildFailed"
        self.outcomes = None
        Exception.__init__(self, f"child run {child} {state}: {self.error}")


class ChildRun:
    """A child run started by ``ctx.start_child``: ``ctx.join(child)`` waits for it."""

    def __init__(self, run_id: str, agent: str, detached: bool = False) -> None:
        self.run_id, self.agent, self.detached = run_id, agent, detached

    def __repr__(self) -> str:
        return f"ChildRun({self.run_id!r}, agent={self.agent!r})"


#: How long a parent waits for a child by default before the wait expires (s): a week.
CHILD_TIMEOUT_S = 7 * 86400.0


class WaitExpired(Exception):
    """Raised by ``ctx.wait`` when the wait expired and the agent continues
    (``on_wait_expired = "continue"``)."""


class _Unwind(BaseException):
    """Internal: the worker let go of the run; the function's thread ends."""


_UNWIND = object()


class FreeInput(BaseModel):
    """The input model of a code agent that declares none: any JSON object."""

    model_config = ConfigDict(extra="allow")


class RunContext:
    """What a code agent's function is given: its run, and the steps it may take."""

    def __init__(self, session: _Session) -> None:
        self._session = session

    @property
    def run_id(self) -> str:
        return self._session.run_id

    @property
    def step(self) -> int:
        """Steps taken so far (the next ``call`` is step ``step + 1``)."""
        return self._session.pos

    @property
    def replaying(self) -> bool:
        """True while recorded steps are being returned (recovery); do no side effects
        outside ``call`` either way."""
        return self._session.replaying

    def call(self, tool: str, args: Mapping[str, Any] | None = None) -> Any:
        """Take a step: the tool's result, from the log when it was already recorded.
        Raises ``StepFailed`` when the step failed, was canceled or rejected."""
        return self._session.call(tool, dict(args or {}))

    def parallel(self, calls: Sequence[tuple[str, Mapping[str, Any] | None]], *,
                 return_exceptions: bool = False) -> list[Any]:
        """Take several steps at once: ``[(tool, args), ...]``, each its own step (numbered
        in this order, with its own key, deadline and outcome), all running at the same
        time. Returns their results in order. A failed step raises ``StepFailed`` once all
        have ended (its ``outcomes`` holds every result, a ``StepFailed`` in place of each
        failure); with ``return_exceptions`` the list holds them instead."""
        return self._session.parallel([(t, dict(a or {})) for t, a in calls],
                                      return_exceptions)

    def wait(self, kind: str = "input", reason: str = "", timeout_s: float = 3600.0,
             data: Any = None) -> Any:
        """Wait for input (``durable respond``) or an external event without holding a
        worker; returns the response. Raises ``WaitExpired`` when it expired and the agent
        continues."""
        return self._session.wait(kind, reason, timeout_s, data)

    def start_child(self, agent: str, input: Any = None, *,
                    detached: bool = False) -> ChildRun:
        """Start ``agent`` as a run of its own (a step of this run: started once, however
        often this function is executed again); ``join`` waits for it. A ``detached``
        child is not canceled with this run."""
        got = self._session.call(CHILD_TOOL, _child_args(agent, input, detached))
        return ChildRun(str(got["run_id"]), agent, detached)

    def join(self, child: ChildRun, timeout_s: float = CHILD_TIMEOUT_S) -> Any:
        """Wait, holding no worker, until ``child`` ends: its result, or ``ChildFailed``."""
        return self._session.join(child, timeout_s)

    def child(self, agent: str, input: Any = None, *,
              timeout_s: float = CHILD_TIMEOUT_S) -> Any:
        """Run ``agent`` as a child run and return its result (``start_child``, ``join``)."""
        return self.join(self.start_child(agent, input), timeout_s)

    def sleep(self, seconds: float) -> None:
        """A durable timer: the run waits (``waiting_timer``) holding no worker, and the
        reconciler wakes it once ``seconds`` have passed; a restart of anything loses no
        timer. Executed again, a finished sleep returns at once."""
        self._session.sleep(seconds)

    def sleep_until(self, when: datetime | float) -> None:
        """``sleep`` until ``when`` (an aware datetime, or seconds since the epoch)."""
        self._session.sleep_until(when)

    def now(self) -> datetime:
        """The current time (UTC), recorded: the same value when executed again."""
        return datetime.fromtimestamp(self._session.draw("time", time.time), UTC)

    def time(self) -> float:
        """``time.time()``, recorded: the same value when executed again."""
        return float(self._session.draw("time", time.time))

    def random(self) -> float:
        """``random.random()``, recorded: the same value when executed again."""
        return float(self._session.draw("random", random.random))

    def uuid(self) -> str:
        """A random UUID (version 4) as text, recorded: the same value when executed again."""
        return str(self._session.draw("uuid", lambda: str(uuid.uuid4())))


class AsyncRunContext(RunContext):
    """The context of an ``async def`` agent: ``await ctx.call(...)``.

    Calls awaited together (``asyncio.gather``, tasks) are one parallel decision: each call
    joins a batch, and the batch is handed to the worker once the event loop has run every
    callback ready at that moment, so the calls started together run together, numbered
    in the order they were started."""

    async def call(self, tool: str, args: Mapping[str, Any] | None = None) -> Any:
        return await self._session.batched(tool, dict(args or {}))

    async def parallel(self, calls: Sequence[tuple[str, Mapping[str, Any] | None]], *,  # type: ignore[override]
                       return_exceptions: bool = False) -> list[Any]:
        return self._session.parallel([(t, dict(a or {})) for t, a in calls],
                                      return_exceptions)

    async def wait(self, kind: str = "input", reason: str = "",
                   timeout_s: float = 3600.0, data: Any = None) -> Any:
        return self._session.wait(kind, reason, timeout_s, data)

    async def sleep(self, seconds: float) -> None:  # type: ignore[override]
        self._session.sleep(seconds)

    async def start_child(self, agent: str, input: Any = None, *,  # type: ignore[override]
                          detached: bool = False) -> ChildRun:
        got = await self._session.batched(CHILD_TOOL, _child_args(agent, input, detached))
        return ChildRun(str(got["run_id"]), agent, detached)

    async def join(self, child: ChildRun, timeout_s: float = CHILD_TIMEOUT_S) -> Any:
        return self._session.join(child, timeout_s)

    async def child(self, agent: str, input: Any = None, *,
                    timeout_s: float = CHILD_TIMEOUT_S) -> Any:
        return self._session.join(await self.start_child(agent, input), timeout_s)

    async def sleep_until(self, when: datetime | float) -> None:  # type: ignore[override]
        self._session.sleep_until(when)


class _Session:
    """One execution of a code agent's function, for as long as a worker drives the run."""

    def __init__(self, agent: CodeAgent, run_id: str, actions: dict[int, Action],
                 waits: list[WaitInfo], inp: Any, values: Values | None = None) -> None:
        self.agent, self.run_id = agent, run_id
        self.actions, self.waits, self.input = actions, waits, inp
        self.pos = 0
        self.waits_seen = 0
        #: Values drawn from the context: those the log records, and how many are used.
        self.values = values or Values()
        self.drawn = 0
        #: Values drawn past the recorded ones: they go with the next decision handed out.
        self.fresh: list[list[Any]] = []
        #: The version of the run when the worker last let go of it with this function
        #: alive (``CodeAgent.park``), or None.
        self.parked_at: int | None = None
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        #: The steps handed to the worker and not answered yet.
        self.pending: list[int] = []
        #: Calls of an ``async def`` function waiting to be handed over together.
        self.batch: list[tuple[str, dict[str, Any], asyncio.Future[Any]]] = []
        self.thread = threading.Thread(target=self._main, name=f"agent-{run_id}", daemon=True)
        self.started = False

    @property
    def replaying(self) -> bool:
        return self.pos < max(self.actions, default=0)

    # The function's side --------------------------------------------------------------

    def _main(self) -> None:
        try:
            if inspect.iscoroutinefunction(self.agent.fn):
                value = asyncio.run(self.agent.fn(AsyncRunContext(self), self.input))
            else:
                value = self.agent.fn(RunContext(self), self.input)
            if isinstance(value, BaseModel):
                value = value.model_dump(mode="json")
            self.outbox.put(Finish(value))
        except _Unwind:
            return
        except StepFailed as exc:
            self.outbox.put(Fail(str(exc)[:2000]))
        except BaseException as exc:  # an agent bug or a nondeterminism: the worker decides
            self.outbox.put(exc)

    def call(self, tool: str, args: dict[str, Any]) -> Any:
        self._on_own_thread()
        self.pos += 1
        step = self.pos
        recorded = self.actions.get(step)
        if recorded is not None:
            self._check(recorded, tool, args)
            self._check_drawn(("step", step), f"call {recorded.tool}")
            if recorded.settled:
                return self._outcome(recorded)
        (act,) = self._hand_over([step], Call(tool, args, values=self._take_fresh()))
        return self._outcome(act)

    def parallel(self, calls: list[tuple[str, dict[str, Any]]],
                 return_exceptions: bool) -> list[Any]:
        self._on_own_thread()
        if len(calls) > self.agent.max_parallel:
            raise ValueError(f"{len(calls)} calls at once, the agent's max_parallel is "
                             f"{self.agent.max_parallel}")
        steps = list(range(self.pos + 1, self.pos + 1 + len(calls)))
        self.pos += len(calls)
        recorded = [self.actions.get(step) for step in steps]
        for act, (tool, args) in zip(recorded, calls, strict=True):
            if act is not None:
                self._check(act, tool, args)
        known = [act for act in recorded if act is not None]
        if known and len(known) != len(calls):
            raise NondeterminismError(
                self.run_id, steps[0], f"{len(known)} of these steps", f"{len(calls)} at once",
                "a parallel decision took another number of calls")
        if known:
            self._check_drawn(("step", steps[0]), f"call {known[0].tool}")
        if known and all(act.settled for act in known):
            acts = known
        else:
            acts = self._hand_over(steps, Parallel(
                [Call(t, a) for t, a in calls], steps=steps, values=self._take_fresh()))
        outcomes: list[Any] = []
        for act in acts:
            try:
                outcomes.append(self._outcome(act))
            except StepFailed as exc:
                outcomes.append(exc)
        failed = next((o for o in outcomes if isinstance(o, StepFailed)), None)
        if failed is not None and not return_exceptions:
            failed.outcomes = outcomes
            raise failed
        return outcomes

    async def batched(self, tool: str, args: dict[str, Any]) -> Any:
        """An ``async def`` function's call: joins the batch handed over once the calls
        started together have all joined it (see ``AsyncRunContext``)."""
        self._on_own_thread()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self.batch.append((tool, args, future))
        if len(self.batch) == 1:
            loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        batch, self.batch = self.batch, []
        try:
            if len(batch) == 1:
                tool, args, _ = batch[0]
                results: list[Any] = [self.call(tool, args)]
            else:
                results = self.parallel([(t, a) for t, a, _ in batch], True)
        except BaseException as exc:  # _Unwind, a nondeterminism: every caller gets it
            for *_, future in batch:
                future.set_exception(exc)
            return
        for (*_, future), result in zip(batch, results, strict=True):
            if isinstance(result, StepFailed):
                future.set_exception(result)
            else:
                future.set_result(result)

    def _hand_over(self, steps: list[int], decision: Decision) -> list[Action]:
        """Give ``decision`` to the worker and wait for the outcomes of ``steps``."""
        self.pending = steps
        self.outbox.put(decision)
        answer = self.inbox.get()
        if answer is _UNWIND:
            raise _Unwind
        acts: list[Action] = answer
        for act in acts:
            self.actions[act.step] = act
        return acts

    def _on_own_thread(self) -> None:
        if threading.current_thread() is not self.thread:
            raise UsageError(
                f"run {self.run_id}: a step was taken from another thread than the agent's "
                "own; steps are taken one decision at a time, in order, so that recovery "
                "finds them again: for calls at once use ctx.parallel([...]) (or "
                "asyncio.gather in an async def agent)")

    def wait(self, kind: str, reason: str, timeout_s: float, data: Any) -> Any:
        self.waits_seen += 1
        if self.waits_seen <= len(self.waits):
            done = self.waits[self.waits_seen - 1]
            if done.kind != kind:
                raise NondeterminismError(self.run_id, self.pos, f"wait {done.kind}",
                                          f"wait {kind}")
            self._check_drawn(("wait", self.waits_seen), f"wait {done.kind}")
            if done.outcome == "expired":
                raise WaitExpired(f"{kind} wait expired: {done.reason}")
            return done.response
        self.outbox.put(Wait(kind, reason, timeout_s, data,  # type: ignore[arg-type]
                             values=self._take_fresh()))
        self.inbox.get()  # the worker lets go of the run while it waits: always an unwind
        raise _Unwind

    def join(self, child: ChildRun, timeout_s: float) -> Any:
        expires = int((time.time() + timeout_s) * 1000)
        outcome = self.wait("child", f"child run {child.run_id} ({child.agent})",
                            CHILD_POLL_MS / 1000, {"child": child.run_id, "expires": expires})
        if not isinstance(outcome, dict) or outcome.get("state") != "completed":
            state = outcome.get("state", "?") if isinstance(outcome, dict) else "?"
            error = outcome.get("error") if isinstance(outcome, dict) else None
            raise ChildFailed(child.run_id, str(state), error)
        return outcome.get("result")

    def sleep(self, seconds: float) -> None:
        if not seconds >= 0:
            raise ValueError(f"ctx.sleep takes seconds >= 0, not {seconds!r}")
        self.wait("timer", f"sleep {seconds:g} s", float(seconds), None)

    def sleep_until(self, when: datetime | float) -> None:
        at = when.timestamp() if isinstance(when, datetime) else float(when)
        self.sleep(max(0.0, at - float(self.draw("time", time.time))))

    def draw(self, kind: str, make: Callable[[], Any]) -> Any:
        """A value of ``kind``: the recorded one when the log has it, else a new one,
        recorded with the next decision."""
        self.drawn += 1
        if self.drawn <= len(self.values.drawn):
            was, value = self.values.drawn[self.drawn - 1]
            if was != kind:
                raise NondeterminismError(
                    self.run_id, self.pos + 1, f"ctx.{was}() as value {self.drawn}",
                    f"ctx.{kind}()", "a value of another kind was drawn from the context")
            return value
        value = make()
        self.fresh.append([kind, value])
        return value

    def _take_fresh(self) -> list[list[Any]]:
        fresh, self.fresh = self.fresh, []
        return fresh

    def _check_drawn(self, mark: tuple[str, int], what: str) -> None:
        """Before a recorded step or wait, exactly the values recorded up to it are drawn."""
        expected = self.values.marks.get(mark)
        if expected is not None and expected != self.drawn:
            raise NondeterminismError(
                self.run_id, self.pos, f"{what} after {expected} value(s) drawn from the "
                f"context", f"it after {self.drawn}",
                "ctx.now(), ctx.time(), ctx.random() or ctx.uuid() called another number of "
                "times")

    def _check(self, recorded: Action, tool: str, args: dict[str, Any]) -> None:
        was = call_signature(recorded.tool, recorded.args)
        now = call_signature(tool, args, digest=is_placeholder(recorded.args))
        if was != now:
            raise NondeterminismError(self.run_id, recorded.step, was, now,
                                      call_difference(recorded.tool, recorded.args, tool, args))

    @staticmethod
    def _outcome(act: Action) -> Any:
        if act.status == "succeeded":
            return act.result
        raise StepFailed(act)

    # The worker's side ----------------------------------------------------------------

    def next_decision(self, state: RunState) -> Decision:
        if not self.started:
            self.started = True
            self.thread.start()
        elif self.pending:
            acts = [state.actions.get(step) for step in self.pending]
            if any(act is None or not act.settled for act in acts):
                raise RuntimeError(f"steps {self.pending} of {self.run_id} are not settled")
            self.pending = []
            self.inbox.put(acts)
        while True:
            try:
                item = self.outbox.get(timeout=0.1)  # short: the watchdog can interrupt
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                raise item
            decision: Decision = item
            return decision

    def close(self) -> None:
        self.inbox.put(_UNWIND)


class CodeAgent(Agent):
    """An agent whose steps are taken by ordinary code (``@agent``)."""

    fn: ClassVar[Callable[..., Any]]
    rebuilt: ClassVar[bool] = True

    #: How long a parked function waits for its run to come back to this worker (s).
    PARK_S: ClassVar[float] = 60.0

    def __init__(self) -> None:
        self._sessions: dict[str, _Session] = {}
        self._parked_since: dict[str, float] = {}
        self._log: EventLog | None = None

    def bind(self, log: EventLog) -> None:
        """The worker's log, read to rebuild a run's history on recovery."""
        self._log = log

    def decide(self, state: RunState) -> Decision:
        session = self._sessions.get(state.run_id)
        if session is None:
            session = self._sessions[state.run_id] = self._session(state)
        return session.next_decision(state)

    def close_run(self, run_id: str) -> None:
        self._parked_since.pop(run_id, None)
        session = self._sessions.pop(run_id, None)
        if session is not None:
            session.close()

    def park(self, run_id: str, version: int) -> None:
        """The worker lets go of ``run_id`` at a job boundary (its turn used up) with the
        log at ``version``: keep the function alive, blocked where it is, so that the next
        job on this worker goes on from there instead of executing it again."""
        session = self._sessions.get(run_id)
        if session is not None:
            session.parked_at = version
            self._parked_since[run_id] = time.monotonic()

    def resume(self, run_id: str, version: int) -> bool:
        """A job of ``run_id`` starts with the log at ``version``: True when its parked
        function goes on (nothing was written since it was parked); else the function, if
        any, is ended and will be executed again from the log."""
        now = time.monotonic()
        for stale in [r for r, t in self._parked_since.items() if now - t > self.PARK_S]:
            self.close_run(stale)
        session = self._sessions.get(run_id)
        if session is not None and session.parked_at == version:
            session.parked_at = None
            self._parked_since.pop(run_id, None)
            return True
        self.close_run(run_id)
        return False

    def _session(self, state: RunState) -> _Session:
        actions: dict[int, Action] = {}
        waits: list[WaitInfo] = []
        values = Values()
        if self._log is not None:
            events = [e.event for e in self._log.read(state.run_id) if e.event is not None]
            full = fold(events, window=_ALL)
            actions = full.actions
            waits = _waits(events)
            values = Values.of(events)
        for step, act in state.actions.items():  # newer than the log: staged outcomes
            actions[step] = msgspec.structs.replace(act)
        if self._log is not None:  # results kept beside the run, read back whole
            self._log.resolve(state.run_id, actions.values())
        inp = self.input_model.model_validate(state.input or {})
        return _Session(self, state.run_id, actions, waits, inp, values)


#: The waits a code agent's function makes itself (``ctx.wait``, ``ctx.sleep``,
#: ``ctx.join``).
CODE_WAITS = ("input", "external", "timer", "child")


def _child_args(agent: str, input: Any, detached: bool) -> dict[str, Any]:
    args: dict[str, Any] = {"agent": agent, "input": input}
    if detached:
        args["detached"] = True
    return args


class Values:
    """The values a run's function drew from its context, as the log records them: in the
    order drawn (``[kind, value]``), and how many were drawn before each recorded step
    (``("step", n)``) and each wait of the function (``("wait", i)``, counted from 1)."""

    def __init__(self) -> None:
        self.drawn: list[list[Any]] = []
        self.marks: dict[tuple[str, int], int] = {}

    @classmethod
    def of(cls, events: list[Any]) -> Values:
        found = cls()
        waits = 0
        for e in events:
            if isinstance(e, ev.StepDecided):
                found.drawn.extend(e.values)
                found.marks[("step", e.step)] = len(found.drawn)
            elif isinstance(e, ev.WaitEntered) and e.kind in CODE_WAITS:
                waits += 1
                found.drawn.extend(e.values)
                found.marks[("wait", waits)] = len(found.drawn)
        return found


def _waits(events: list[Any]) -> list[WaitInfo]:
    """The waits of a run's function, in order, with how each ended."""
    waits: list[WaitInfo] = []
    for e in events:
        if isinstance(e, ev.WaitEntered) and e.kind in CODE_WAITS:
            waits.append(WaitInfo(kind=e.kind, reason=e.reason, request=e.request))
        elif isinstance(e, ev.WaitResolved) and waits and waits[-1].request == e.request:
            waits[-1].response, waits[-1].outcome = e.response, "resolved"
        elif isinstance(e, ev.WaitExpired) and waits and waits[-1].request == e.request:
            waits[-1].outcome = "expired"
    return [w for w in waits if w.outcome]


def agent(name: str | None = None, *, input_model: type[BaseModel] = FreeInput,
          tools: tuple[str, ...] = (), version: str = "1",
          budgets: Mapping[str, int] | None = None,
          **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a function as a code agent: ``fn(ctx, input)``, sync or ``async def``.

    ``name`` defaults to the function's name; ``options`` are ``Agent`` class attributes
    (``on_version_change``, ``on_wait_expired``...). Returns the function unchanged, with
    the registered agent as its ``agent`` attribute.
    """

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        cls = type(f"{fn.__name__}_agent", (CodeAgent,), {
            "name": name or fn.__name__, "input_model": input_model, "tools": tuple(tools),
            "version": version, "budgets": dict(budgets or {}), "fn": staticmethod(fn),
            **options})
        instance = cls()
        registry.add_agent(instance)
        fn.agent = instance  # type: ignore[attr-defined]
        return fn

    return wrap
