"""What every framework integration shares (the peer of pydantic-ai's ``durable_exec/_base``):
the options of a tool's steps, the step a tool runs in, the hand-off of a live request from
the agent's function to the step tool that performs it, the bases of the step tools, the JSON
a step's identity and result are made of, and the pair of MCP steps.

Each framework folder (``pydantic_ai/``, ``openai_agents/``) holds only its adapter on top of
this module and ``mcp_sessions`` (one MCP session per worker and server), with the same
module names for the same roles. The rules of the folder:

- this module and ``mcp_sessions`` import no framework; a framework folder imports no other
  one;
- a step tool knows its owner (the adapter's agent or capability) through a ``Protocol`` of
  what it uses, never by importing the module that defines the owner: the imports go one way,
  from the owner down to its steps.

Every step tool's ``run`` is ``async def``: the worker runs it as a task on the process's
event loop (``durable.eventloop``), the one it runs ``async def`` agents and tools on, so a
model request or a tool call in flight holds no thread (a worker holds as many as its run
slots, not as many as ``DURABLE_USER_THREADS``). One loop per process for every integration:
a model keeps its HTTP client on the loop it was first used on, and an MCP session stays open
on it across steps. The worker cancels a step's task at its deadline, and at a cancel (after
its grace when the step cannot be cancelled), as it does any ``async def`` tool's. A step
tool awaits its work with ``run_in_step``, which makes the step the current one
(``current_step()``, ``step_context()``) for the code it reaches.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from pydantic_core import to_jsonable_python

from durable.agents import Agent, Lookup, Registry, Tool, ToolContext
from durable.agents.configuration import short_digest

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "Bindings",
    "EffectFreeStep",
    "LiveRequests",
    "ModelStepBase",
    "Owner",
    "StepOptions",
    "configured_by",
    "current_step",
    "jsonable",
    "make_step",
    "mcp_step_tools",
    "model_id",
    "named",
    "opaque",
    "recorded_lookup",
    "run_in_step",
    "stable",
    "step_context",
]

T = TypeVar("T")

#: A step's timeout when neither its ``StepOptions`` nor its tool name one, in seconds.
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class StepOptions:
    """How one tool's calls are run as steps (``tools={name: StepOptions(...)}``, and
    ``"<server>.*"`` for every tool of an MCP server).

    ``timeout_s``: the step's deadline, in seconds. ``None`` (the default) takes the timeout
    the tool itself declares where the integration enforces it in the step (the OpenAI Agents
    SDK's ``timeout_seconds``, which the step then replaces), else ``DEFAULT_TIMEOUT_S``
    (60 s): a timeout written on the tool holds without being said twice, and nothing is cut
    shorter than what the tool asked for. (pydantic-ai enforces a tool's own ``timeout=``
    itself, inside the step, so its steps take 60 s unless given one here.)

    ``lookup(key, args)`` asks the system the tool acts on whether the call keyed ``key``
    happened (``Lookup.applied(the tool's result)``, ``not_applied()`` or ``unknown()``), plain
    or ``async``: it resolves a call whose outcome a crash or a timeout left unknown. Without
    one, such a call waits in ``waiting_external`` for an operator (``durable settle``): mark a
    tool that only reads ``effect_free`` and it is simply sent again. ``retryable``: the
    exceptions retried with the same key. ``requires_approval`` overrides what the framework
    says of the tool; ``approver_role`` is the role whose signed decision such a call waits
    for, at most ``approval_ttl_s``. ``step=False`` (pydantic-ai only): the tool is not a step
    at all; it runs inside the agent's function and is executed again on recovery (for pure,
    cheap tools only)."""

    timeout_s: float | None = None
    retryable: tuple[type[BaseException], ...] = ()
    cancellable: bool = False
    effect_free: bool = False
    lookup: Callable[[str, dict[str, Any]], Lookup | Awaitable[Lookup]] | None = None
    requires_approval: bool | None = None
    approver_role: str = "approver"
    approval_ttl_s: float = 86400.0
    step: bool = True

    def timeout(self, declared: float | None = None) -> float:
        """The step's timeout: ``timeout_s``, else the tool's ``declared`` one, else 60 s."""
        return self.timeout_s or declared or DEFAULT_TIMEOUT_S

    def step_attrs(self, declared: float | None = None) -> dict[str, Any]:
        """The attributes of the step tool of a tool with these options."""
        return {"timeout_s": self.timeout(declared), "retryable": self.retryable,
                "cancellable": self.cancellable, "effect_free": self.effect_free,
                "approver_role": self.approver_role, "approval_ttl_s": self.approval_ttl_s,
                "options": self}


# The step a coroutine runs in ---------------------------------------------------------------

_current: ContextVar[ToolContext | None] = ContextVar("durable_integration_step", default=None)


def current_step() -> ToolContext | None:
    """The step the running coroutine belongs to, or ``None`` outside one."""
    return _current.get()


async def run_in_step(make: Callable[[], Awaitable[Any]], ctx: ToolContext | None) -> Any:
    """Await the coroutine ``make()`` returns with ``current_step()`` set to ``ctx``: a step
    tool's ``run`` awaits its work so (the worker's task of the call, on the process's loop),
    and the tool, model or MCP call it reaches reads its step with ``step_context()``."""
    token = _current.set(ctx)
    try:
        return await make()
    finally:
        _current.reset(token)


def step_context() -> ToolContext:
    """The step a durable agent's tool (or model) runs in: ``key`` (its idempotency key, to
    pass downstream), ``deadline_ms``, ``token``, ``attempt``, ``emit``. Raises
    ``LookupError`` outside a step."""
    ctx = current_step()
    if ctx is None:
        raise LookupError("not inside a durable step of an agent of a framework integration")
    return ctx


# JSON ---------------------------------------------------------------------------------------


def opaque(value: Any) -> str:
    """A value JSON cannot carry, in a step's identity: its type (stable across runs)."""
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def jsonable(value: Any) -> Any:
    """``value`` as JSON data; what JSON cannot carry becomes its ``str``."""
    return to_jsonable_python(value, fallback=str)


def stable(value: Any) -> Any:
    """``value`` as JSON data for a step's identity (checked again on re-execution): what
    JSON cannot carry becomes its type's name, the same in every process."""
    return to_jsonable_python(value, fallback=opaque)


# The hand-off of live requests ----------------------------------------------------------------


class LiveRequests:
    """The live request (a model and its messages, a tool and its context...) of each step a
    run's function waits at, handed to the step tool that performs it. The key names the call
    so that the tool can find it again from its ``ToolContext`` and arguments: the worker only
    runs a code agent's step while its function waits at that very call."""

    def __init__(self) -> None:
        self._live: dict[Hashable, Any] = {}

    @contextmanager
    def handing(self, key: Hashable, live: Any) -> Iterator[None]:
        """``live`` is the request of ``key`` while the block runs (the function's wait)."""
        self._live[key] = live
        try:
            yield
        finally:
            self._live.pop(key, None)

    def take(self, key: Hashable, kind: type[T], ctx: ToolContext, step: str) -> T:
        """The live request of ``key``, handed to the step tool ``step`` running ``ctx``."""
        live = self._live.get(key)
        if not isinstance(live, kind):
            raise RuntimeError(f"step {ctx.step} of {ctx.run_id}: no live request was handed "
                               f"to {step!r} (is its function waiting at this step?)")
        return live

    def __len__(self) -> int:
        return len(self._live)


class Owner(Protocol):
    """What a step tool knows of the agent (or capability) it is a step of."""

    @property
    def name(self) -> str: ...

    def handed(self, ctx: ToolContext, step: str, args: dict[str, Any], kind: type[T]) -> T:
        """The live request of the step ``step`` (arguments ``args``) its function waits at."""
        ...


B = TypeVar("B")


class Bindings(Generic[B]):
    """The durable run an integration's function is executing: a context variable holding its
    binding (``B``, which has an ``owner``), read by the framework's wrappers."""

    def __init__(self, name: str) -> None:
        self.var: ContextVar[B | None] = ContextVar(name, default=None)

    def bound(self, owner: object) -> B | None:
        """The binding of the run ``owner``'s function is executing here, else ``None``."""
        b = self.var.get()
        return b if b is not None and getattr(b, "owner", None) is owner else None


# Step tools ---------------------------------------------------------------------------------


def make_step(base: type[Tool], name: str, **attrs: Any) -> Tool:
    """The step tool ``name``: a subclass of ``base`` with ``attrs`` as class attributes."""
    cls: type[Tool] = type(name.replace(".", "_"), (base,), {"name": name, **attrs})
    return cls()


class EffectFreeStep(Tool):
    """A step without external effect: sent again at once after a crash, never looked up."""

    effect_free = True

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()  # never asked: an effect-free step is sent again


class ModelStepBase(EffectFreeStep):
    """``<name>.model``: one model request, performed by the real model (``request``), counted
    against the "model_calls" budget, its arguments logged as a digest."""

    model = True
    log_args = "digest"
    cancellable = True
    owner: ClassVar[Owner]
    #: The type of the live request the function hands over.
    call_type: ClassVar[type[Any]]

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        call = self.owner.handed(ctx, self.name, args, self.call_type)
        return await run_in_step(lambda: self.request(call, ctx), ctx)

    async def request(self, call: Any, ctx: ToolContext) -> dict[str, Any]:
        """Send the request ``call`` with the step's key and deadline; its recorded JSON."""
        raise NotImplementedError


def recorded_lookup(fn: Callable[[str, dict[str, Any]], Lookup | Awaitable[Lookup]] | None,
                    key: str, args: dict[str, Any],
                    encode: Callable[[Any], Any]) -> Lookup | Awaitable[Lookup]:
    """A user's ``lookup(key, args)`` (plain or ``async``), its "applied" result encoded the
    way the step records a result (``encode``); without one, the outcome stays unknown."""
    if fn is None:
        return Lookup.unknown()

    def recorded(found: Lookup) -> Lookup:
        return Lookup.applied(encode(found.result)) if found.status == "applied" else found

    found = fn(key, args)
    if inspect.isawaitable(found):
        pending = found

        async def wrapped() -> Lookup:
            return recorded(await pending)

        return wrapped()
    return recorded(found)


def mcp_step_tools(base: str, listing: type[Tool], calling: type[Tool], shared: dict[str, Any],
                   call: dict[str, Any]) -> tuple[list[Tool], dict[str, str]]:
    """The pair of MCP steps under ``base`` and their names by role: ``<base>.tools`` (the
    server's tool list, effect-free, recorded once per run), ``<base>.call`` (a call) and
    ``<base>.read`` (a call of a tool the server marks read-only: effect-free). ``shared``
    are the attributes of all three, ``call`` those of the two calls."""
    names = {"tools": f"{base}.tools", "call": f"{base}.call", "read": f"{base}.read"}
    made = [make_step(listing, names["tools"], **shared),
            make_step(calling, names["call"], **shared, **call),
            make_step(calling, names["read"], **shared, **{
                **call, "effect_free": True, "cancellable": True, "requires_approval": False})]
    return made, names


# The configuration a run is pinned to (``durable.agents.configuration``) ----------------------


def model_id(model: Any) -> str:
    """A framework model as a run pins it: its id as given, or ``system:model_name``."""
    if model is None:
        return ""
    if isinstance(model, str):
        return model
    name = getattr(model, "model_name", None) or getattr(model, "model", None) or ""
    system = getattr(model, "system", None) or ""
    if system and name and not str(name).startswith(f"{system}:"):
        return f"{system}:{name}"
    return str(name) or type(model).__name__


def named(value: Any) -> Any:
    """An instruction as a run pins it: its text, or a function's qualified name (what the
    function returns is decided at run time, inside the model step)."""
    if callable(value):
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}"
    return value


def configured_by(derive: Callable[[], dict[str, Any]]) -> Callable[[Agent, Registry],
                                                                   dict[str, str]]:
    """An ``Agent.configuration`` for an integration's code agent: the default (its step
    tools, its policy version) with what ``derive`` reads from the framework's agent:
    ``model`` (an id), ``prompt`` (instructions: digested here) and ``tools`` (the
    framework's tool schemas, digested with the step tools')."""
    def configuration(agent: Agent, tools: Registry) -> dict[str, str]:
        base = Agent.configuration(agent, tools)
        own = derive()
        pinned = {**base, "model": str(own.get("model", "")),
                  "prompt": short_digest(own.get("prompt"))}
        if own.get("tools"):
            pinned["tools"] = short_digest([base["tools"], own["tools"]])
        return pinned

    return configuration
