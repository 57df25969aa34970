"""What is checked when a run resumes: the agent version it runs under, and the facts the
agent declared must still hold after a wait. A failed check is recorded as an event and
handled as declared; it is never silently fed back to the agent."""

from __future__ import annotations

from typing import Literal

from durable import events as ev
from durable.agents import Agent, Registry
from durable.approvals import digest
from durable.eventlog import Spec, now_ms
from durable.state import RunState

Verdict = Literal["ok", "wait", "quarantine"]


def version_policy(state: RunState, agent: Agent) -> tuple[Verdict, list[Spec], str]:
    """Resuming under ``agent.version``: (verdict, events to write, reason)."""
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
    appr = state.approvals.get(request)
    if appr is not None and appr.decision == "approve":
        return "ok", [upgrade], ""
    if appr is not None and appr.decision is not None:
        return "quarantine", [], f"{what}; the upgrade was rejected by {appr.approver}"
    expires = now_ms() + 7 * 86400 * 1000
    return "wait", [
        Spec(ev.ApprovalRequested, {
            "request": request, "step": state.step, "kind": "version",
            "digest": digest("agent", {"name": agent.name, "version": agent.version}, {}),
            "role": agent.upgrade_role, "expires": expires}),
        Spec(ev.WaitEntered, {"kind": "approval", "reason": f"{what}: approve to continue",
                              "until": expires, "request": request}),
    ], what


def revalidate(state: RunState, agent: Agent, registry: Registry) -> tuple[str, Spec | None]:
    """After a wait: ("ok" | "quarantine" | "failed", the event recording a failed check)."""
    missing = [t for t in state.tools if t not in registry.tools]
    if missing:
        return "quarantine", Spec(ev.Quarantined, {
            "reason": f"tools no longer available on resume: {', '.join(missing)}"})
    stale = agent.revalidate(state)
    if stale is None:
        return "ok", None
    return "failed", Spec(ev.RevalidationFailed, {"reason": stale.reason, "then": stale.then})
