"""A handoff inside a durable run: the step ``<name>.handoff``, and the run context its
``on_handoff`` callback changed, recorded with the step and restored whenever the run's
function is executed again.

The SDK runs ``on_handoff`` "for side effects or bookkeeping": it may act on the outside
world, draw something at random, and set fields of the run context that the next agent's
tools and instructions read. Running it again on recovery would repeat its effects and draw
again, so the callback is part of the step: it runs in the worker while the function waits,
at least once (an effect-free step: a crash before its outcome is recorded runs it again,
its idempotency key ``step_context().key`` the same), and never once recorded. The step
records, with the agent handed to, what the callback changed in the context
(``{"set": {field: JSON}, "unset": [field]}``); every execution of the function applies
that record to its own context when the step returns: nothing to do where the callback
just ran, the callback's changes where the outcome came from the log.

The context's fields are a mapping's items, else the object's attributes (a dataclass, a
pydantic model, a plain object). A changed field is recorded as JSON and restored as the
type the context declares for it (a dataclass or model field's annotation, validated by
pydantic: a nested dataclass comes back a dataclass, a date a date), else as the JSON value.
A change that cannot be recorded (a value JSON cannot carry, the context replaced by another
object) fails the step, naming it, rather than be lost after a crash. A field JSON cannot
carry is compared by its type only: the callback may change such a field (a client), but
that change is not restored.
"""

from __future__ import annotations

import dataclasses
import typing
import weakref
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from agents import Agent, Handoff, handoff
from pydantic import BaseModel, TypeAdapter
from pydantic_core import PydanticSerializationError, to_jsonable_python

from durable.agents import ToolContext
from durable.integrations.base import DEFAULT_TIMEOUT_S, EffectFreeStep, run_in_step, stable
from durable.integrations.openai_agents.run import AgentOwner, AgentRunFailed, bound


class HandoffOwner(AgentOwner, Protocol):
    """What a durable handoff knows of its ``DurableAgent``."""

    #: The clone of each agent of the graph, by name.
    clones: dict[str, Agent[Any]]
    #: The name of the handoff step tool.
    handoff_step: str


@dataclass(frozen=True)
class HandoffCall:
    handoff: Handoff[Any, Any]
    context: Any
    arguments: str


class HandoffStep(EffectFreeStep):
    """``<name>.handoff``: a handoff to another agent of the run (the SDK's
    ``on_invoke_handoff``, with the handoff's ``on_handoff`` callback); records the agent
    handed to and what the callback changed in the run context. Sent again at once after a
    crash, like a read."""

    timeout_s = DEFAULT_TIMEOUT_S
    owner: ClassVar[AgentOwner]

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        call = self.owner.handed(ctx, self.name, args, HandoffCall)

        async def invoke() -> dict[str, Any]:
            was = getattr(call.context, "context", None)
            before = snapshot(was)
            agent = await call.handoff.on_invoke_handoff(call.context, call.arguments)
            out: dict[str, Any] = {"agent": agent.name}
            changed = changes(call.handoff.tool_name, before, was,
                              getattr(call.context, "context", None))
            if changed is not None:
                out["context"] = changed
            return out

        return await run_in_step(invoke, ctx)


def durable_handoff(owner: HandoffOwner, item: Agent[Any] | Handoff[Any, Any]
                    ) -> Handoff[Any, Any]:
    """``item`` inside ``owner``'s durable run: its invocation is the handoff step, and what
    the step recorded of the context is applied to this execution's context."""
    original = handoff(item) if isinstance(item, Agent) else item

    async def invoke(rctx: Any, arguments: str) -> Agent[Any]:
        b = bound(owner)
        if b is None:
            target = await original.on_invoke_handoff(rctx, arguments)
            return owner.clones.get(target.name, target)
        args = {"to": original.agent_name, "tool": original.tool_name, "arguments": arguments}
        got = await b.step(owner.handoff_step, args, HandoffCall(original, rctx, arguments))
        clone = owner.clones.get(str(got.get("agent")))
        if clone is None:
            raise AgentRunFailed(LookupError(f"handoff to {got.get('agent')!r}, an agent "
                                             f"DurableAgent({owner.name!r}) does not know"))
        restore(getattr(rctx, "context", None), got.get("context"))
        return clone

    durable = dataclasses.replace(original, on_invoke_handoff=invoke)
    target = owner.clones.get(original.agent_name)
    durable._agent_ref = weakref.ref(target) if target is not None else None
    return durable


# The context's changes --------------------------------------------------------------------


def fields(context: Any) -> dict[Any, Any]:
    """The context's fields: a mapping's items, else its attributes (none for ``None``)."""
    if context is None:
        return {}
    if isinstance(context, Mapping):
        return dict(context)
    if dataclasses.is_dataclass(context) and not hasattr(context, "__dict__"):  # slots
        return {f.name: getattr(context, f.name) for f in dataclasses.fields(context)}
    return dict(getattr(context, "__dict__", {}))


def snapshot(context: Any) -> dict[Any, Any]:
    """The context's fields as JSON, to compare (what JSON cannot carry: its type)."""
    return {name: stable(value) for name, value in fields(context).items()}


def changes(tool: str, before: dict[Any, Any], was: Any, now: Any) -> dict[str, Any] | None:
    """What the ``on_handoff`` of the handoff ``tool`` changed in the context (``before``
    its snapshot, ``was`` the context then, ``now`` the context after): ``{"set",
    "unset"}``, or None when nothing changed. ``TypeError`` for a change that cannot be
    recorded."""
    if now is not was:
        raise TypeError(f"the on_handoff of {tool!r} replaced the run's context: change "
                        "its fields instead, so that they can be restored after a crash")
    after = fields(now)
    changed: dict[str, Any] = {}
    for name, value in after.items():
        if name in before and stable(value) == before[name]:
            continue
        if not isinstance(name, str):
            raise TypeError(f"the on_handoff of {tool!r} changed the context's key "
                            f"{name!r}: only fields named by strings can be recorded")
        try:
            changed[name] = to_jsonable_python(value)
        except PydanticSerializationError as exc:
            raise TypeError(f"the on_handoff of {tool!r} set the context's {name!r} to a "
                            f"{type(value).__name__}, which JSON cannot carry: it could not "
                            "be restored after a crash") from exc
    unset = sorted(str(name) for name in before if name not in after)
    if not changed and not unset:
        return None
    return {**({"set": changed} if changed else {}), **({"unset": unset} if unset else {})}


def restore(context: Any, recorded: Any) -> None:
    """Apply the ``recorded`` changes to ``context``: each field that is not as recorded
    is set, as the type the context declares for it; each removed one is removed."""
    if context is None or not isinstance(recorded, dict):
        return
    current = fields(context)
    declared = _declared(context)
    for name, value in (recorded.get("set") or {}).items():
        if name in current and stable(current[name]) == value:
            continue  # already so: the callback ran in this execution
        hint = declared.get(name)
        _assign(context, name, value if hint is None else
                TypeAdapter(hint).validate_python(value))
    for name in recorded.get("unset") or ():
        if name in current:
            if isinstance(context, MutableMapping):
                del context[name]
            else:
                delattr(context, name)


def _declared(context: Any) -> dict[str, Any]:
    """The types the context declares for its fields (none for a mapping)."""
    if isinstance(context, Mapping):
        return {}
    if isinstance(context, BaseModel):
        return {name: f.annotation for name, f in type(context).model_fields.items()}
    try:
        return typing.get_type_hints(type(context))
    except Exception:  # an annotation that does not resolve: the JSON value as it is
        return {}


def _assign(context: Any, name: str, value: Any) -> None:
    if isinstance(context, MutableMapping):
        context[name] = value
    else:
        setattr(context, name, value)
