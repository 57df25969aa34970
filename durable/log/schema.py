"""The event types: a tagged union of frozen msgspec structs (``durable.log.events`` holds
their codec and re-exports them; import them from there).

Schema-change rules (msgspec's guidance on evolution, applied here):

1. A new field gets a default, so older entries still decode.
2. A field's type never changes, a field is never renamed, and new fields go after the
   existing ones of their class (the wire form is positional); add a new one instead.
3. A removed event type stays decodable: its class stays here, marked as retired.
4. A change that older code could misread bumps ``SCHEMA_VERSION`` and registers an
   upcaster in ``durable.log.migrations`` from the old version; a test decodes a fixture
   written at the old version.
5. Readers never crash on an entry they cannot read: an undecodable entry or one written at
   a future ``SCHEMA_VERSION`` raises ``DecodeError``, and the run is quarantined.
"""

from __future__ import annotations

from typing import Any

import msgspec

from durable.log.state import BlobRef, Cost, EvidenceRef, RunState


class Event(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="type"):
    """Fields every entry carries. ``seq`` is the run's version after the event."""

    v: int
    run: str
    seq: int
    ts: int
    actor: str = ""
    attempt: int = 0


class RunStarted(Event, tag="run_started", kw_only=True, frozen=True):
    agent: str
    agent_version: str = ""
    input: Any = None
    tools: list[str] = []
    parent: str | None = None
    forked_at: str | None = None
    #: A child run: the parent's step that started it (``parent`` names the parent); 0 for
    #: a run of its own or a fork.
    parent_step: int = 0
    #: Limits of the run ("steps", "model_calls", "tokens"): the agent's, overridden at start.
    budgets: dict[str, int] = {}
    #: W3C ``traceparent`` of the producer's span (``durable.telemetry.tracing``), or "".
    trace: str = ""
    #: The schedule whose slot started the run (``durable.controls.schedules``), and the slot (s
    #: since the epoch); "" and 0 for a run started otherwise.
    schedule: str = ""
    slot: int = 0
    #: A child sharing its parent's budgets: its limits are capped by what the parent had
    #: left, and its use is added to the parent's when it ends (``durable.controls.children``).
    shared_budgets: bool = False
    #: The run whose conversation this one continues (``durable.conversations``), or "".
    continue_from: str = ""
    #: Who the run is for (``durable.flow.tenants``): the tenant (customer, team) whose limits,
    #: fairness and metrics it counts against, and the owner (user, service) who started
    #: it; "" for a run started without them (and every run of older logs).
    tenant: str = ""
    owner: str = ""
    #: Higher is taken first among ready runs (``durable.flow.fairness``); 0 by default.
    priority: int = 0
    #: The named session the run is a turn of (``durable.controls.sessions``; its tenant is
    #: ``tenant``), or "": the run continues the session's latest run (``continue_from``).
    session: str = ""
    #: The configuration the run is pinned to (``durable.agents.configuration``: model, prompt
    #: digest, tool set digest, policy version), when the producer had the agent; {} else
    #: (then the first job's ``resume_validated`` pins it).
    config: dict[str, str] = {}
    #: An input over the inline limit (``DURABLE_MAX_PAYLOAD_BYTES``) is kept beside the run
    #: (``durable.log.blobs``, field ``input``), written by the same script call: its
    #: reference, digest and size; ``input`` is then None. Left out of the wire form
    #: otherwise, so a run with a small input writes no byte more.
    input_blob: BlobRef | None = None
    #: A counterfactual fork (``durable.audit.forks``): what it runs with instead of its
    #: parent's configuration (``--set``: model, prompt, tool set... read by the agent,
    #: ``state.overrides``, ``RunContext.overrides``), whether every new effect is held
    #: (recorded, never dispatched until an operator releases it), and whether a model
    #: request identical to one of the parent's reuses its recorded reply.
    overrides: dict[str, str] = {}
    hold_effects: bool = False
    reuse_replies: bool = False


class StepDecided(Event, tag="step_decided", kw_only=True, frozen=True):
    """Intent: the step the agent decided to take, with its idempotency key."""

    step: int
    tool: str
    args: Any = None
    key: str
    #: A model call (counted against the "model_calls" budget; its usage against "tokens").
    model: bool = False
    #: Values a code agent drew from its context (``ctx.now()``, ``ctx.random()``,
    #: ``ctx.uuid()``) since its last recorded decision, as ``[kind, value]`` pairs: returned
    #: as recorded when the function is executed again.
    values: list[Any] = []
    #: The first step of the parallel group decided together with this one (0: alone).
    group: int = 0
    #: The step's result is model context (a tool's ``context``; a model call's always
    #: is): with ``DURABLE_CONTEXT_RETENTION`` it is kept beside the run, and removed
    #: before the run's evidence (``durable.log.context``).
    context: bool = False
    #: A model step of an agent whose configuration names a model or a prompt: the
    #: ``model@prompt-digest`` of the pin it ran under
    #: (``durable.agents.configuration.model_used``).
    ran_under: str = ""
    #: A compensation (``durable.controls.compensation``): the step whose applied effect
    #: this step undoes with its tool's ``compensate``; 0 for every other step (left out of
    #: the wire form, so a run that never compensates writes no byte more).
    undoes: int = 0


class ActionDispatched(Event, tag="action_dispatched", kw_only=True, frozen=True):
    """The key was claimed in the ledger; the effect is sent with this deadline (ms)."""

    step: int
    key: str
    deadline: int


class ActionSucceeded(Event, tag="action_succeeded", kw_only=True, frozen=True):
    """``blob``: the result is kept beside the run (over the inline limit, or model
    context): its reference and digest; ``result`` is then None, and ``tokens`` holds a
    model call's ``usage.total_tokens``, which the fold cannot read from the result."""

    step: int
    key: str
    result: Any = None
    blob: BlobRef | None = None
    tokens: int = 0
    #: The evidence references the tool recorded (``ToolContext.evidence``); left out of
    #: the entry when there are none.
    evidence: list[EvidenceRef] = []
    #: A model call's cost (``durable.costs``): priced from its reply's usage when the
    #: outcome was recorded, with the price table's version; None for any other step.
    cost: Cost | None = None
    #: In a fork that holds effects: the key of the parent's step whose recorded outcome
    #: this one reuses (the same call at the same place; nothing was sent), or "".
    reused: str = ""
    #: In a fork that holds effects: the outcome is the tool's ``simulate(args)``, the
    #: effect was held and never sent.
    simulated: bool = False


class ActionFailed(Event, tag="action_failed", kw_only=True, frozen=True):
    """``retry_at`` > 0: a retryable error; the step is sent again (same key) at that time."""

    step: int
    key: str
    error: str
    error_type: str = ""
    retryable: bool = False
    retry_at: int = 0


class ActionTimedOut(Event, tag="action_timed_out", kw_only=True, frozen=True):
    """The deadline passed with no reply: outcome unknown, never a failure."""

    step: int
    key: str


class ActionInterrupted(Event, tag="action_interrupted", kw_only=True, frozen=True):
    """Stopped mid-flight (cancel or lost worker): outcome unknown."""

    step: int
    key: str
    reason: str = ""


class ActionReconciled(Event, tag="action_reconciled", kw_only=True, frozen=True):
    """An unknown outcome resolved with the tool's ``lookup``, or settled by an operator.

    ``resolution``: ``applied`` (counts as succeeded), ``not_applied`` (the step may be
    dispatched again with the same key) or ``unknown`` (an operator must decide).
    """

    step: int
    key: str
    resolution: str
    result: Any = None
    #: How: "" (the tool's ``lookup``), "effect_free" (nothing to ask: sent again) or
    #: "operator" (a signed settle, ``durable.controls.settling``: the fields below say who
    #: and why).
    by: str = ""
    #: As for ``ActionSucceeded``: a large result kept beside the run.
    blob: BlobRef | None = None
    #: A settle's registered signer, its key's fingerprint and its Ed25519 signature over
    #: the run, step, key, ``attempt`` (the step's dispatch count), resolution, the
    #: result's SHA-256 (``result_digest``) and the ``evidence`` (the operator's words).
    #: Older readers fold a settle as any reconciliation; they do not check the signature.
    operator: str = ""
    operator_key: str = ""
    sig: str = ""
    evidence: str = ""
    result_digest: str = ""


class CallCanceled(Event, tag="call_canceled", kw_only=True, frozen=True):
    """The step's call was stopped before or without applying its effect."""

    step: int
    key: str
    reason: str = ""


class CancelRequested(Event, tag="cancel_requested", kw_only=True, frozen=True):
    reason: str = ""
    scope: str = "run"
    requested_ts: int = 0
    by: str = ""
    #: Before the run ends, its applied effects are compensated, newest first
    #: (``durable.controls.compensation``).
    compensate: bool = False


class Canceled(Event, tag="canceled", kw_only=True, frozen=True):
    reason: str = ""
    latency_ms: int = 0
    #: A cancel with compensation: the steps whose effects were compensated, and those
    #: that could not be undone (no compensation, or it failed or was rejected), newest
    #: first.
    compensated: list[int] = []
    not_undone: list[int] = []


class WaitEntered(Event, tag="wait_entered", kw_only=True, frozen=True):
    kind: str
    reason: str = ""
    until: int = 0
    request: str = ""
    data: Any = None
    #: As ``StepDecided.values``.
    values: list[Any] = []


class WaitResolved(Event, tag="wait_resolved", kw_only=True, frozen=True):
    kind: str
    request: str = ""
    response: Any = None
    by: str = ""


class WaitExpiry(Event, tag="wait_expired", kw_only=True, frozen=True):
    kind: str
    request: str = ""
    outcome: str = "expired"


class ApprovalRequested(Event, tag="approval_requested", kw_only=True, frozen=True):
    """``kind``: ``action`` (the step's call) or ``version`` (resuming under a new agent)."""

    request: str
    step: int
    digest: str
    role: str = ""
    decisions: list[str] = msgspec.field(default_factory=lambda: ["approve", "reject"])
    evidence: list[str] = []
    expires: int = 0
    kind: str = "action"


class ApprovalDecided(Event, tag="approval_decided", kw_only=True, frozen=True):
    """``approver`` names the registered key that signed the decision, ``key`` is its
    fingerprint and ``sig`` the Ed25519 signature (``durable.controls.approvals``); decisions
    recorded before signatures existed have neither, and ``verify`` reports them."""

    request: str
    decision: str
    approver: str = ""
    note: str = ""
    key: str = ""
    sig: str = ""


class LeaseAcquired(Event, tag="lease_acquired", kw_only=True, frozen=True):
    owner: str
    epoch: int
    #: Written by a region takeover (``durable.regions``): the region that owns
    #: the run from here on, and its epoch; "" and 0 otherwise.
    region: str = ""
    region_epoch: int = 0


class RetiredLeaseLost(Event, tag="lease_lost", kw_only=True, frozen=True):
    """Retired: never written (a lost lease is the lease's business, not the log's). Kept
    decodable by rule 3; not to be confused with the error ``durable.errors.LeaseLost``."""

    owner: str
    epoch: int


class Checkpoint(Event, tag="checkpoint", kw_only=True, frozen=True):
    """A typed snapshot of the fold of every event before this one."""

    state: RunState
    state_v: int = 1


class Completed(Event, tag="completed", kw_only=True, frozen=True):
    result: Any = None


class Failed(Event, tag="failed", kw_only=True, frozen=True):
    error: str
    #: Why, when it is not the agent's own failure (e.g. ``budget_exhausted``).
    reason: str = ""


class Expired(Event, tag="expired", kw_only=True, frozen=True):
    reason: str = ""


class Quarantined(Event, tag="quarantined", kw_only=True, frozen=True):
    reason: str
    #: The agent code's traceback when an exception in it was the reason (its last 8 KB).
    traceback: str = ""


class Released(Event, tag="released", kw_only=True, frozen=True):
    by: str = ""


class RevalidationFailed(Event, tag="revalidation_failed", kw_only=True, frozen=True):
    """A fact the agent declared must still hold on resume no longer does.

    ``then``: ``refresh`` (the agent sees ``state.refresh`` and re-gathers), ``reapprove``
    (the open action needs a new approval) or ``expire`` (the run ends ``expired``).
    """

    reason: str
    then: str = "refresh"


class AgentUpgraded(Event, tag="agent_upgraded", kw_only=True, frozen=True):
    """The run goes on under another agent version (its compatibility policy allowed it)."""

    from_version: str
    to_version: str
    tools: list[str] = []


class ContextTrimmed(Event, tag="context_trimmed", kw_only=True, frozen=True):
    """Model context removed from beside an ended run (``durable.log.context``): the
    fields of ``dx:{R}:blobs`` deleted in the same script call (``refs``), their bytes,
    the setting that removed them (``DURABLE_CONTEXT_RETENTION=<value>``) and the time of
    the run's last write before it (``ended``). The outcomes keep their references and
    digests: what was there is still proven, no longer shown."""

    refs: list[str]
    bytes: int = 0
    setting: str = ""
    ended: int = 0


class ResumeValidated(Event, tag="resume_validated", kw_only=True, frozen=True):
    """A job compared the run's pinned configuration with the worker's
    (``durable.agents.configuration``).

    ``outcome``: ``pinned`` (the run had no pin: ``config`` is its first), ``continued`` or
    ``replanned`` (``config`` is the new pin; after ``replanned`` the agent sees ``changes``
    as ``state.config_changes``), ``reapprove`` (an approval of the change is asked for
    under ``request``; the pin is unchanged), ``approved`` (it was given: ``config`` is the
    new pin) or ``expired`` (an ``expired`` event follows). ``changes``: ``{field: [pinned,
    now]}``; ``actions``: the policy applied to each changed field.
    """

    outcome: str
    config: dict[str, str] = {}
    changes: dict[str, list[str]] = {}
    actions: dict[str, str] = {}
    request: str = ""


class EvidenceChecked(Event, tag="evidence_checked", kw_only=True, frozen=True):
    """On resume after a wait, the run's evidence references (``state.evidence``) were
    checked by their sources' checkers (``durable.agents.evidence``).

    ``outcome``: ``held`` (every one still holds), else the agent's ``on_evidence_change``
    applied to those that do not: ``refresh`` (the agent sees ``state.refresh`` and
    ``state.evidence_failed`` and reads again), ``replan`` (it sees
    ``state.evidence_failed``) or ``expired`` (an ``expired`` event follows naming them).
    ``checked``: how many were checked; ``failed``: those that do not hold, each with its
    step and ``why`` (gone, access denied, version changed, the checker raised or timed
    out, no checker for its source).
    """

    outcome: str
    checked: int = 0
    failed: list[EvidenceRef] = []


AnyEvent = (
    RunStarted
    | StepDecided
    | ActionDispatched
    | ActionSucceeded
    | ActionFailed
    | ActionTimedOut
    | ActionInterrupted
    | ActionReconciled
    | CallCanceled
    | CancelRequested
    | Canceled
    | WaitEntered
    | WaitResolved
    | WaitExpiry
    | ApprovalRequested
    | ApprovalDecided
    | LeaseAcquired
    | RetiredLeaseLost
    | Checkpoint
    | Completed
    | Failed
    | Expired
    | Quarantined
    | Released
    | RevalidationFailed
    | AgentUpgraded
    | ContextTrimmed
    | ResumeValidated
    | EvidenceChecked
)

EVENT_TYPES: dict[str, type[Event]] = {
    cls.__struct_config__.tag: cls
    for cls in AnyEvent.__args__
}

TERMINAL_EVENTS = (Completed, Failed, Canceled, Expired)
