"""Child runs: a run that starts another agent's run and waits for its result.

A child is started by a step of its parent (the built-in tool ``durable.child``), so the
start is recorded like any step; the child's run id derives from the parent's id and that
step (``keys.child_id``), so a parent executed again after a crash starts it once: a second
start of the same id writes nothing. The child's ``run_started`` names its parent and the
step (``parent``, ``parent_step``); the parent's state lists its children.

The parent then waits (``waiting_child``) holding no worker. The child's end wakes it: the
process that writes the child's terminal event resolves the parent's wait right after, in
a second script call on the parent's keys (a child's keys hash to its own shard, so one
call cannot write both; a resolution written twice is a no-op, as any late answer). If
that process dies in between, the reconciler finds the parent's wait due (it checks a
waiting parent every ``CHILD_POLL_MS``) and resolves it then.

A child that is quarantined (its agent raised, its log does not verify) has not ended: it
waits for an operator. Its parent's wait says so: the reconciler, looking at the parent,
applies the parent agent's ``on_child_quarantined`` (``quarantined_child``): ``wait``
(the default) keeps it waiting, its projected reason naming the child and why (``durable
status``, ``durable runs``, the ``durable_runs_blocked_by_child`` gauge); ``fail`` hands the
parent the child's quarantine as a child that did not complete (a code agent's ``join``
raises ``ChildFailed``); ``cancel`` cancels the parent, and with it its live children.

Cancelling a parent cancels its live children (those not started ``detached``): each gets
a cancel request in its own log, then the pub/sub hint, as ``durable cancel`` does.
"""

from __future__ import annotations

import threading
from typing import Any

from durable.agents import Lookup, Tool, ToolContext, register
from durable.client import Client
from durable.contention import InPlace, RedisCalls, update_run_async
from durable.controls.cancellation import finish_specs
from durable.errors import DecodeError, RunNotFound, Terminal
from durable.log import events as ev
from durable.log.batching import drive
from durable.log.keys import BLOCKED_BY_CHILD, CHILD_TOOL, child_id
from durable.log.state import RunState
from durable.log.store import EventLog, RunHandle, Spec, now_ms

#: How often the reconciler looks at a parent waiting for a child (the fallback when the
#: child's end did not wake it): ms.
CHILD_POLL_MS = 5000


class ClientTool(Tool):
    """A built-in tool that acts through this process's client (one for all such tools).
    Effect-free: a call is taken again after a crash, so its lookup is never asked."""

    _client: Any = None
    _lock = threading.Lock()

    @classmethod
    def client(cls) -> Any:
        """This process's client (from its ``DURABLE_*`` settings), made once."""
        with ClientTool._lock:
            if ClientTool._client is None:
                ClientTool._client = Client()
            return ClientTool._client

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()  # never asked: an effect-free call is taken again


@register
class StartChild(ClientTool):
    """The step that starts a child run: ``{"agent", "input", "detached"}`` -> its run id.
    Starting the same derived id again is a no-op, so the step is sent again at once after
    a crash (``effect_free``): nothing is started twice."""

    name = CHILD_TOOL
    timeout_s = 30.0
    effect_free = True

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        run_id = child_id(ctx.run_id, ctx.step)
        client = self.client()
        caps = left_of(client.status(ctx.run_id)) if args.get("share_budgets") else None
        started = client.start(str(args["agent"]), args.get("input"), run_id=run_id,
                               parent=(ctx.run_id, ctx.step), budgets=caps,
                               shared_budgets=caps is not None)
        return {"run_id": started.run_id, "agent": str(args["agent"])}


#: The budgets a child may share with its parent: the steps of each run stay its own (a
#: step number is a position in one log).
SHARED_KINDS = ("model_calls", "tokens")


def left_of(parent: RunState) -> dict[str, int]:
    """What the parent's shared budgets have left: the caps of a child sharing them."""
    used = {"model_calls": parent.model_calls, "tokens": parent.tokens}
    return {kind: max(0, parent.budgets[kind] - used[kind])
            for kind in SHARED_KINDS if kind in parent.budgets}


def outcome_of(state: RunState) -> dict[str, Any]:
    """What a parent is told of its child's end; a child that shares the parent's budgets
    reports its use (its own children's included), which the parent's fold adds to its
    own."""
    out = {"run_id": state.run_id, "state": state.state, "result": state.result,
           "error": state.error or state.reason}
    if state.shared_budgets:
        out["usage"] = {"model_calls": state.model_calls, "tokens": state.tokens}
    return out


def parent_wake(child: RunState, parent: RunState) -> Spec | None:
    """The event that resolves ``parent``'s wait for ``child`` (terminal), or None when
    the parent waits for something else (or no longer waits)."""
    wait = parent.wait
    if wait is None or wait.kind != "child" or not isinstance(wait.data, dict) or \
            wait.data.get("child") != child.run_id:
        return None
    return Spec(ev.WaitResolved, {"kind": "child", "request": wait.request,
                                  "response": outcome_of(child), "by": child.run_id})


#: Conflicting writes a parent's wake-up retries before it gives up (``RunContended``).
WAKE_ATTEMPTS = 10


async def wake_parent_async(io: RedisCalls, elog: EventLog, child: RunState,
                            actor: str) -> str | None:
    """Resolve the wait of ``child``'s parent when it waits for this child and the child
    is terminal. Returns the parent's id when it was woken (it must be made ready); None
    when there was nothing to wake (no parent, gone, unreadable, ended, or waiting for
    something else). Raises ``RunContended`` when other writers kept appending to the
    parent: it was not woken, and the reconciler looks at it again within
    ``CHILD_POLL_MS``."""
    parent = child.parent
    if not (child.terminal and parent and child.parent_step):
        return None

    async def write(handle: RunHandle) -> str | None:
        if (wake := parent_wake(child, handle.state)) is None:
            return None
        try:
            await elog.commit_async(handle, [wake])
        except Terminal:
            return None
        return parent

    try:
        return await update_run_async(io, elog, parent, actor, write, attempts=WAKE_ATTEMPTS)
    except (RunNotFound, DecodeError):
        return None


def wake_parent(elog: EventLog, child: RunState, actor: str) -> str | None:
    """``wake_parent_async`` on this thread."""
    return drive(wake_parent_async(InPlace(elog.redis), elog, child, actor))


async def child_state_async(io: RedisCalls, elog: EventLog, run_id: str) -> RunState | None:
    """The child's folded state, or None when it cannot be read (not started yet)."""
    try:
        return (await io.load(elog, run_id, actor="reader")).state
    except (RunNotFound, DecodeError):
        return None


def child_state(elog: EventLog, run_id: str) -> RunState | None:
    """``child_state_async`` on this thread."""
    return drive(child_state_async(InPlace(elog.redis), elog, run_id))


#: What a parent does when the child it waits for is quarantined (``Agent``'s
#: ``on_child_quarantined``).
CHILD_QUARANTINED_POLICIES = ("wait", "fail", "cancel")


def waited_child(state: RunState) -> str | None:
    """The child ``state`` waits for, if it waits for one."""
    wait = state.wait
    if wait is None or wait.kind != "child" or not isinstance(wait.data, dict):
        return None
    return str(wait.data.get("child") or "") or None


def blocked_reason(child: RunState) -> str:
    """A parent's projected reason while ``child`` (quarantined) blocks it."""
    why = child.reason or "(no reason)"
    return f"{BLOCKED_BY_CHILD} {child.run_id} is quarantined: {why}"[:500]


def blocking_child(elog: EventLog, state: RunState) -> tuple[str, str] | None:
    """(the child, why it is quarantined) when the child ``state`` waits for is
    quarantined; what ``durable status`` shows of a blocked parent."""
    child = waited_child(state)
    proj = elog.projection(child) if child else {}
    if child is None or proj.get("state") != "quarantined":
        return None
    return child, proj.get("reason", "")


def quarantined_child(elog: EventLog, handle: RunHandle, child: RunState, policy: str,
                      actor: str) -> str:
    """Apply ``policy`` to a parent (``handle``, held) whose child ``child`` is quarantined;
    returns what was done: ``waiting`` (its reason written once), ``woken`` (the child's
    quarantine handed to it: make it ready), ``canceled`` (its children are to be asked
    to cancel too)."""
    why = f"child {child.run_id} is quarantined: {child.reason or '(no reason)'}"
    if policy == "fail":
        wake = parent_wake(child, handle.state)
        if wake is not None:
            elog.commit(handle, [wake])
            return "woken"
    elif policy == "cancel":
        ts = now_ms()
        cancel = Spec(ev.CancelRequested, {"reason": why, "scope": "run", "requested_ts": ts,
                                            "by": actor})
        elog.commit(handle, [cancel, *finish_specs(handle.state, why, ts)])
        return "canceled"
    reason = blocked_reason(child)
    if elog.projection(handle.run_id).get("reason") != reason:
        elog.commit(handle, [], extra={"reason": reason})  # shown, counted: no event
    return "waiting"
