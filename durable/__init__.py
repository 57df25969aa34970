"""Durable agent execution on Redis: the library every process imports.

The public surface is what ``__all__`` lists; a test fails when a name appears in it or
vanishes from it by accident.

``import durable`` loads nothing else: each public name is imported from its module the
first time it is used (PEP 562), so a producer that needs the client does not pay for the
agent API, the code-agent runtime or the limits, and a command-line call starts fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from durable.agents import (
        Agent,
        Call,
        Fail,
        Finish,
        Lookup,
        OutcomeUnknown,
        Tool,
        ToolContext,
        Wait,
        register,
        registry,
    )
    from durable.agents.cancel_token import Cancelled, CancelToken
    from durable.client import (
        Client,
    )
    from durable.code import (
        RunContext,
        StepFailed,
        WaitExpired,
        agent,
    )
    from durable.controls.starts import (
        Started,
    )
    from durable.errors import (
        ConflictError,
        DecodeError,
        DurableError,
        ForbiddenJob,
        InvalidInput,
        LeaseLost,
        NondeterminismError,
        PayloadTooLarge,
        RateLimited,
        Refused,
        RunContended,
        RunIdConflict,
        RunNotFound,
        SessionBusy,
        UnknownAgent,
        UnknownTool,
        UnsafeRedis,
        UsageError,
    )
    from durable.flow.limits import (
        Limit,
    )
    from durable.log.index import RunSummary
    from durable.log.state import (
        Action,
        RunState,
    )
    from durable.settings import (
        Settings,
    )
    from durable.streams.streaming import (
        Partial,
    )

#: Each public name -> the module it is imported from on first use.
_SOURCES: dict[str, str] = {
    "Action": "durable.log.state",
    "Agent": "durable.agents",
    "Call": "durable.agents.steps",
    "CancelToken": "durable.agents.cancel_token",
    "Cancelled": "durable.agents.cancel_token",
    "Client": "durable.client",
    "ConflictError": "durable.errors",
    "DecodeError": "durable.errors",
    "DurableError": "durable.errors",
    "Fail": "durable.agents.steps",
    "Finish": "durable.agents.steps",
    "ForbiddenJob": "durable.errors",
    "InvalidInput": "durable.errors",
    "LeaseLost": "durable.errors",
    "Limit": "durable.flow.limits",
    "Lookup": "durable.agents.steps",
    "NondeterminismError": "durable.errors",
    "OutcomeUnknown": "durable.agents.steps",
    "Partial": "durable.streams.streaming",
    "PayloadTooLarge": "durable.errors",
    "RateLimited": "durable.errors",
    "Refused": "durable.errors",
    "RunContended": "durable.errors",
    "RunContext": "durable.code",
    "RunIdConflict": "durable.errors",
    "RunNotFound": "durable.errors",
    "RunState": "durable.log.state",
    "RunSummary": "durable.log.index",
    "SessionBusy": "durable.errors",
    "Settings": "durable.settings",
    "Started": "durable.controls.starts",
    "StepFailed": "durable.code",
    "Tool": "durable.agents",
    "ToolContext": "durable.agents.steps",
    "UnknownAgent": "durable.errors",
    "UnknownTool": "durable.errors",
    "UnsafeRedis": "durable.errors",
    "UsageError": "durable.errors",
    "Wait": "durable.agents.steps",
    "WaitExpired": "durable.code",
    "agent": "durable.code",
    "register": "durable.agents",
    "registry": "durable.agents",
}

__all__ = [
    "Action",
    "Agent",
    "Call",
    "CancelToken",
    "Cancelled",
    "Client",
    "ConflictError",
    "DecodeError",
    "DurableError",
    "Fail",
    "Finish",
    "ForbiddenJob",
    "InvalidInput",
    "LeaseLost",
    "Limit",
    "Lookup",
    "NondeterminismError",
    "OutcomeUnknown",
    "Partial",
    "PayloadTooLarge",
    "RateLimited",
    "Refused",
    "RunContended",
    "RunContext",
    "RunIdConflict",
    "RunNotFound",
    "RunState",
    "RunSummary",
    "SessionBusy",
    "Settings",
    "Started",
    "StepFailed",
    "Tool",
    "ToolContext",
    "UnknownAgent",
    "UnknownTool",
    "UnsafeRedis",
    "UsageError",
    "Wait",
    "WaitExpired",
    "agent",
    "register",
    "registry",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use and kept in the package."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module 'durable' has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
