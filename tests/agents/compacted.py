"""A code agent whose long conversation is compacted (``durable.compaction``), for the
compaction tests (``tests.test_compaction``) and ``bench.compaction``: ``calls`` cycles of
a model call and a tool step, the conversation growing by two messages a cycle, its requests
bounded by ``max_tokens``; the summaries taken by a ``chat`` step of their own, or by a
function (``summarize_fn``) whose result is recorded as a value; and a session's turn of
``calls`` cycles that goes on from the conversation, and the summary, of the turn before
(``compacted_talker``). Registered on import."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from durable import conversations
from durable.code import RunContext, agent
from durable.compaction import ContextPolicy, Conversation


class CompactInput(BaseModel):
    calls: int = 100
    max_tokens: int = 400
    keep_last: int = 6
    summarize_fn: bool = False


def counted(messages: list[dict[str, Any]]) -> str:
    """A summary without a model: how many messages it stands for, and the last one."""
    return f"{len(messages)} messages, the last: {messages[-1].get('content')}"


@agent(input_model=CompactInput, tools=("chat", "noop"))
def compacted_looper(ctx: RunContext, inp: CompactInput) -> dict[str, Any]:
    policy = ContextPolicy(max_context_tokens=inp.max_tokens, keep_last=inp.keep_last,
                           summarize=counted if inp.summarize_fn else None)
    conv = Conversation(ctx, policy, [{"role": "system", "content": "You count with me."},
                                      {"role": "user", "content": "go"}])
    for n in range(inp.calls):
        conv.chat()
        done = ctx.call("noop", {"n": n})
        conv.append({"role": "user", "content": json.dumps(done, sort_keys=True)})
    return {"calls": inp.calls, "messages": len(conv.messages), "summaries": conv.summaries}


class TurnInput(BaseModel):
    calls: int = 20
    max_tokens: int = 400


@agent(input_model=TurnInput, tools=("chat", "noop", *conversations.TOOLS))
def compacted_talker(ctx: RunContext, inp: TurnInput) -> dict[str, Any]:
    conv = Conversation.resume(ctx, ContextPolicy(max_context_tokens=inp.max_tokens))
    if not conv.messages:
        conv.append({"role": "system", "content": "You count with me."})
    conv.append({"role": "user", "content": "go on"})
    for n in range(inp.calls):
        conv.chat()
        done = ctx.call("noop", {"n": n})
        conv.append({"role": "user", "content": json.dumps(done, sort_keys=True)})
    conv.save()
    return {"messages": len(conv.messages), "summaries": conv.summaries}
