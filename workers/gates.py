"""The gates a step passes before it is sent: approval of the action, the agent version and
the configuration a run resumes under (``resume_policy``, at the start of every job), and
what must still hold after a wait (``revalidate``): the facts the agent declared and the
evidence references its steps recorded (``durable.agents.evidence``).

A failed check is recorded as an event and handled as declared; it is never silently fed
back to the agent. An approval is bound to the digest of the action's consequential fields
(``durable.controls.digests``), recomputed right before the approved call runs, and its signature
is checked against the approver registry then too (``durable.controls.approvals.check_recorded``:
registered, not revoked, the request's role, before its expiry): a decision that does not
hold is never acted on, and a new approval is requested.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from durable.agents import Agent, Registry, Tool
from durable.agents import configuration as config_
from durable.agents import evidence as evidence_
from durable.audit.forks import held
from durable.controls.digests import action_digest, digest
from durable.log import events as ev
from durable.log.state import Action, Approval, RunState
from durable.log.store import Spec, now_ms


def request_specs(state: RunState, tool: Tool, act: Action, reason: str) -> list[Spec]:
    """Ask for an approval of ``act`` and wait for it (the worker then lets go); in a fork
    that holds effects, the release of a held call (its wait's data says ``held``)."""
    args = dict(act.args or {})
    hold = {"held": True} if held(state, tool) and not tool.requires_approval else {}
    expires = now_ms() + int(tool.approval_ttl_s * 1000)
    asked = sum(1 for a in state.approvals.values() if a.step == act.step and a.kind == "action")
    request = f"{act.key}:a{asked + 1}"
    return [
        Spec(ev.ApprovalRequested, {
            "request": request, "step": act.step, "digest": action_digest(tool, act),
            "role": tool.approver_role, "evidence": tool.evidence(args), "expires": expires}),
        Spec(ev.WaitEntered, {"kind": "approval", "reason": reason, "until": expires,
                              "request": request,
                              "data": {"tool": tool.name, "args": args, **hold}}),
    ]


#: Why a recorded decision does not hold (None when it does): the approver registry's check.
Check = Callable[[Approval], "str | None"]


def gate(state: RunState, tool: Tool, act: Action, check: Check) -> tuple[str, str]:
    """Whether ``act`` may be dispatched now: ("go" | "ask" | "rejected", reason)."""
    if not tool.requires_approval and not held(state, tool):
        return "go", ""
    appr = state.approvals.get(act.approval) if act.approval else None
    if appr is None or appr.decision is None:
        if not tool.requires_approval:
            return "ask", f"held: a counterfactual fork sends no new effect; {tool.name} " \
                          f"waits for a release signed by role {tool.approver_role}"
        return "ask", f"{tool.name} requires approval by role {tool.approver_role}"
    problem = check(appr)
    if problem is not None:
        return "ask", f"the decision on {appr.request} does not hold ({problem}): " \
                      "approve it again"
    if appr.decision != "approve":
        return "rejected", f"rejected by {appr.approver}"
    if action_digest(tool, act) != appr.digest:
        return "ask", "the action changed since it was approved: approve it again"
    return "go", ""


Verdict = Literal["ok", "wait", "quarantine", "expire"]
#: What a resume gate decides: (verdict, events to write, reason).
Decided = tuple[Verdict, list[Spec], str]


def resume_policy(state: RunState, agent: Agent, have: dict[str, str],
                  check: Check) -> Decided:
    """Resuming under this worker's agent: first its version (``version_policy``), then
    its configuration ``have`` against the run's pin (``configuration_policy``). "ok" with
    events to stage before the next step; else what stops the run (``expire``: the events
    end it)."""
    verdict, specs, why = version_policy(state, agent, check)
    if verdict != "ok":
        return verdict, specs, why
    more, then, why = configuration_policy(state, agent, have, check)
    return more, specs + then, why


def reapproval(state: RunState, request: str, check: Check) -> str | None:
    """The decision recorded on the upgrade ``request`` that still holds (a decision that
    does not, ``check``, is asked for again under the same id): "approve", the
    approver's name when rejected, or None when there is none."""
    appr = state.approvals.get(request)
    if appr is None or appr.decision is None or check(appr) is not None:
        return None
    return "approve" if appr.decision == "approve" else (appr.approver or "?")


def ask(state: RunState, request: str, kind: str, of: str, role: str, what: str) -> list[Spec]:
    """Ask ``role`` to approve the upgrade (``kind`` "version" or "configuration") bound to
    the digest ``of``, and wait for it (a week at most)."""
    expires = now_ms() + 7 * 86400 * 1000
    return [
        Spec(ev.ApprovalRequested, {"request": request, "step": state.step, "kind": kind,
                                    "digest": of, "role": role, "expires": expires}),
        Spec(ev.WaitEntered, {"kind": "approval", "reason": f"{what}: approve to continue",
                              "until": expires, "request": request}),
    ]


def version_policy(state: RunState, agent: Agent, check: Check) -> Decided:
    """Resuming under ``agent.version``: (verdict, events to write, reason). A decision that
    does not hold (``check``) is asked for again under the same request id."""
    if state.agent_version == agent.version:
        return "ok", [], ""
    upgrade = Spec(ev.AgentUpgraded, {"from_version": state.agent_version,
                                      "to_version": agent.version, "tools": list(agent.tools)})
    what = f"run started under {agent.name} v{state.agent_version}, code is v{agent.version}"
    if agent.on_version_change == "continue" or state.agent_version in agent.compatible_versions:
        return "ok", [upgrade], ""
    if agent.on_version_change == "quarantine":
        return "quarantine", [], what
    request = f"{state.run_id}:v{agent.version}"
    decided = reapproval(state, request, check)
    if decided == "approve":
        return "ok", [upgrade], ""
    if decided is not None:
        return "quarantine", [], f"{what}; the upgrade was rejected by {decided}"
    of = digest("agent", {"name": agent.name, "version": agent.version}, {})
    return "wait", ask(state, request, "version", of, agent.upgrade_role, what), what


def configuration_policy(state: RunState, agent: Agent, have: dict[str, str],
                         check: Check) -> Decided:
    """The run's pinned configuration against the worker's ``have``: nothing when they
    agree; a first pin when the run has none; else the strictest policy of the changed
    fields (``durable.agents.configuration``), recorded as ``resume_validated``."""
    if not config_.changes(state.config, have):  # an absent field reads as ""
        return "ok", [], ""
    if not state.config:
        return "ok", [Spec(ev.ResumeValidated, {"outcome": "pinned", "config": have})], ""
    changed = config_.changes(state.config, have)
    applied = config_.actions(agent.on_configuration_change, changed)
    policy = config_.strictest(applied)
    what = f"configuration of {agent.name} changed since the run was pinned: " \
           f"{config_.describe(changed)}"
    seen = {"changes": changed, "actions": applied}
    if policy == "expire":
        fields = ", ".join(f for f, p in applied.items() if p == "expire")
        return "expire", [Spec(ev.ResumeValidated, {"outcome": "expired", **seen}),
                          Spec(ev.Expired, {"reason": f"configuration changed ({fields}): "
                                                      f"{config_.describe(changed)}"})], what
    if policy in ("continue", "replan"):
        outcome = "continued" if policy == "continue" else "replanned"
        return "ok", [Spec(ev.ResumeValidated, {"outcome": outcome, "config": have,
                                                **seen})], ""
    of = config_.change_digest(state.run_id, changed)
    request = f"{state.run_id}:c{of[:12]}"
    decided = reapproval(state, request, check)
    if decided == "approve":
        return "ok", [Spec(ev.ResumeValidated, {"outcome": "approved", "config": have,
                                                "request": request, **seen})], ""
    if decided is not None:
        return "quarantine", [], f"{what}; the change was rejected by {decided}"
    return "wait", [Spec(ev.ResumeValidated, {"outcome": "reapprove", "request": request,
                                              **seen}),
                    *ask(state, request, "configuration", of, agent.upgrade_role, what)], what


def revalidate(state: RunState, agent: Agent, registry: Registry) -> tuple[str, list[Spec]]:
    """After a wait: the tools the run needs, the facts the agent declared
    (``Agent.revalidate``) and the run's evidence references (``evidence_check``).
    ("ok" | "quarantine" | "failed" | "expire", the events recording it): "ok" with events
    when they only tell the agent (staged with its next step); else they stop this job."""
    missing = [t for t in state.tools if t not in registry.tools]
    if missing:
        return "quarantine", [Spec(ev.Quarantined, {
            "reason": f"tools no longer available on resume: {', '.join(missing)}"})]
    stale = agent.revalidate(state)
    if stale is not None and stale.then == "expire":  # ends the run: nothing else to check
        return "failed", [Spec(ev.RevalidationFailed, {"reason": stale.reason,
                                                       "then": stale.then})]
    verdict, specs = evidence_check(state, agent, registry)
    if stale is not None:
        failed = Spec(ev.RevalidationFailed, {"reason": stale.reason, "then": stale.then})
        return ("expire" if verdict == "expire" else "failed"), [failed, *specs]
    return verdict, specs


def evidence_check(state: RunState, agent: Agent, registry: Registry) -> tuple[str, list[Spec]]:
    """Check every evidence reference of the run with its source's checker
    (``durable.agents.evidence``), once per resume: nothing to record when the run has none;
    else one ``evidence_checked`` event, and an ``expired`` one when the agent's policy
    says so."""
    if not state.evidence:
        return "ok", []
    failed = evidence_.check_all(state.evidence, registry.checkers)
    if not failed:
        return "ok", [Spec(ev.EvidenceChecked, {"outcome": "held",
                                                 "checked": len(state.evidence)})]
    policy = agent.on_evidence_change
    seen = {"checked": len(state.evidence), "failed": failed}
    if policy == "expire":
        return "expire", [Spec(ev.EvidenceChecked, {"outcome": "expired", **seen}),
                          Spec(ev.Expired, {"reason": evidence_.describe(failed)})]
    return "ok", [Spec(ev.EvidenceChecked, {"outcome": policy, **seen})]
