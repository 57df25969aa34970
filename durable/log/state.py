"""The folded state of a run: typed, snapshot-able, and nothing but data.

``RunState`` is what ``durable.log.fold`` computes from a run's events and what a checkpoint
event carries. It is never written by hand: change the events, and the fold follows.
"""

from __future__ import annotations

from typing import Any

import msgspec

#: Version of the ``RunState`` snapshot layout inside checkpoint events.
STATE_SCHEMA = 1
#: The same layout, in a snapshot of a run whose input is kept beside it (``input_blob``,
#: ``input`` left out): a reader that knows only ``STATE_SCHEMA`` 1 folds the whole log
#: instead, and refuses the ``run_started`` it cannot read, rather than give the agent
#: no input.
STATE_INPUT_REF = 2
#: The snapshot layouts this code reads.
STATE_SCHEMAS = frozenset({STATE_SCHEMA, STATE_INPUT_REF})

TERMINAL = frozenset({"completed", "failed", "canceled", "expired"})
WAITING = frozenset({"waiting_input", "waiting_approval", "waiting_external", "waiting_retry",
                     "waiting_timer", "waiting_child"})
ACTIVE = frozenset({"pending", "cancel_requested", "outcome_unknown", "quarantined"})
ALL_STATES = TERMINAL | WAITING | ACTIVE

#: Action statuses. ``unknown`` means dispatched with no known outcome (timed out,
#: interrupted, or found after a crash); ``not_applied`` means lookup proved the effect did
#: not happen, so the step may be dispatched again with the same key.
SETTLED = frozenset({"succeeded", "failed", "canceled", "rejected"})


class BlobRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Where a large value is kept (``durable.log.blobs``): a field of the run's
    ``dx:{R}:blobs`` hash, with the SHA-256 and the size (bytes) of what is stored there
    (its JSON, sensitive fields sealed)."""

    field: str
    sha256: str
    size: int
    #: The value is model context (``durable.log.context``): removed before the run's
    #: evidence under ``DURABLE_CONTEXT_RETENTION``.
    context: bool = False


class Cost(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a model call cost (``durable.costs``): ``usd`` as exact decimal text ("" when
    the cost is ``unknown``, which says why), its input and output parts, the price table
    and its version (``prices``), the model and provider it was priced as, and the reply's
    usage by token kind."""

    usd: str = ""
    input_usd: str = ""
    output_usd: str = ""
    prices: str = ""
    model: str = ""
    provider: str = ""
    tokens: dict[str, int] = {}
    unknown: str = ""


class EvidenceRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A record a step's result rests on (``ToolContext.evidence``, ``durable.agents.evidence``):
    its ``source`` (a checker is registered per source), its ``id`` there and the
    ``version`` the step read. ``step``: the step that recorded it (0 inside its outcome
    event, which names the step); ``why``: in an ``evidence_checked`` event, why it no
    longer holds ("" when it was recorded)."""

    source: str
    id: str
    version: str = ""
    step: int = 0
    why: str = ""


class SettleInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An operator's signed settle of an unknown outcome (``durable.controls.settling``): who
    (the registered signer and its key's fingerprint), the signature, the evidence, the
    result's digest, the dispatch count it was made for, and when it was recorded."""

    by: str = ""
    key: str = ""
    sig: str = ""
    evidence: str = ""
    digest: str = ""
    attempt: int = 0
    at: int = 0
    resolution: str = ""


class Action(msgspec.Struct, kw_only=True, omit_defaults=True):
    step: int
    tool: str
    args: Any = None
    key: str
    status: str = "decided"
    attempts: int = 0
    deadline: int = 0
    result: Any = None
    error: str | None = None
    error_type: str | None = None
    retryable: bool = False
    unknown_reason: str | None = None
    resolution: str | None = None
    approval: str | None = None
    #: A model call: counted against the run's budgets.
    model: bool = False
    #: When the latest dispatch was recorded (ms since the epoch): a step's duration.
    dispatched_at: int = 0
    #: The result is a large value kept beside the run: ``result`` is None in the fold,
    #: and filled in by the readers that run agent code (``durable.log.blobs``).
    blob: BlobRef | None = None
    #: The first step of the parallel group this step was decided in (0: decided alone).
    group: int = 0
    #: The operator's signed settle of this step's unknown outcome, if one was recorded.
    settle: SettleInfo | None = None
    #: The result is model context (``StepDecided.context``, or a model call).
    context: bool = False
    #: When the result, kept beside the run as context, was removed (ms; 0: it was not):
    #: ``result`` stays None for every reader.
    trimmed: int = 0
    #: A compensation: the step whose effect this one undoes (``StepDecided.undoes``).
    undoes: int = 0

    @property
    def settled(self) -> bool:
        return self.status in SETTLED


class CancelInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    reason: str = ""
    scope: str = "run"
    requested_ts: int = 0
    seq: int = 0
    by: str = ""
    #: The applied effects are compensated before the run ends (``CancelRequested``).
    compensate: bool = False


class WaitInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    kind: str
    reason: str = ""
    until: int = 0
    request: str = ""
    data: Any = None
    #: Set once resolved: the response, who gave it, or "expired".
    response: Any = None
    by: str = ""
    outcome: str = ""

    @property
    def deadline(self) -> int:
        """When the wait itself expires (ms since the epoch; 0: never): its ``until``, but for
        a child wait, whose ``until`` is only the reconciler's next look at the child
        (``CHILD_POLL_MS``), the join's own expiry (``data["expires"]``)."""
        if self.kind == "child" and isinstance(self.data, dict):
            return int(self.data.get("expires", 0) or 0)
        return self.until


class Approval(msgspec.Struct, kw_only=True, omit_defaults=True):
    request: str
    step: int
    digest: str
    role: str = ""
    decisions: list[str] = msgspec.field(default_factory=lambda: ["approve", "reject"])
    evidence: list[str] = msgspec.field(default_factory=list)
    expires: int = 0
    kind: str = "action"
    decision: str | None = None
    approver: str | None = None
    #: When the decision was recorded (ms since the epoch).
    decided_at: int = 0
    #: Fingerprint of the approver key that signed the decision, and its signature
    #: (``durable.controls.approvals``).
    key: str = ""
    sig: str = ""


class RunState(msgspec.Struct, kw_only=True, omit_defaults=True):
    run_id: str = ""
    agent: str = ""
    agent_version: str = ""
    input: Any = None
    tools: list[str] = msgspec.field(default_factory=list)
    parent: str | None = None
    #: A child run: the parent's step that started it (0: not a child).
    parent_step: int = 0
    #: The child runs this run started and waits or may wait for (detached ones aside):
    #: cancelling this run cancels them.
    children: list[str] = msgspec.field(default_factory=list)
    state: str = "pending"
    version: int = 0
    step: int = 0
    #: The open action and the most recent settled ones (bounded: see ``action_window``).
    actions: dict[int, Action] = msgspec.field(default_factory=dict)
    settled: int = 0
    cancel: CancelInfo | None = None
    wait: WaitInfo | None = None
    last_wait: WaitInfo | None = None
    approvals: dict[str, Approval] = msgspec.field(default_factory=dict)
    result: Any = None
    error: str | None = None
    reason: str | None = None
    #: The traceback of the agent code's exception that quarantined the run, if that did.
    traceback: str | None = None
    prior_state: str | None = None
    #: Set by a failed revalidation with ``then=refresh``; cleared by the next intent.
    refresh: str | None = None
    #: True from a wait's end until the next intent: revalidation is due.
    resumed: bool = False
    created: int = 0
    updated: int = 0
    #: Limits recorded at start ("steps", "model_calls", "tokens") and what was used.
    budgets: dict[str, int] = msgspec.field(default_factory=dict)
    model_calls: int = 0
    tokens: int = 0
    #: What the model calls cost, in US dollars as exact decimal text ("": none priced yet;
    #: ``durable.costs``), and how many model calls have no known cost (unknown, never 0).
    cost_usd: str = ""
    uncosted: int = 0
    #: A child that shares its parent's budgets (its use counts in the parent's too).
    shared_budgets: bool = False
    #: Bytes of the large values kept beside the run (``DURABLE_BLOB_BUDGET_BYTES``).
    blob_bytes: int = 0
    #: W3C ``traceparent`` the producer recorded at start ("" without tracing).
    trace: str = ""
    #: The tenant and owner recorded at start (``durable.flow.tenants``), and the priority.
    tenant: str = ""
    owner: str = ""
    priority: int = 0
    #: The run whose conversation this one continues, and the named session it is a turn
    #: of ("" for none; ``durable.controls.sessions``).
    continue_from: str = ""
    session: str = ""
    #: When the run's model context was last trimmed (ms; 0: never), and how many values.
    context_trimmed: int = 0
    context_values_trimmed: int = 0
    #: The configuration the run is pinned to (``durable.agents.configuration``); {} until pinned.
    config: dict[str, str] = msgspec.field(default_factory=dict)
    #: What changed in the pin at the last resume whose policy was ``replan``
    #: (``{field: [before, now]}``); cleared by the next intent.
    config_changes: dict[str, list[str]] = msgspec.field(default_factory=dict)
    #: A run canceled with compensation (``Canceled``): the steps compensated and those
    #: that could not be undone, newest first.
    compensated: list[int] = msgspec.field(default_factory=list)
    not_undone: list[int] = msgspec.field(default_factory=list)
    #: The evidence references the run's steps recorded (``durable.agents.evidence``), the latest
    #: per source and id, each naming its step: re-checked on every resume after a wait.
    evidence: list[EvidenceRef] = msgspec.field(default_factory=list)
    #: The references found not to hold at the last resume whose policy was ``refresh`` or
    #: ``replan``, each with ``why``; cleared by the next intent.
    evidence_failed: list[EvidenceRef] = msgspec.field(default_factory=list)
    #: The run's input is kept beside it (over the inline limit, ``durable.controls.starts``):
    #: its reference; ``input`` is then None until a reader that runs agent code fills it
    #: in (``durable.log.blobs.resolve``). None once removed as model context.
    input_blob: BlobRef | None = None
    #: A counterfactual fork's changed configuration, whether it holds every new effect and
    #: reuses its parent's identical model replies (``RunStarted``; ``durable.audit.forks``).
    overrides: dict[str, str] = msgspec.field(default_factory=dict)
    hold_effects: bool = False
    reuse_replies: bool = False

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def waiting(self) -> bool:
        return self.state in WAITING

    @property
    def current(self) -> Action | None:
        """The first action not settled yet (several are open while a parallel group runs;
        a recovery resolves them in step order), or None."""
        act = self.actions.get(self.step)
        if act is None:
            return None
        if act.group:  # the latest step is part of a group: any of its steps may be open
            for step in range(act.group, act.step + 1):
                member = self.actions.get(step)
                if member is not None and not member.settled:
                    return member
            return None
        return None if act.settled else act

    @property
    def open_actions(self) -> list[Action]:
        """Every action not settled yet, in step order."""
        return sorted((a for a in self.actions.values() if not a.settled),
                      key=lambda a: a.step)

    @property
    def last(self) -> Action | None:
        return self.actions.get(self.step)

    def results(self) -> dict[str, Any]:
        """Results of the settled, successful actions still in the window, by tool name."""
        return {a.tool: a.result for a in self.actions.values() if a.status == "succeeded"}


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RunState)


def copy_state(state: RunState) -> RunState:
    """A deep copy (the fold mutates the state it is given)."""
    return _decoder.decode(_encoder.encode(state))
