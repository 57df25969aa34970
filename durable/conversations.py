"""Sessions: a run that goes on with an earlier run's conversation, by reference.

A producer starts the next turn of a conversation as a new run that names the run it
continues::

    client.start("talker", {"say": "and then?"}, continue_from="turn-1")

or as the next turn of a named session (``start(..., session="support-42")``: the session's
latest run is the one continued, ``durable.controls.sessions``).

The new run's ``run_started`` records the reference (``continue_from``); nothing of the
conversation goes through the input, so the input limit (``DURABLE_MAX_PAYLOAD_BYTES``)
does not cap it. The run it continues must have completed (else ``UsageError``, nothing written).

An agent reads and keeps its conversation with two steps, the tools of :data:`TOOLS`
(declare them in the agent's ``tools``)::

    messages = conversations.load(ctx)      # the earlier run's conversation ([] if none)
    ...                                     # chat steps, tool steps
    conversations.save(ctx, messages)       # kept for the run that continues this one

- ``conversation.load`` reads the conversation the earlier run kept: the result of its last
  ``conversation.save`` step, else what that run itself loaded. The result is recorded in
  this run's log like any step's, so re-execution after a crash gets it from there; a
  large one (over the inline limit) is kept beside the run (``durable.log.blobs``: its
  own key in the run's slot, checked against its digest, archived and expired with the
  run), up to ``DURABLE_MAX_RESULT_BYTES``.
- ``conversation.save`` records the messages as its result (its arguments are logged by
  digest, ``log_args = "digest"``, so they are stored once).

Both results are model context (``context = True``): with ``DURABLE_CONTEXT_RETENTION`` they
are removed that long after the run ends (``durable.log.context``), and a run that
continues one whose conversation is gone fails its load with ``ConversationMissing``.

Both are effect-free: after a crash an open one is simply taken again. The functions take
any context with ``call`` (a code agent's ``RunContext``); an integration that drives a
framework's agent inside a code agent uses the same two steps: ``load`` gives the message
list to hand the framework as its history, ``save`` keeps the list it ends with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from durable.agents import Lookup, Tool, ToolContext, register
from durable.controls.children import ClientTool
from durable.controls.sessions import LOAD as LOAD  # re-exported: the step names
from durable.controls.sessions import SAVE as SAVE
from durable.controls.sessions import kept_outcome
from durable.errors import DurableError, UsageError
from durable.log import blobs, context
from durable.log import events as ev

#: The tools an agent that continues conversations declares.
TOOLS = (LOAD, SAVE)


class ConversationMissing(DurableError):
    """The run a run continues kept no conversation, or cannot be read any more."""


def load(ctx: Any) -> list[dict[str, Any]]:
    """The conversation of the run this one continues (a step): a list of messages, empty
    when the run continues none."""
    return list(ctx.call(LOAD, {})["messages"])


def save(ctx: Any, messages: Sequence[Mapping[str, Any]]) -> int:
    """Keep ``messages`` as this run's conversation (a step); returns its size in bytes."""
    plain = [dict(m) for m in messages]
    ctx.call(SAVE, {"messages": plain})
    return len(msgspec.json.encode(plain))


async def aload(ctx: Any) -> list[dict[str, Any]]:
    """``load`` for an ``async def`` agent."""
    return list((await ctx.call(LOAD, {}))["messages"])


async def asave(ctx: Any, messages: Sequence[Mapping[str, Any]]) -> int:
    """``save`` for an ``async def`` agent."""
    plain = [dict(m) for m in messages]
    await ctx.call(SAVE, {"messages": plain})
    return len(msgspec.json.encode(plain))


def kept(client: Any, run_id: str) -> list[dict[str, Any]] | None:
    """The conversation ``run_id`` kept (its last ``save``, else its last ``load``), read
    from its log and, when large, from beside it (checked against its digest); None when
    it kept none."""
    entries = client.events(run_id)
    outcome = kept_outcome(entries)
    if outcome is None:
        return None
    value = outcome.result
    gone = context.removed(entries).get(outcome.blob.field) if outcome.blob else None
    if gone is not None:
        raise ConversationMissing(f"run {run_id!r}: its conversation was removed at "
                                  f"{gone.at} ms ({gone.setting}, entry {gone.entry})")
    if outcome.blob is not None:
        data = client.redis.hget(client.log.keys.blobs(run_id), outcome.blob.field)
        value = blobs.value_of(outcome.blob, data, client.log.keyring, step=outcome.step)
    messages = value.get("messages") if isinstance(value, dict) else None
    if not isinstance(messages, list):
        raise ConversationMissing(f"run {run_id!r} step {outcome.step}: not a conversation")
    return messages


def conversation_before(client: Any, run_id: str) -> tuple[str, list[dict[str, Any]]]:
    """(the run whose conversation is continued, its messages) for a run that continues
    ``run_id`` ("" for none: ``("", [])``). A run that did not complete and kept nothing (a
    session's turn that failed before its load) is passed over for the run it continued; a
    completed one that kept nothing raises ``ConversationMissing``."""
    seen: set[str] = set()
    while run_id and run_id not in seen:
        seen.add(run_id)
        if not client.log.exists(run_id):
            raise ConversationMissing(f"run {run_id!r}, whose conversation this run "
                                      "continues, no longer exists (expired or archived)")
        messages = kept(client, run_id)
        if messages is not None:
            return run_id, messages
        if client.log.projection(run_id).get("state") == "completed":
            raise ConversationMissing(f"run {run_id!r} kept no conversation "
                                      f"({SAVE} or {LOAD} steps)")
        run_id = continued_from(client, run_id)
    return "", []


def continued_from(client: Any, run_id: str) -> str:
    """The run ``run_id`` continues ("" for none), from its ``run_started``."""
    first = client.log.read(run_id, "-", "+", count=1)
    started = first[0].event if first else None
    return started.continue_from if isinstance(started, ev.RunStarted) else ""


@register
class LoadConversation(ClientTool):
    """``{}`` -> ``{"run": the run continued ("" for none), "messages": [...]}``."""

    name = LOAD
    timeout_s = 60.0
    effect_free = True
    context = True

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        client = self.client()
        earlier, messages = conversation_before(client, continued_from(client, ctx.run_id))
        return {"run": earlier, "messages": messages}


@register
class SaveConversation(Tool):
    """``{"messages": [...]}`` -> the same, recorded as this run's conversation."""

    name = SAVE
    timeout_s = 30.0
    effect_free = True
    context = True
    log_args = "digest"

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        messages = args.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise UsageError(f"{SAVE}: 'messages' must be a list of objects")
        return {"messages": messages}

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()
