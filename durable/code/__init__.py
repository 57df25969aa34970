"""Agents as ordinary code: a function, sync or async, whose steps go through a context.

::

    @agent(input_model=CheckoutInput, tools=("charge", "email"))
    def checkout(ctx: RunContext, inp: CheckoutInput) -> dict:
        receipt = ctx.call("charge", {"amount": inp.amount})
        ctx.call("email", {"to": inp.email, "receipt": receipt})
        return receipt

The worker drives a code agent through the same step protocol as a ``decide(state)`` agent
(intent, ledger claim, dispatch with key and deadline, outcome; waits, approvals, cancel,
budgets, ``verify``): a plain function runs on a thread of its own, and each ``ctx.call``
hands its call to the worker and blocks until the outcome is in the log; an ``async def``
function is a task on the process's event loop (``durable.eventloop``), with no thread of
its own, and each ``await ctx.call`` hands its call over and awaits the outcome.

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

This module is the code agents' public surface (``agent``, ``RunContext``,
``AsyncRunContext``, ``CodeAgent``); the package also holds one execution of a function
(``execution``: a plain one on a thread of its own; ``async_execution``: an ``async def``
one on the event loop) and what the log records of it (``history``: values drawn, waits).
"""

from __future__ import annotations

import inspect
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from durable import clock
from durable.agents import (
    Agent,
    Decision,
    registry,
)
from durable.call_identity import is_placeholder
from durable.code.async_execution import AsyncSession
from durable.code.execution import Session
from durable.code.history import History, needs_history, read_history
from durable.code.output import FunctionOutput, publisher_of
from durable.code.steps import (
    CHILD_TIMEOUT_S,
    ChildFailed,
    ChildRun,
    EndRun,
    StepFailed,
    WaitExpired,
)
from durable.eventloop import Handoff
from durable.log.keys import CHILD_TOOL
from durable.log.state import Action, RunState
from durable.log.store import EventLog
from durable.streams.partials import Publisher

__all__ = ["AsyncRunContext", "ChildFailed", "ChildRun", "CodeAgent", "EndRun", "FreeInput",
           "RunContext", "StepFailed", "WaitExpired", "agent"]


class FreeInput(BaseModel):
    """The input model of a code agent that declares none: any JSON object."""

    model_config = ConfigDict(extra="allow")


class RunContext:
    """What a code agent's function is given: its run, and the steps it may take."""

    def __init__(self, session: Session) -> None:
        self._session = session

    @property
    def run_id(self) -> str:
        return self._session.run_id

    @property
    def step(self) -> int:
        """Steps taken so far (the next ``call`` is step ``step + 1``)."""
        return self._session.pos

    @property
    def continues(self) -> str:
        """The run whose conversation this one continues ("" for none): the one given as
        ``continue_from``, or the latest run of its session (``durable.controls.sessions``)."""
        return self._session.continues

    @property
    def session_name(self) -> str:
        """The named session this run is a turn of ("" for none)."""
        return self._session.session_name

    @property
    def overrides(self) -> Mapping[str, str]:
        """What a counterfactual fork runs with instead of the configuration it was forked
        from (``durable fork --set prompt=v2``: ``{"prompt": "v2"}``); {} otherwise. Read
        it where the agent picks its model, prompt or tools; the built-in ``chat`` step
        takes ``model`` from it."""
        return self._session.overrides

    @property
    def replaying(self) -> bool:
        """True while recorded steps are being returned (recovery); do no side effects
        outside ``call`` either way."""
        return self._session.replaying

    def decided(self, step: int) -> bool:
        """Whether an earlier execution of the function decided ``step`` (the log holds its
        intent): an integration's events that precede a call (pydantic-ai's tool-call event)
        were reported then, before the call was decided."""
        return step in self._session.actions

    def recorded_digest(self, step: int) -> str | None:
        """The digest the log keeps of ``step``'s arguments (a tool that keeps them out of
        it: ``log_args = "digest"``), else None. An integration that digests a step's
        arguments itself, incrementally (``durable.call_identity.given_digest``), takes
        them again the whole way where its digest differs from the recorded one."""
        act = self._session.actions.get(step)
        return str(act.args["_digest"]) if act is not None and is_placeholder(act.args) \
            else None

    def went_past(self, step: int) -> bool:
        """Whether an earlier execution of the function was given ``step``'s outcome and
        went on: the log holds the outcome and a step decided after it (not with it, in
        one parallel group). An integration does not report such a call's events again;
        those of the last step before a crash it reports again (they may not have been)."""
        actions = self._session.actions
        act = actions.get(step)
        if act is None or not act.settled:
            return False
        group = act.group or act.step
        return any(m > step and (later.group or later.step) != group
                   for m, later in actions.items())

    def recorded(self, step: int) -> tuple[str, Any, Any] | None:
        """The tool, arguments and result of ``step`` when an earlier execution of the
        function took it and it succeeded, else ``None``: what an integration reads to
        give back a unit of work it recorded (a LangGraph node's update) without
        executing it again (``skip_recorded``)."""
        act = self._session.actions.get(step)
        if act is None or act.status != "succeeded":
            return None
        return act.tool, act.args, act.result

    def recorded_steps(self) -> Mapping[int, Action]:
        """Every step the log holds of this run, by number, as it holds it (settled or
        not): what an integration that finds its recorded steps by their identity rather
        than by their position reads (LangGraph's: a step is named by the task that takes
        it, and concurrent tasks take theirs in any order). Read-only."""
        return MappingProxyType(self._session.actions)

    def skip_recorded(self, through: int) -> None:
        """Go past the steps after the current one up to ``through`` without taking them:
        each must be settled in the log (``UsageError`` otherwise), and the caller must
        give back what they recorded as the function would have got it, since their
        identities are not checked. No step may be in flight."""
        self._session.skip_through(through)

    def emit(self, data: Any) -> None:
        """Partial output of the function itself (not of a step) for whoever follows the
        run (``Client.follow``): published as output of the step it takes next, attempt 0;
        never logged, best-effort (``durable.code.output``). ``data``: JSON data."""
        self._session.output.emit(self._session.pos + 1, data)

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

    def start_child(self, agent: str, input: Any = None, *, detached: bool = False,
                    share_budgets: bool = False) -> ChildRun:
        """Start ``agent`` as a run of its own (a step of this run: started once, however
        often this function is executed again); ``join`` waits for it. A ``detached``
        child is not canceled with this run. ``share_budgets``: the child's model calls
        and tokens are capped by what this run has left and count in this run's budgets
        once it ends (see the guide's "Child runs")."""
        got = self._session.call(CHILD_TOOL, _child_args(agent, input, detached,
                                                         share_budgets))
        return ChildRun(str(got["run_id"]), agent, detached)

    def join(self, child: ChildRun, timeout_s: float = CHILD_TIMEOUT_S) -> Any:
        """Wait, holding no worker, until ``child`` ends: its result, or ``ChildFailed``."""
        return self._session.join(child, timeout_s)

    def child(self, agent: str, input: Any = None, *, timeout_s: float = CHILD_TIMEOUT_S,
              share_budgets: bool = False) -> Any:
        """Run ``agent`` as a child run and return its result (``start_child``, ``join``)."""
        return self.join(self.start_child(agent, input, share_budgets=share_budgets),
                         timeout_s)

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
        return datetime.fromtimestamp(self._session.draw("time", clock.time), UTC)

    def time(self) -> float:
        """``time.time()``, recorded: the same value when executed again."""
        return float(self._session.draw("time", clock.time))

    def random(self) -> float:
        """``random.random()``, recorded: the same value when executed again."""
        return float(self._session.draw("random", random.random))

    def uuid(self) -> str:
        """A random UUID (version 4) as text, recorded: the same value when executed again."""
        return str(self._session.draw("uuid", lambda: str(uuid.uuid4())))

    def value(self, kind: str, make: Callable[[], Any]) -> Any:
        """``make()``, recorded as a value of ``kind``: the same when executed again."""
        return self._session.draw(kind, make)


class AsyncRunContext(RunContext):
    """The context of an ``async def`` agent: ``await ctx.call(...)``.

    Calls awaited together (``asyncio.gather``, tasks) are one parallel decision: each call
    joins a batch, and the batch is handed to the worker once the event loop has run every
    callback ready at that moment, so the calls started together run together, numbered
    in the order they were started."""

    _session: AsyncSession

    async def call(self, tool: str, args: Mapping[str, Any] | None = None) -> Any:
        return await self._session.batched(tool, dict(args or {}))

    async def parallel(self, calls: Sequence[tuple[str, Mapping[str, Any] | None]], *,  # type: ignore[override]
                       return_exceptions: bool = False) -> list[Any]:
        return await self._session.parallel_async([(t, dict(a or {})) for t, a in calls],
                                                  return_exceptions)

    async def wait(self, kind: str = "input", reason: str = "",
                   timeout_s: float = 3600.0, data: Any = None) -> Any:
        return await self._session.wait_async(kind, reason, timeout_s, data)

    async def sleep(self, seconds: float) -> None:  # type: ignore[override]
        await self._session.sleep_async(seconds)

    async def start_child(self, agent: str, input: Any = None, *,  # type: ignore[override]
                          detached: bool = False, share_budgets: bool = False) -> ChildRun:
        got = await self._session.batched(CHILD_TOOL, _child_args(agent, input, detached,
                                                                  share_budgets))
        return ChildRun(str(got["run_id"]), agent, detached)

    async def join(self, child: ChildRun, timeout_s: float = CHILD_TIMEOUT_S) -> Any:
        return await self._session.join_async(child, timeout_s)

    async def child(self, agent: str, input: Any = None, *,
                    timeout_s: float = CHILD_TIMEOUT_S, share_budgets: bool = False) -> Any:
        return await self._session.join_async(
            await self.start_child(agent, input, share_budgets=share_budgets), timeout_s)

    async def sleep_until(self, when: datetime | float) -> None:  # type: ignore[override]
        await self._session.sleep_until_async(when)


class CodeAgent(Agent):
    """An agent whose steps are taken by ordinary code (``@agent``)."""

    fn: ClassVar[Callable[..., Any]]
    rebuilt: ClassVar[bool] = True

    #: How long a parked function waits for its run to come back to this worker (s).
    PARK_S: ClassVar[float] = 60.0

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._parked_since: dict[str, float] = {}
        self._log: EventLog | None = None
        self._publisher: Publisher | None = None

    def bind(self, log: EventLog) -> None:
        """The worker's log, read to rebuild a run's history on recovery (its Redis carries
        the functions' own partial output, ``RunContext.emit``)."""
        if log is not self._log:
            self._log, self._publisher = log, None

    @property
    def is_async(self) -> bool:
        """Whether the function is ``async def``: a task on the process's event loop."""
        return inspect.iscoroutinefunction(self.fn)

    def decide(self, state: RunState) -> Decision:
        return self.open_session(state).next_decision(state)

    def open_session(self, state: RunState) -> Session:
        """The run's execution of the function, made (its history read from the log) when
        there is none."""
        session = self._sessions.get(state.run_id)
        if session is None:
            session = self._sessions[state.run_id] = self._session(state)
        return session

    def has_session(self, run_id: str) -> bool:
        return run_id in self._sessions

    @staticmethod
    def needs_history(state: RunState) -> bool:
        """Whether making a session for ``state`` reads the run's log
        (``durable.code.history.needs_history``)."""
        return needs_history(state)

    def decide_soon(self, state: RunState) -> Handoff[Any]:
        """The function's next decision, without blocking: the hand-off is settled with it
        (or what the function raised: ``decision_of``) on the event loop's thread for an
        ``async def`` function, on the function's own thread for a plain one. Its session
        is made by ``open_session`` first (that reads the log)."""
        return self.open_session(state).begin(state)

    def dry_run(self, state: RunState, timeout_s: float = 10.0,
                history: History | None = None) -> tuple[Decision, int]:
        """Execute the function against ``state``'s log without a worker: (the decision it
        takes past what the log records, the steps it had taken by then); raises what the
        function raises, ``NondeterminismError`` among it (``durable deploy check``).
        ``history``: the log's steps, waits and values read elsewhere (a saved run's file,
        ``durable.audit.offline``) instead of from the bound log."""
        session = self._session(state, history)
        return session.first_decision(timeout_s), session.pos

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

    def _session(self, state: RunState, history: History | None = None) -> Session:
        actions, waits, values = history or read_history(self._log, state)
        inp = self.input_model.model_validate(state.input or {})
        if self.is_async:
            session: Session = AsyncSession(self, state.run_id, actions, waits, inp, values,
                                            context=AsyncRunContext)
        else:
            session = Session(self, state.run_id, actions, waits, inp, values,
                              context=RunContext)
        session.continues, session.session_name = state.continue_from, state.session
        session.overrides = dict(state.overrides)
        if self._log is not None and self._publisher is None:
            self._publisher = publisher_of(self._log)
        session.output = FunctionOutput(self._publisher, state.run_id)
        return session


def _child_args(agent: str, input: Any, detached: bool,
                share_budgets: bool = False) -> dict[str, Any]:
    args: dict[str, Any] = {"agent": agent, "input": input}
    if detached:
        args["detached"] = True
    if share_budgets:
        args["share_budgets"] = True
    return args


def agent(name: str | None = None, *, input_model: type[BaseModel] = FreeInput,
          tools: tuple[str, ...] = (), version: str = "1",
          budgets: Mapping[str, float] | None = None,
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
