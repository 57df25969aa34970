"""Approvals bound to a digest of the action's consequential fields.

The digest is a SHA-256 over a canonical encoding (sorted-key JSON) of the tool name, its
arguments and the facts the tool says the decision depends on. It is computed when the
approval is requested and again, over the action as it is then, right before the approved
call runs: any difference refuses the call and asks for a new approval.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from durable import events as ev
from durable.agents import Tool
from durable.eventlog import Spec, now_ms
from durable.state import Action, RunState


def digest(tool: str, args: Any, facts: dict[str, Any]) -> str:
    canon = msgspec.json.encode({"tool": tool, "args": args, "facts": facts}, order="sorted")
    return hashlib.sha256(canon).hexdigest()


def action_digest(tool: Tool, act: Action) -> str:
    args = dict(act.args or {})
    return digest(tool.name, args, tool.approval_facts(args))


def request_specs(state: RunState, tool: Tool, act: Action, reason: str) -> list[Spec]:
    """Ask for an approval of ``act`` and wait for it (the worker then lets go)."""
    args = dict(act.args or {})
    expires = now_ms() + int(tool.approval_ttl_s * 1000)
    asked = sum(1 for a in state.approvals.values() if a.step == act.step and a.kind == "action")
    request = f"{act.key}:a{asked + 1}"
    return [
        Spec(ev.ApprovalRequested, {
            "request": request, "step": act.step, "digest": action_digest(tool, act),
            "role": tool.approver_role, "evidence": tool.evidence(args), "expires": expires}),
        Spec(ev.WaitEntered, {"kind": "approval", "reason": reason, "until": expires,
                              "request": request, "data": {"tool": tool.name, "args": args}}),
    ]


def gate(state: RunState, tool: Tool, act: Action) -> tuple[str, str]:
    """Whether ``act`` may be dispatched now: ("go" | "ask" | "rejected", reason)."""
    if not tool.requires_approval:
        return "go", ""
    appr = state.approvals.get(act.approval) if act.approval else None
    if appr is None or appr.decision is None:
        return "ask", f"{tool.name} requires approval by role {tool.approver_role}"
    if appr.decision != "approve":
        return "rejected", f"rejected by {appr.approver}"
    if action_digest(tool, act) != appr.digest:
        return "ask", "the action changed since it was approved: approve it again"
    return "go", ""
