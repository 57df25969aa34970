"""One error tree for the whole library, its processes and its integrations.

A class is defined in this module unless the diagram names it with its module: those live
beside the code that raises them. Private classes (``_Name``) are left out of the diagram
and kept in the tree all the same; ``tests/test_errors.py`` imports every module of the
installed packages and fails when this diagram and the classes differ in any way.

::

    DurableError
     ├── UsageError              bad input from a caller: refused before anything is written
     │    ├── UnknownAgent        neither imported here nor published by a worker
     │    ├── UnknownTool
     │    ├── InvalidInput
     │    ├── PayloadTooLarge
     │    ├── RunIdConflict       a start reusing a run id with another agent or input
     │    └── SessionBusy         a start in a session whose latest run has not ended
     ├── RunNotFound
     ├── ScheduleNotFound
     ├── ConflictError           a stale writer: the expected version moved on
     ├── RunContended            an operator action refused by other writers N times over
     ├── LeaseLost               this worker's fencing epoch is no longer the lease's
     │    └── RegionFenced        this process's region does not own the run's shard now
     ├── RegionError             a takeover refused (the old primary still answers...)
     ├── DecodeError             a log entry that cannot be read (the run is quarantined)
     │    └── ChainBroken         a log entry that does not chain: changed, removed, added
     │                            or moved, or the log rewritten before a seal
     ├── NondeterminismError     the agent decided differently from the recorded intent
     │    └── durable.audit.offline.SavedRunDiverged
     │                           a saved run replayed offline: the code takes another step
     ├── ForbiddenJob            an RQ job naming a function that is not a command handler
     ├── Refused                 an operator action the run's state or policy does not allow
     ├── BadCancelMessage        a published cancel that is malformed or forged (ignored)
     ├── ReplicationTimeout      fewer replicas than DURABLE_MIN_REPLICAS confirmed an append
     ├── SealError               a sealed (encrypted) field that this process cannot open
     ├── TooManyPendingRuns      a start refused: DURABLE_MAX_PENDING_RUNS runs are pending
     ├── RateLimited             raised by a tool: the provider refused the call (a 429),
     │                           nothing was applied; the step waits ``retry_after_s``
     ├── WriteRefused            internal: why ``append.lua`` refused a batch; callers react
     │    ├── Terminal           the run reached a terminal state before this write
     │    │    └── Tampered       the log ends with an entry the append script did not
     │    │                       write, or does not chain where a seal was to be made:
     │    │                       the run was quarantined instead
     │    ├── CancelPending      a dispatch refused because a cancel is pending
     │    └── Claimed            the ledger already holds the key the batch claims
     ├── durable.agents.steps.OutcomeUnknown
     │                           raised by a tool: its effect was sent, the reply lost
     │                           (recorded unknown, resolved by lookup)
     ├── durable.code.steps.StepFailed
     │    │                      raised in a code agent: its step failed, was canceled or
     │    │                      rejected
     │    ├── durable.code.steps.ChildFailed
     │    │                      its child run did not complete
     │    ├── durable.integrations.langgraph.run.GraphRunFailed
     │    │                      the run ends failed with LangGraph's own outcome (a
     │    │                      recursion limit, an invalid update, a node's error once
     │    │                      its RetryPolicy gave up): never retried
     │    └── durable.integrations.openai_agents.run.AgentRunFailed
     │                           the run ends failed with the SDK's own outcome (a guardrail,
     │                           max turns): never retried, never quarantined
     ├── durable.code.steps.WaitExpired
     │                           raised in a code agent: its wait expired, it continues
     ├── durable.code.steps.EndRun
     │                           raised by a code agent: end the run failed or canceled
     │                           with this decision, not as an agent bug
     ├── durable.model_http.ModelUnavailable
     │                           the built-in model step: no answer (retryable)
     ├── durable.model_http.ModelError
     │                           the built-in model step: refused for good
     ├── durable.conversations.ConversationMissing
     │                           the run a run continues kept no conversation
     ├── durable.controls.schedules.Unreadable
     │                           a stored schedule that cannot be decoded, or whose
     │                           expression is not valid
     ├── durable.integrations.pydantic_ai.backend.Rejected
     │                           a pydantic-ai tool call whose approval was rejected (told to
     │                           the model as a denied call)
     ├── durable.integrations.mcp.McpToolError
     │                           an MCP server answered a call with an error
     ├── durable.console.auth.LoginRequired
     │                           a console page needs a user (answered with a redirect)
     ├── durable.a2a.discovery.NoCard
     │                           no agent card to serve at an address (answered 404/400)
     └── durable.security.callers.NotAllowed
                                 a front door caller's right credentials (``durable mcp``,
                                 ``durable a2a``), of a user whose role may not call
                                 (answered 403)

    Signal                       stops code the library runs (see ``Signal``): a
     │                           ``BaseException``, so ``except Exception`` lets it pass
     ├── durable.agents.cancel_token.Cancelled
     │    │                      a cancel reached the tool (its token was checked)
     │    └── durable.agents.cancel_token.Overrun
     │                           the call ran past its deadline or its cancel's grace
     ├── durable.code.execution.Unwind
     │                           the worker let go of a code agent's run
     ├── durable.eventloop.LoopBlocked
     │                           an agent's task blocked the event loop past its limit
     ├── durable.workers.turns.Abandoned
     │                           agent code overran its time; its slot was given back
     └── durable.workers.calls.CallAbandoned
                                 a stuck call returned after its run was given up

    UnsafeRedis                  (warning category) persistence could lose acknowledged events
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

import redis


class DurableError(Exception):
    """Base of every error this library raises on purpose."""


class UsageError(DurableError):
    """A caller's input is wrong; nothing was written."""


class UnknownAgent(UsageError):
    def __init__(self, name: str, known: list[str], why: str = "") -> None:
        self.name = name
        self.known = known
        super().__init__(f"unknown agent {name!r}{': ' + why if why else ''} "
                         f"(known: {', '.join(known) or 'none'})")


class UnknownTool(UsageError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"unknown tool {name!r}")


class InvalidInput(UsageError):
    def __init__(self, agent: str, message: str) -> None:
        self.agent = agent
        self.message = message
        super().__init__(f"invalid input for agent {agent!r}: {message}")


class PayloadTooLarge(UsageError):
    def __init__(self, what: str, size: int, limit: int) -> None:
        self.what, self.size, self.limit = what, size, limit
        super().__init__(f"{what} is {size} bytes, over the limit of {limit}")


class RunIdConflict(UsageError):
    """A start with the id of an existing run but another agent or input: refused, since
    returning the existing run would silently drop the caller's input."""

    def __init__(self, run_id: str, detail: str) -> None:
        self.run_id, self.detail = run_id, detail
        super().__init__(f"run {run_id!r} already exists with {detail}: choose another run "
                         "id, or start again with the same input to get the existing run")


class SessionBusy(UsageError):
    """A start in a named session whose latest run has not ended (``durable.controls.sessions``):
    refused, nothing written, so that two turns never continue one conversation at once."""

    def __init__(self, session: str, tenant: str, run_id: str, state: str) -> None:
        self.session, self.tenant, self.run_id, self.state = session, tenant, run_id, state
        of = f" of tenant {tenant!r}" if tenant else ""
        super().__init__(f"session {session!r}{of} has a run in progress: {run_id!r} is "
                         f"{state}; start the next turn when it has ended (nothing was "
                         "written)")


class RunNotFound(DurableError):
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run {run_id!r}")


class ScheduleNotFound(DurableError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"no schedule {name!r}")


class ConflictError(DurableError):
    def __init__(self, run_id: str, expected: int, actual: int) -> None:
        self.run_id, self.expected, self.actual = run_id, expected, actual
        super().__init__(f"run {run_id}: expected version {expected}, found {actual}")


class RunContended(DurableError):
    """An optimistic update (``durable.contention.update_run``) found, ``attempts`` times
    in a row, that another writer had appended first. Nothing of this call was written."""

    def __init__(self, run_id: str, attempts: int) -> None:
        self.run_id, self.attempts = run_id, attempts
        super().__init__(f"run {run_id}: {attempts} attempts each found the log moved on by "
                         "another writer; nothing was written, try again")


class LeaseLost(DurableError):
    def __init__(self, run_id: str, epoch: int) -> None:
        self.run_id, self.epoch = run_id, epoch
        super().__init__(f"run {run_id}: lease epoch {epoch} is no longer held")


class RegionFenced(LeaseLost):
    def __init__(self, run_id: str, region: str, owner: str, epoch: int, state: str) -> None:
        self.region, self.owner, self.state = region, owner, state
        DurableError.__init__(
            self, f"run {run_id}: region {region!r} may not advance it (region {owner!r} "
            f"owns it at epoch {epoch}, {state}); nothing written")
        self.run_id, self.epoch = run_id, epoch


class RegionError(DurableError):
    """A ``durable region`` command that could not be carried out; nothing was written."""


class DecodeError(DurableError):
    def __init__(self, entry_id: str, reason: str) -> None:
        self.entry_id, self.reason = entry_id, reason
        super().__init__(f"entry {entry_id}: {reason}")


class ChainBroken(DecodeError):
    """The run's log does not chain at ``entry_id`` (``durable.log.chain``), ``reason``
    says how: found by a load or by the check before a seal; the run is quarantined and
    never sealed."""

    @property
    def quarantine_reason(self) -> str:
        return f"the log does not chain: {self.reason}"


class NondeterminismError(DurableError):
    """Agent code executed again took another step than the log records. ``detail`` says
    what differs (the tool, which arguments)."""

    HINT = ("agent code must take the same steps from the same outcomes: clocks, randomness "
            "and I/O outside the run's context are the usual cause (ctx.now(), ctx.random() "
            "and ctx.uuid() are recorded; I/O belongs in a tool), and changed agent code "
            "needs a new agent version")

    def __init__(self, run_id: str, step: int, recorded: str, decided: str,
                 detail: str = "") -> None:
        self.run_id, self.step, self.recorded, self.decided = run_id, step, recorded, decided
        self.detail = detail
        differs = f" ({detail})" if detail else ""
        super().__init__(
            f"run {run_id} step {step}: the log records {_clip(recorded)}, the agent now "
            f"decides {_clip(decided)}{differs}; {self.HINT}"
        )


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class ForbiddenJob(DurableError):
    def __init__(self, func_name: str) -> None:
        self.func_name = func_name
        super().__init__(f"refused job naming {func_name!r}: not a durable command handler")


class Refused(DurableError):
    """An approval or response that is not allowed (wrong role, expired, not waiting)."""

    def __init__(self, run_id: str, reason: str) -> None:
        self.run_id, self.reason = run_id, reason
        super().__init__(f"run {run_id}: {reason}")


class BadCancelMessage(DurableError):
    """A published cancel hint that cannot be used; it changes nothing and is counted."""

    def __init__(self, kind: str, detail: str) -> None:
        self.kind = kind  # "malformed", "forged", "stale" (too old) or "replayed"
        self.detail = detail
        super().__init__(f"{kind} cancel message: {detail}")


class ReplicationTimeout(DurableError, redis.exceptions.ConnectionError):  # type: ignore[misc]
    """Fewer replicas than ``DURABLE_MIN_REPLICAS`` confirmed an append in time: it is not
    acknowledged (it may still be on the master). A redis ``ConnectionError`` too, so processes
    treat it as the Redis fault it is: they wait, reload the run and go on."""

    def __init__(self, run_id: str, confirmed: int, wanted: int, timeout_ms: int) -> None:
        self.run_id, self.confirmed, self.wanted = run_id, confirmed, wanted
        self.timeout_ms = timeout_ms
        super().__init__(f"run {run_id}: append confirmed by {confirmed} of "
                         f"{wanted} replicas within {timeout_ms} ms (DURABLE_MIN_REPLICAS)")


class WriteRefused(DurableError):
    """Internal: ``append.lua`` refused a batch for a reason the caller handles."""


class Terminal(WriteRefused):
    """The run reached a terminal state before this write."""

    def __init__(self, state: str) -> None:
        self.state = state
        super().__init__(state)


class Tampered(Terminal):
    """The log ends with ``entry_id``, which the append script did not write (a raw
    ``XADD``): the batch was refused and the run quarantined. A ``Terminal`` for its
    writer: it must stop driving the run."""

    def __init__(self, run_id: str, entry_id: str, reason: str = "") -> None:
        self.run_id, self.entry_id = run_id, entry_id
        super().__init__("quarantined")
        why = reason or (f"the log ends with entry {entry_id}, which the append script did "
                         "not write")
        self.args = (f"run {run_id}: {why}; the run is quarantined",)


class CancelPending(WriteRefused):
    """A dispatch was refused because a cancel is pending."""


class Claimed(WriteRefused):
    """The ledger already holds ``key``: never send its effect blindly."""

    def __init__(self, key: str, value: str) -> None:
        self.key, self.value = key, value
        super().__init__(f"{key} already claimed: {value}")


class Signal(BaseException):
    """Base of the library's signals: what it raises to stop code it runs, not to report a
    failure (a cancel reaching a tool, a worker letting go of a run, agent code that overran
    its time). A signal must unwind through agent and tool code up to the worker that raised
    it, and that code is free to write ``except Exception:`` around anything it calls: so a
    signal is a ``BaseException``, as ``KeyboardInterrupt`` and ``SystemExit`` are, never an
    ``Exception`` (and never a ``DurableError``, which callers catch).

    Code that catches ``BaseException`` (to clean up, or to log) must raise a signal again;
    ``isinstance(exc, Signal)`` tells it apart from an error."""


class UnsafeRedis(UserWarning):
    """Emitted when the server's settings could lose acknowledged events."""


class SealError(DurableError):
    """A sensitive field sealed with key ``kid`` could not be opened here
    (``durable.security.sealing``): the key is not held, or the envelope was altered."""

    def __init__(self, kid: str, reason: str) -> None:
        self.kid = kid
        self.reason = reason
        super().__init__(f"sealed field (key {kid!r}): {reason}")


class TooManyPendingRuns(DurableError):
    """``DURABLE_MAX_PENDING_RUNS`` runs are pending already: a new run is refused, nothing
    is written."""

    def __init__(self, pending: int, limit: int) -> None:
        self.pending = pending
        self.limit = limit
        super().__init__(f"{pending} runs are pending, the limit is {limit} "
                         "(DURABLE_MAX_PENDING_RUNS): start it later or add workers")


class RateLimited(DurableError):
    """Raised by a tool whose provider refused the call for its rate (HTTP 429): nothing
    was applied. The step is sent again (same key) after ``retry_after_s`` (the
    provider's ``Retry-After``); it is not one of the tool's failures, and the limits the
    call holds (``durable.flow.limits``) lower their rate for the whole fleet."""

    def __init__(self, retry_after_s: float = 1.0, detail: str = "") -> None:
        self.retry_after_s = max(float(retry_after_s), 0.0)
        self.detail = detail
        super().__init__(f"rate limited, retry after {self.retry_after_s:g} s"
                         + (f": {detail}" if detail else ""))


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it holds, nearest first: the members of an exception group, and
    each one's ``__cause__`` and ``__context__``; each exception once. A framework wraps
    the error that matters (a step that failed, a connection that closed) in groups and
    chains of its own; this is where to look for it."""
    seen: set[int] = set()
    todo = collections.deque([exc])
    while todo:
        cur = todo.popleft()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        yield cur
        if isinstance(cur, BaseExceptionGroup):
            todo.extend(cur.exceptions)
        todo.extend(e for e in (cur.__cause__, cur.__context__) if e is not None)
