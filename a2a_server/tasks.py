"""A run as an A2A task, and its log as the task's events.

The task id is the run id; the context id names the run's session: the session
``<agent>:<context id>`` (``session_of``), one per agent, so that a context id a caller uses
with two agents does not hand one agent's conversation to the other. A run started
elsewhere in a session of another name has that name as context; outside any session, its
own id. States:

==============================================  =====================
run                                             task
==============================================  =====================
pending, before its first step                  submitted
pending, cancel_requested, outcome_unknown,     working
waiting_retry, waiting_external, quarantined
waiting_input, waiting_approval                 input-required
completed / failed, expired / canceled          completed / failed / canceled
==============================================  =====================

A quarantined run is ``working`` with a status message: it waits for an operator, not for
the caller. An approval is ``input-required`` for the caller to see, but it is decided by an
approver (console, CLI), never by an A2A message.

Events, as the run's log and partial output arrive: each step decided is a ``working`` status
update (metadata: step, tool); each partial output a chunk of the artifact
``partial-<step>``; the result the artifact ``result``, then the final status.
"""

from __future__ import annotations

from typing import Any

from a2a.types import (
    Artifact,
    Message,
    Role,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp

from durable.log import events as ev
from durable.log.state import RunState
from durable.log.store import Entry
from durable.streams.streaming import Partial

from .messages import part

S = TaskState
TERMINAL = frozenset({S.TASK_STATE_COMPLETED, S.TASK_STATE_FAILED, S.TASK_STATE_CANCELED})
INTERRUPTED = frozenset({S.TASK_STATE_INPUT_REQUIRED})
RESULT = "result"

Event = Task | TaskStatusUpdateEvent | TaskArtifactUpdateEvent


def task_state(state: RunState) -> TaskState:
    return state_of(state.state, state.step)


def state_of(s: str, step: int) -> TaskState:
    """The task state of a run in the state ``s`` at the step ``step`` (the table above)."""
    if s == "completed":
        return S.TASK_STATE_COMPLETED
    if s in ("failed", "expired"):
        return S.TASK_STATE_FAILED
    if s == "canceled":
        return S.TASK_STATE_CANCELED
    if s in ("waiting_input", "waiting_approval"):
        return S.TASK_STATE_INPUT_REQUIRED
    if s == "pending" and step == 0:
        return S.TASK_STATE_SUBMITTED
    return S.TASK_STATE_WORKING


def session_of(agent: str, context: str) -> str:
    """The session of ``agent``'s tasks in the A2A context ``context``."""
    return f"{agent}:{context}"


def context_of(state: RunState) -> str:
    """The A2A context of the run ``state``."""
    prefix = f"{state.agent}:"
    if state.session.startswith(prefix):
        return state.session[len(prefix):]
    return state.session or state.run_id


def _agent_says(run_id: str, context: str, text: str, key: str) -> Message:
    return Message(message_id=f"{run_id}-{key}", role=Role.ROLE_AGENT, task_id=run_id,
                   context_id=context, parts=[part(text)])


def status_text(state: RunState) -> str:
    """What the status message says, "" when nothing needs saying."""
    s = state.state
    if s == "waiting_input" and state.wait is not None:
        return state.wait.reason or "the agent waits for input: answer with a message " \
            "that names this task"
    if s == "waiting_approval":
        open_ = [a for a in state.approvals.values() if a.decision is None]
        role = open_[-1].role if open_ else ""
        return f"waiting for an approver{f' ({role})' if role else ''}: an approval is " \
            "decided in the console or with `durable approve`, not by a message"
    if s in ("failed", "expired"):
        return state.error or state.reason or s
    if s == "canceled":
        return state.reason or "canceled"
    if s == "quarantined":
        return f"quarantined, waiting for an operator: {state.reason or ''}".rstrip(": ")
    return ""


def status(state: RunState) -> TaskStatus:
    out = TaskStatus(state=task_state(state))
    text = status_text(state)
    if text:
        out.message.CopyFrom(_agent_says(state.run_id, context_of(state), text,
                                         f"status-{state.version}"))
    if state.updated:
        ts = Timestamp()
        ts.FromMilliseconds(state.updated)
        out.timestamp.CopyFrom(ts)
    return out


def result_artifact(result: Any) -> Artifact:
    return Artifact(artifact_id=RESULT, name=RESULT, parts=[part(result)])


def task(state: RunState) -> Task:
    """The task that ``state`` (a folded run) is."""
    context = context_of(state)
    meta = Struct()
    meta.update({"agent": state.agent, "runState": state.state, "step": state.step})
    out = Task(id=state.run_id, context_id=context, status=status(state), metadata=meta)
    out.history.append(Message(message_id=f"{state.run_id}-input", role=Role.ROLE_USER,
                               task_id=state.run_id, context_id=context,
                               parts=[part(state.input if state.input is not None else {})]))
    if state.state == "completed":
        out.artifacts.append(result_artifact(state.result))
    return out


def _status_event(run_id: str, context: str, state: TaskState, text: str = "",
                  **meta: Any) -> TaskStatusUpdateEvent:
    st = TaskStatus(state=state)
    if text:
        st.message.CopyFrom(_agent_says(run_id, context, text, f"status-{meta.get('seq', 0)}"))
    out = TaskStatusUpdateEvent(task_id=run_id, context_id=context, status=st)
    if meta:
        out.metadata.update(meta)
    return out


def events(item: Entry | Partial, run_id: str, context: str,
           seen: set[int]) -> list[Event]:
    """The task events one followed item makes (none for most log entries). ``seen``: the
    steps whose partial output began already (their next chunks append)."""
    if isinstance(item, Partial):
        first = item.step not in seen
        seen.add(item.step)
        return [TaskArtifactUpdateEvent(
            task_id=run_id, context_id=context, append=not first,
            artifact=Artifact(artifact_id=f"partial-{item.step}",
                              name=f"partial output of step {item.step}",
                              parts=[part(item.data)]))]
    e = item.event
    seq = e.seq if e is not None else 0
    if isinstance(e, ev.StepDecided):
        return [_status_event(run_id, context, S.TASK_STATE_WORKING, step=e.step, tool=e.tool,
                              seq=seq)]
    if isinstance(e, ev.WaitEntered) and e.kind == "input":
        return [_status_event(run_id, context, S.TASK_STATE_INPUT_REQUIRED,
                              e.reason or "the agent waits for input", seq=seq)]
    if isinstance(e, ev.ApprovalRequested):
        return [_status_event(run_id, context, S.TASK_STATE_INPUT_REQUIRED,
                              f"waiting for an approver ({e.role or 'any role'})", seq=seq)]
    if isinstance(e, ev.WaitResolved):
        return [_status_event(run_id, context, S.TASK_STATE_WORKING, seq=seq)]
    if isinstance(e, ev.Completed):
        return [TaskArtifactUpdateEvent(task_id=run_id, context_id=context,
                                        artifact=result_artifact(e.result), last_chunk=True),
                _status_event(run_id, context, S.TASK_STATE_COMPLETED, seq=seq)]
    if isinstance(e, ev.Failed):
        return [_status_event(run_id, context, S.TASK_STATE_FAILED, e.error or e.reason,
                              seq=seq)]
    if isinstance(e, ev.Expired):
        return [_status_event(run_id, context, S.TASK_STATE_FAILED, e.reason or "expired",
                              seq=seq)]
    if isinstance(e, ev.Canceled):
        return [_status_event(run_id, context, S.TASK_STATE_CANCELED, e.reason or "canceled",
                              seq=seq)]
    if isinstance(e, ev.Quarantined):
        return [_status_event(run_id, context, S.TASK_STATE_WORKING,
                              f"quarantined, waiting for an operator: {e.reason}", seq=seq)]
    return []


def ends(event: Event) -> bool:
    """Whether a stream ends after ``event``: a final or interrupted status."""
    return isinstance(event, TaskStatusUpdateEvent) and \
        event.status.state in TERMINAL | INTERRUPTED
