"""Durable agent execution on Redis: the library every process imports.

The public surface is what ``__all__`` lists; a test fails when a name appears in it or
vanishes from it by accident.
"""

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
from durable.cancellation import Cancelled, CancelToken
from durable.client import Client, RunSummary
from durable.code import RunContext, StepFailed, WaitExpired, agent
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
from durable.limits import Limit
from durable.log.state import Action, RunState
from durable.settings import Settings
from durable.starts import Started
from durable.streaming import Partial

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
