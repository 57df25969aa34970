"""Code agents of the model-step tests (``tests.test_model_steps``): one ``chat`` step with
the options of the input, a loop of model calls each followed by a tool step (also
``bench.modelcalls``'s workload), and a conversation continued from run to run
(``durable.conversations``). Registered on import."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from durable import conversations
from durable.code import RunContext, agent
from durable.flow.limits import Limit
from durable.models import chat


class AskInput(BaseModel):
    question: str = "hello"
    stream: bool = False
    #: The call's own timeout and attempts (None: the settings').
    timeout_s: float | None = None
    max_attempts: int | None = None


@agent(input_model=AskInput, tools=("chat",))
def model_asker(ctx: RunContext, inp: AskInput) -> dict[str, Any]:
    """One model step; returns what the model said."""
    reply = chat(ctx, [{"role": "user", "content": inp.question}], stream=inp.stream,
                 timeout_s=inp.timeout_s, max_attempts=inp.max_attempts)
    return {"answer": reply.content, "usage": reply.usage}


class LoopInput(BaseModel):
    calls: int = 10


@agent(input_model=LoopInput, tools=("chat", "noop"))
def model_looper(ctx: RunContext, inp: LoopInput) -> dict[str, Any]:
    """``calls`` cycles of a model call and a tool step (``examples.agents``' ``noop``), the
    conversation growing: a tool-calling agent's loop, without reading what the model said."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for n in range(inp.calls):
        reply = chat(ctx, messages)
        messages.append(reply.message)
        done = ctx.call("noop", {"n": n})
        messages.append({"role": "user", "content": json.dumps(done, sort_keys=True)})
    return {"calls": inp.calls, "messages": len(messages)}


class TurnInput(BaseModel):
    #: What the user says this turn; ``pad`` characters of filler make the history large.
    say: str
    pad: int = 0
    #: Messages handed to the run itself (a history brought from elsewhere), after those of
    #: the run it continues.
    history: list[dict[str, Any]] = []


@agent(input_model=TurnInput, tools=("chat", *conversations.TOOLS))
def talker(ctx: RunContext, inp: TurnInput) -> dict[str, Any]:
    """One turn of a conversation that goes on from run to run: the history of the run it
    continues, the user's words, the model's answer; the whole conversation kept for the
    next run."""
    messages = [*conversations.load(ctx), *inp.history]
    messages.append({"role": "user", "content": inp.say + " " + "x" * inp.pad})
    reply = chat(ctx, messages)
    messages.append(reply.message)
    saved = conversations.save(ctx, messages)
    return {"turns": sum(1 for m in messages if m["role"] == "user"), "bytes": saved}


#: What the spender's tenants may spend on model calls per hour, together (tests/test_costs.py:
#: two calls of the local server's priced reply pass it).
SPEND_USD = 0.002


@agent(input_model=LoopInput, tools=("chat",),
       limits=(Limit("model-spend", key="{tenant}", spend_usd=SPEND_USD, per_s=3600),))
def spender(ctx: RunContext, inp: LoopInput) -> dict[str, Any]:
    """``calls`` model calls under a spend limit per tenant shared by every worker."""
    for n in range(inp.calls):
        chat(ctx, [{"role": "user", "content": f"call {n}"}])
    return {"calls": inp.calls}
