"""One execution of a code agent's function, for as long as a worker drives its run: a
plain function runs on a thread of its own (an ``async def`` one is a task on the process's
event loop: ``durable.code.async_execution``); each step it takes is handed to the worker as a
decision (the worker asks with ``begin``; the function's thread settles it, ``_deliver``)
and it blocks until the step's outcome comes back (``inbox``); values it draws from its
context and the waits it makes are checked against what the log records (``Values``,
``waits_of``: ``durable.code.history``). The context the function is given is
``durable.code``'s."""

from __future__ import annotations

import concurrent.futures
import contextvars
import ctypes
import queue
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

from durable import clock
from durable.agents import (
    Call,
    Decision,
    Parallel,
    Wait,
)
from durable.call_identity import call_difference, call_signature, given_digest, is_placeholder
from durable.code.history import Values
from durable.code.output import FunctionOutput
from durable.code.steps import (
    ChildRun,
    StepFailed,
    WaitExpired,
    decision_of,
    finished,
    join_wait,
    joined,
    raised,
    sleep_wait,
)
from durable.errors import NondeterminismError, Signal, UsageError
from durable.eventloop import Handoff
from durable.log.state import Action, RunState, WaitInfo


class AgentCode(Protocol):
    """What a session needs of its agent (``durable.code.CodeAgent``, which makes the
    sessions): the function, and the most calls one parallel step may make."""

    @property
    def fn(self) -> Callable[..., Any]: ...

    @property
    def max_parallel(self) -> int: ...


class Unwind(Signal):
    """Internal: the worker let go of the run; the function's thread ends."""


UNWIND = object()

#: What a step hands over: the steps it waits for, and the decision.
Handing = tuple[list[int], Decision]

#: The session whose function runs in the current context (a thread's, or a task's).
CURRENT: contextvars.ContextVar[Session | None] = contextvars.ContextVar(
    "durable_session", default=None)


class Session:
    """One execution of a code agent's function, for as long as a worker drives the run."""

    #: The run it continues and the named session it is a turn of (``RunContext``).
    continues: str = ""
    session_name: str = ""
    #: A counterfactual fork's changed configuration (``RunContext.overrides``).
    overrides: Mapping[str, str] = {}

    def __init__(self, agent: AgentCode, run_id: str, actions: dict[int, Action],
                 waits: list[WaitInfo], inp: Any, values: Values | None = None, *,
                 context: Callable[[Session], Any]) -> None:
        self.agent, self.run_id = agent, run_id
        #: Makes the context the function is given (``RunContext``, ``AsyncRunContext``).
        self.context = context
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
        #: The worker's ask for the next decision (``begin``): settled by the function's
        #: thread with what it hands over (``_deliver``).
        self.decided: Handoff[Any] | None = None
        #: The steps handed to the worker and not answered yet.
        self.pending: list[int] = []
        #: The function's own thread, made when it starts (an ``async def`` function has
        #: none: ``AsyncSession`` runs it on the event loop).
        self.thread: threading.Thread | None = None
        self.started = False
        #: True while the function waits for the worker's answer to a decision.
        self.blocked = False
        #: The function's own partial output (``RunContext.emit``); nowhere until its agent
        #: gives it its log's.
        self.output = FunctionOutput(None, run_id)

    @property
    def replaying(self) -> bool:
        return self.pos < max(self.actions, default=0)

    # The function's side --------------------------------------------------------------

    def _main(self) -> None:
        CURRENT.set(self)
        try:
            self._deliver(finished(self.agent.fn(self.context(self), self.input)))
        except Unwind:
            return
        except BaseException as exc:
            self._deliver(raised(exc))

    def call(self, tool: str, args: dict[str, Any]) -> Any:
        self._on_own_thread()
        got = self._plan_call(tool, args)
        if isinstance(got, Action):
            return self._outcome(got)
        (act,) = self._hand_over(*got)
        return self._outcome(act)

    def skip_through(self, through: int) -> None:
        """Go past the steps after the current one up to ``through``, each settled in the
        log, without taking them (``RunContext.skip_recorded``)."""
        self._on_own_thread()
        if self.blocked or getattr(self, "batch", None):
            raise UsageError(f"run {self.run_id}: steps cannot be skipped while a step is "
                             "being taken")
        for step in range(self.pos + 1, through + 1):
            act = self.actions.get(step)
            if act is None or not act.settled:
                raise UsageError(f"run {self.run_id}: step {step} is not settled in the "
                                 "log; only recorded steps can be skipped")
        self.pos = max(self.pos, through)

    def _plan_call(self, tool: str, args: dict[str, Any]) -> Action | Handing:
        """The recorded outcome of the next step when the log has it settled, else the
        decision to hand over for it."""
        self.pos += 1
        step = self.pos
        recorded = self.actions.get(step)
        if recorded is not None:
            self._check(recorded, tool, args)
            self._check_drawn(("step", step), f"call {recorded.tool}")
            if recorded.settled:
                return recorded
        return [step], Call(tool, args, values=self._take_fresh())

    def parallel(self, calls: list[tuple[str, dict[str, Any]]],
                 return_exceptions: bool) -> list[Any]:
        self._on_own_thread()
        got = self._plan_parallel(calls)
        acts = got if isinstance(got, list) else self._hand_over(*got)
        return self._gathered(acts, return_exceptions)

    def _plan_parallel(self, calls: list[tuple[str, dict[str, Any]]]
                       ) -> list[Action] | Handing:
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
            return known
        return steps, Parallel([Call(t, a) for t, a in calls], steps=steps,
                               values=self._take_fresh())

    def _gathered(self, acts: list[Action], return_exceptions: bool) -> list[Any]:
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

    def _hand_over(self, steps: list[int], decision: Decision) -> list[Action]:
        """Give ``decision`` to the worker and wait for the outcomes of ``steps``."""
        self.pending = steps
        self._deliver(decision)
        return self._kept(self._answer())

    def _kept(self, answer: Any) -> list[Action]:
        """The outcomes the worker answered a decision with, recorded as the function's
        (``Unwind`` when it answered that the function must end instead)."""
        if answer is UNWIND:
            raise Unwind
        acts: list[Action] = answer
        for act in acts:
            self.actions[act.step] = act
        return acts

    def _on_own_thread(self) -> None:
        if CURRENT.get() is not self:
            raise UsageError(
                f"run {self.run_id}: a step was taken from another thread than the agent's "
                "own; steps are taken one decision at a time, in order, so that recovery "
                "finds them again: for calls at once use ctx.parallel([...]) (or "
                "asyncio.gather in an async def agent)")

    def wait(self, kind: str, reason: str, timeout_s: float, data: Any) -> Any:
        recorded, got = self._plan_wait(kind, reason, timeout_s, data)
        if recorded:
            return got
        self._deliver(got)
        self._answer()  # the worker lets go of the run while it waits: always an unwind
        raise Unwind

    def _plan_wait(self, kind: str, reason: str, timeout_s: float,
                   data: Any) -> tuple[bool, Any]:
        """(True, the response) when the log has this wait ended, else (False, the
        ``Wait`` to hand over); raises ``WaitExpired`` for a wait that expired."""
        self.waits_seen += 1
        if self.waits_seen <= len(self.waits):
            done = self.waits[self.waits_seen - 1]
            if done.kind != kind:
                raise NondeterminismError(self.run_id, self.pos, f"wait {done.kind}",
                                          f"wait {kind}")
            self._check_drawn(("wait", self.waits_seen), f"wait {done.kind}")
            if done.outcome == "expired":
                raise WaitExpired(f"{kind} wait expired: {done.reason}")
            return True, done.response
        return False, Wait(kind, reason, timeout_s, data,  # type: ignore[arg-type]
                           values=self._take_fresh())

    def join(self, child: ChildRun, timeout_s: float) -> Any:
        return joined(child, self.wait(*join_wait(child, timeout_s)))

    def sleep(self, seconds: float) -> None:
        self.wait(*sleep_wait(seconds))

    def sleep_until(self, when: datetime | float) -> None:
        self.sleep(self.seconds_until(when))

    def seconds_until(self, when: datetime | float) -> float:
        at = when.timestamp() if isinstance(when, datetime) else float(when)
        return max(0.0, at - float(self.draw("time", clock.time)))

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
        by_digest = is_placeholder(recorded.args) or given_digest(args) is not None
        was = call_signature(recorded.tool, recorded.args, digest=by_digest)
        now = call_signature(tool, args, digest=by_digest)
        if was != now:
            raise NondeterminismError(self.run_id, recorded.step, was, now,
                                      call_difference(recorded.tool, recorded.args, tool, args))

    @staticmethod
    def _outcome(act: Action) -> Any:
        if act.status == "succeeded":
            return act.result
        raise StepFailed(act)

    # The worker's side ----------------------------------------------------------------

    def begin(self, state: RunState | None) -> Handoff[Any]:
        """Ask for the function's next decision: the hand-off is settled with it (or with
        what the function raised: ``decision_of``) on the function's thread, once it takes
        its next step; nothing blocks meanwhile. ``state`` answers the steps handed over."""
        wanted: Handoff[Any] = Handoff()
        self.decided = wanted  # before the function is woken: it settles this one
        if not self.started:
            self._start_thread()
        elif self.pending:
            assert state is not None
            self.inbox.put(self._answered(state))
        return wanted

    def _deliver(self, item: Any) -> None:
        """On the function's thread: hand ``item`` (a decision, or what it raised) over."""
        wanted, self.decided = self.decided, None
        if wanted is None:
            if isinstance(item, BaseException) and not isinstance(item, Exception):
                return  # an interrupt (the watchdog's) that landed after the decision went
            raise RuntimeError(f"run {self.run_id}: a decision with nobody asking for it")
        wanted.set_result(item)

    def next_decision(self, state: RunState) -> Decision:
        """The function's next decision, waited for on this thread (a run thread's, RQ's),
        in short waits: the watchdog can interrupt this thread."""
        wanted = self.begin(state)
        while True:
            try:
                return decision_of(wanted.result(timeout=0.1))
            except concurrent.futures.TimeoutError:
                continue

    def _start_thread(self) -> None:
        self.started = True
        self.thread = threading.Thread(target=self._main, name=f"agent-{self.run_id}",
                                       daemon=True)
        self.thread.start()

    def _answered(self, state: RunState) -> list[Action]:
        """The outcomes of the steps handed over, now in ``state``."""
        acts = [state.actions.get(step) for step in self.pending]
        if any(act is None or not act.settled for act in acts):
            raise RuntimeError(f"steps {self.pending} of {self.run_id} are not settled")
        self.pending = []
        return acts  # type: ignore[return-value]

    def _answer(self) -> Any:
        """Block until the worker answers the decision just handed over."""
        self.blocked = True
        try:
            return self.inbox.get()
        finally:
            self.blocked = False

    def close(self) -> None:
        """End the function: it is told at the step it waits on, or, when it runs code of
        its own (a loop that takes no step, past its quarantine), interrupted where it is
        (``Unwind``, a ``BaseException``), as the watchdog interrupts a ``decide()``."""
        self.inbox.put(UNWIND)
        thread = self.thread
        ident = thread.ident if thread is not None else None
        if self.started and not self.blocked and thread is not None and thread.is_alive() \
                and ident is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident),
                                                       ctypes.py_object(Unwind))

    def first_decision(self, timeout_s: float) -> Decision:
        """Execute the function from the start, off any worker: the first decision it hands
        over (its next step past what the log records), or what it raises. Nothing is sent:
        the function is ended right after (``close``)."""
        wanted = self.begin(None)
        try:
            item = wanted.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"did not reach its next step within {timeout_s:g} s") from None
        finally:
            self.close()
        return decision_of(item)
