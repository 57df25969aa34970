"""``durable diff RUN FORK``: two runs' trajectories side by side, step by step, and where
they part (a counterfactual fork against its parent, or any two runs).

Each step shows, for each run, the call (tool and arguments; a model request by its
digest), what became of it (succeeded, failed, held, ...), its result, whether it was sent
(a reused or simulated outcome was not), and its tokens. The first divergence is the first
step whose call or outcome differs, or that one run took and the other did not. The totals
count steps, model calls, tokens, calls sent, effects sent (calls sent that are neither a
model request nor a read, ``effect_free``, of a tool this process has), effects held,
reused and simulated; a fork's inherited prefix (its parent's
steps, copied) counts as steps, not as sent by the fork.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from durable.agents import Registry, registry
from durable.call_identity import call_signature, given_digest, is_placeholder
from durable.log import events as ev
from durable.log.fold import fold
from durable.log.state import Action
from durable.log.store import EventLog

#: Every action is kept (no window).
ALL = 1 << 62


@dataclass
class Side:
    """One run's step."""

    tool: str
    call: str
    status: str
    result: Any = None
    sent: bool = False
    reused: str = ""
    simulated: bool = False
    held: bool = False
    tokens: int = 0
    model: bool = False
    #: A model request or a declared read (the tool's ``effect_free``, when this process
    #: has the tool; a tool it does not know counts as an effect).
    effect_free: bool = False
    #: A fork's step copied from its parent's log (the prefix it was forked with).
    inherited: bool = False

    def outcome(self) -> str:
        if self.held:
            return "held"
        if self.reused:
            return f"{self.status} (reused)"
        return f"{self.status} (simulated)" if self.simulated else self.status


@dataclass
class Trajectory:
    run_id: str
    state: str
    steps: dict[int, Side] = field(default_factory=dict)

    def totals(self) -> dict[str, int]:
        sides = self.steps.values()
        return {"steps": len(self.steps),
                "model_calls": sum(1 for s in sides if s.model),
                "tokens": sum(s.tokens for s in sides),
                "sent": sum(1 for s in sides if s.sent and not s.inherited),
                "effects_sent": sum(1 for s in sides if s.sent and not s.effect_free
                                    and not s.inherited),
                "held": sum(1 for s in sides if s.held),
                "reused": sum(1 for s in sides if s.reused),
                "simulated": sum(1 for s in sides if s.simulated)}


@dataclass
class Diff:
    a: Trajectory
    b: Trajectory
    #: The first step that differs (0: none).
    first: int
    rows: list[dict[str, Any]]


def trajectory_of(elog: EventLog, run_id: str, tools: Registry = registry) -> Trajectory:
    events = [e.event for e in elog.read(run_id) if e.event is not None]
    state = fold(events, window=ALL)
    sent, reused, simulated, tokens = set(), {}, set(), {}
    held_requests: set[str] = set()
    request_step: dict[str, int] = {}
    decided_seq: dict[int, int] = {}
    forked = bool(events) and isinstance(events[0], ev.RunStarted) and \
        bool(events[0].forked_at)
    # A fork's prefix is written by one commit that ends with a checkpoint.
    prefix = next((e.seq for e in events if isinstance(e, ev.Checkpoint)), 0) if forked else 0
    for e in events:
        if isinstance(e, ev.StepDecided):
            decided_seq[e.step] = e.seq
        elif isinstance(e, ev.ActionDispatched):
            sent.add(e.step)
        elif isinstance(e, ev.ActionSucceeded):
            tokens[e.step] = e.tokens
            if e.reused:
                reused[e.step] = e.reused
            if e.simulated:
                simulated.add(e.step)
        elif isinstance(e, ev.ApprovalRequested):
            request_step[e.request] = e.step
        elif isinstance(e, ev.WaitEntered) and isinstance(e.data, dict) and \
                e.data.get("held"):
            held_requests.add(e.request)
    held = {request_step[r] for r in held_requests if r in request_step}
    out = Trajectory(run_id, state.state)
    for step, act in sorted(state.actions.items()):
        out.steps[step] = Side(act.tool, _call(act), act.status, act.result, step in sent,
                               reused.get(step, ""), step in simulated,
                               step in held and not act.settled and step not in sent,
                               tokens.get(step, 0), act.model,
                               act.model or (act.tool in tools.tools
                                             and tools.tools[act.tool].effect_free),
                               decided_seq.get(step, prefix + 1) <= prefix)
    return out


def _call(act: Action) -> str:
    by_digest = is_placeholder(act.args) or given_digest(act.args) is not None
    return call_signature(act.tool, act.args, digest=by_digest).removeprefix("call ")


def _same(x: Side | None, y: Side | None) -> bool:
    if x is None or y is None:
        return x is y
    return x.call == y.call and x.outcome().split(" ")[0] == y.outcome().split(" ")[0] and \
        _encoded(x.result) == _encoded(y.result) and x.held == y.held


def _encoded(value: Any) -> bytes:
    try:
        return msgspec.json.encode(value, order="sorted")
    except (TypeError, msgspec.EncodeError):
        return repr(value).encode()


def diff(elog: EventLog, run_a: str, run_b: str, tools: Registry = registry) -> Diff:
    """``run_a`` against ``run_b``, step by step; ``tools`` tell effects from reads."""
    a, b = trajectory_of(elog, run_a, tools), trajectory_of(elog, run_b, tools)
    rows: list[dict[str, Any]] = []
    first = 0
    for step in sorted(set(a.steps) | set(b.steps)):
        x, y = a.steps.get(step), b.steps.get(step)
        same = _same(x, y)
        if not same and not first:
            first = step
        rows.append({"step": step, "same": same,
                     "a": _side(x), "b": _side(y)})
    return Diff(a, b, first, rows)


def _side(side: Side | None) -> dict[str, Any] | None:
    if side is None:
        return None
    return {"tool": side.tool, "call": side.call, "outcome": side.outcome(),
            "result": side.result, "sent": side.sent, "reused": side.reused,
            "simulated": side.simulated, "held": side.held, "tokens": side.tokens,
            "inherited": side.inherited}
