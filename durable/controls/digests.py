"""The digest an approval is bound to.

A SHA-256 over a canonical encoding (sorted-key JSON) of the tool name, its arguments and
the facts the tool says the decision depends on. It is computed when the approval is
requested and again, over the action as it is then, right before the approved call runs:
any difference refuses the call and asks for a new approval.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from durable.agents import Tool
from durable.log.state import Action


def digest(tool: str, args: Any, facts: dict[str, Any]) -> str:
    canon = msgspec.json.encode({"tool": tool, "args": args, "facts": facts}, order="sorted")
    return hashlib.sha256(canon).hexdigest()


def action_digest(tool: Tool, act: Action) -> str:
    args = dict(act.args or {})
    return digest(tool.name, args, tool.approval_facts(args))
