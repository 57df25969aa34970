"""Forks: a new run whose history is a prefix of another's, and counterfactual forks that
run from step N under a changed configuration with every new effect held.

``fork(elog, run, at, new)`` copies the entries of ``run`` up to ``at`` (an entry id, or a
step number: the entries before that step's intent) into a new run, which a worker then
drives on from there with new keys. A counterfactual fork (``durable fork RUN --at N --set
prompt=v2 --hold-effects``) records in its ``run_started`` what it changes (``overrides``:
the agent reads them, ``state.overrides`` or ``RunContext.overrides``; the built-in ``chat``
step takes ``model`` from them) and that it holds effects. Then, for each call it takes
(``choice``, applied by the worker):

- a model request or a read (an effect-free step) is sent, unless ``reuse_replies`` and the
  parent recorded the same request (same digest): its reply is reused;
- an effect identical to the parent's at the same step (tool and arguments) reuses the
  parent's recorded outcome, nothing sent (``ActionSucceeded.reused`` names the parent's
  key);
- any other effect is **held**: never dispatched. A tool that ``simulates`` answers it with
  ``simulate(args)`` (``ActionSucceeded.simulated``) and the fork goes on; else the fork
  stops there, waiting for an operator's release: an approval request for the step (its
  wait's data names the tool and the arguments it would send), decided and signed as any
  approval (``durable approve FORK --request ID``). A released effect then goes out as any
  approved call does: claimed in the ledger, dispatched once, looked up after a crash.
  Starting a child run is held the same way (its effects would not be).

A parallel decision in a held fork goes on when each of its calls is reused, simulated or
effect-free (sent); one that would be held quarantines the fork, nothing sent: a release is
of one call, and the calls of a group go out together.
"""

from __future__ import annotations

import re
from typing import Any

from durable.agents import Tool
from durable.call_identity import call_signature, given_digest, is_placeholder
from durable.errors import DecodeError, RunNotFound, UsageError
from durable.log import blobs, context, keys
from durable.log import events as ev
from durable.log.fold import fold
from durable.log.state import Action, BlobRef, RunState
from durable.log.store import Entry, EventLog, RunHandle, Spec

#: An ``--at`` of up to this many digits is a step number, not an entry id (whose
#: milliseconds have 13).
STEP_DIGITS = 9
#: Every action is kept when the parent's log is folded for a fork (no window).
ALL = 1 << 62
_SET = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]{0,63})=(.*)$", re.S)


def parse_sets(items: list[str]) -> dict[str, str]:
    """``["model=gpt-x", "prompt=v2"]`` as ``{name: value}``; a malformed one is a
    ``UsageError`` naming it."""
    found: dict[str, str] = {}
    for item in items:
        match = _SET.match(item)
        if match is None or not match.group(2):
            raise UsageError(f"--set {item!r}: expected NAME=VALUE (e.g. prompt=v2)")
        found[match.group(1)] = match.group(2)
    return found


def is_step(at: str) -> bool:
    return at.isdigit() and len(at) <= STEP_DIGITS


def prefix_end(elog: EventLog, run_id: str, at: str) -> str:
    """The last entry id of the prefix a fork ``at`` inherits: ``at`` itself, or for a step
    number N the entry before N's intent (before its group's, for a parallel step)."""
    if not is_step(at):
        return at
    step = int(at)
    if step < 1:
        raise UsageError(f"--at {at}: steps are numbered from 1")
    before = ""
    for entry in elog.read(run_id):
        e = entry.event
        if isinstance(e, ev.StepDecided) and (e.step == step or (e.group and e.group <= step
                                                                  <= e.step)):
            if not before:
                raise UsageError(f"--at {at}: the run's log has nothing before step {step}")
            return before
        before = entry.id
    raise UsageError(f"--at {at}: run {run_id} took no step {step}")


def _decoded(entry: Entry) -> ev.Event:
    if entry.event is None:
        raise DecodeError(entry.id, entry.error or "undecodable")
    return entry.event


def fork(elog: EventLog, run_id: str, at: str, new_run_id: str, by: str = "fork", *,
         overrides: dict[str, str] | None = None, hold_effects: bool = False,
         reuse_replies: bool = False) -> RunHandle:
    """Start ``new_run_id`` whose history is ``run_id``'s log up to ``at`` (an entry id,
    inclusive, or a step number); ``by`` is the new events' actor; the other arguments make
    it a counterfactual fork (see the module doc)."""
    if elog.exists(new_run_id):
        raise UsageError(f"run {new_run_id} already exists")
    if (overrides or reuse_replies) and not hold_effects:
        raise UsageError("a fork with --set or --reuse-replies runs new code paths: give "
                         "--hold-effects, so that no new effect is sent")
    end = prefix_end(elog, run_id, at)
    entries = elog.read(run_id, "-", end)
    if not entries:
        raise RunNotFound(run_id)
    first = _decoded(entries[0])
    if not isinstance(first, ev.RunStarted):
        raise DecodeError(entries[0].id, "log does not begin with run_started")
    counterfactual: dict[str, Any] = {"overrides": dict(overrides or {}),
                                      "hold_effects": True, "reuse_replies": reuse_replies} \
        if hold_effects else {}
    specs: list[Spec] = [Spec(ev.RunStarted, {
        "agent": first.agent, "agent_version": first.agent_version, "input": first.input,
        "tools": first.tools, "parent": run_id, "forked_at": end, **counterfactual})]
    skip = (ev.RunStarted, ev.Checkpoint, ev.LeaseAcquired, ev.RetiredLeaseLost,
            *ev.TERMINAL_EVENTS, ev.Quarantined, ev.Released, ev.ContextTrimmed)
    gone = context.removed(elog.read(run_id))
    handle = RunHandle(new_run_id, RunState(), actor=by)
    if first.input_blob is not None:  # the fork keeps its own copy of the input, as it is
        if first.input_blob.field in gone:
            raise UsageError(f"run {run_id}'s input was model context, removed at "
                             f"{gone[first.input_blob.field].at} ms: it cannot be forked")
        handle.staged_blobs.append((first.input_blob.field, blobs.raw_bytes(
            elog.redis, elog.keys, run_id, first.input_blob, entries[0].id)))
        specs[0].fields["input_blob"] = first.input_blob
    for entry in entries[1:]:
        event = _decoded(entry)
        if isinstance(event, skip):
            continue
        data = ev.to_builtins(event)
        fields = {k: v for k, v in data.items()
                  if k not in ("v", "run", "seq", "ts", "actor", "attempt", "type")}
        ref = getattr(event, "blob", None)
        if isinstance(ref, BlobRef):  # the fork keeps its own copy of the large value
            if ref.field in gone:
                raise UsageError(f"run {run_id}'s entry {entry.id} kept model context that "
                                 f"was removed at {gone[ref.field].at} ms "
                                 f"({gone[ref.field].setting}): fork before it, or not at all")
            del fields["blob"]
            fields["result"] = blobs.raw_value(elog.redis, elog.keys, run_id, ref, entry.id)
        specs.append(Spec(type(event), fields))
    elog.commit(handle, specs, extra={"agent": first.agent, "parent": run_id},
                checkpoint=True)
    return handle


# What a held fork does with each call (the worker applies it) --------------------------


def held(state: RunState, tool: Tool) -> bool:
    """Whether a call of ``tool`` in ``state``'s run waits for a release before it is sent:
    every effect of a fork that holds effects, and every child start."""
    return state.hold_effects and (not tool.effect_free or tool.name == keys.CHILD_TOOL)


def parent_actions(elog: EventLog, parent: str | None) -> dict[int, Action]:
    """Every step of the fork's parent with its outcome, large values read back ({} when the
    parent is gone: nothing is reused then)."""
    if not parent or not elog.exists(parent):
        return {}
    actions = fold([e.event for e in elog.read(parent) if e.event is not None],
                   window=ALL).actions
    elog.resolve(parent, actions.values())
    return actions


def same_call(recorded: Action, tool: str, args: Any) -> bool:
    by_digest = is_placeholder(recorded.args) or given_digest(args) is not None
    return call_signature(recorded.tool, recorded.args, digest=by_digest) == \
        call_signature(tool, args, digest=by_digest)


def choice(state: RunState, tool: Tool, step: int, args: Any,
           parent: dict[int, Action]) -> tuple[str, Any, str]:
    """What a held fork does with a call: ("send", None, ""), ("reuse", the parent's result,
    its key), ("simulate", the result, "") or ("hold", None, "")."""
    if not held(state, tool):
        if tool.model and state.reuse_replies:
            for act in parent.values():
                if act.status == "succeeded" and same_call(act, tool.name, args):
                    return "reuse", act.result, act.key
        return "send", None, ""
    recorded = parent.get(step)
    if recorded is not None and recorded.status == "succeeded" and \
            same_call(recorded, tool.name, args):
        return "reuse", recorded.result, recorded.key
    if tool.simulates:
        try:
            return "simulate", tool.simulate(args), ""
        except Exception:  # a simulation that fails holds the call, as one without
            return "hold", None, ""
    return "hold", None, ""


def outcome_spec(step: int, key: str, what: str, result: Any, reused: str) -> Spec:
    """The outcome a reused or simulated call records, with nothing sent."""
    return Spec(ev.ActionSucceeded, {"step": step, "key": key, "result": result,
                                     **({"reused": reused} if what == "reuse" else
                                        {"simulated": True})})
