"""The ``assistant`` agent: a model that calls tools, written as ordinary code.

This is the template for an LLM agent. It is a plain function: a loop that asks the model
what to do with the conversation so far, runs the tool calls it asks for, gives it their
results, and stops when the model answers in text. Everything durable about it comes from
five habits:

1. Every step goes through ``ctx``: the model call is ``chat(ctx, ...)`` (which is
   ``ctx.call("chat", ...)``, the built-in step of ``durable.models``) and each tool call is
   ``ctx.call(name, arguments)``; the tool calls of one reply run at once
   (``ctx.parallel``), each a step of its own. Each one is recorded in the run's log with its own
   idempotency key (``<run id>:<step>``) before it is sent, and its outcome after.
2. The conversation is a local variable, built only from the input and from what the steps
   returned. When a worker dies, another one runs the function again from the top: every
   step already in the log returns its recorded result without being sent (no model call
   is paid for twice, no notification is sent twice), so the same conversation is rebuilt
   and the function picks up where the log ends. Hence: no clock, no randomness, no I/O
   outside ``ctx.call``, and tool results are turned into messages canonically
   (``tool_message``: sorted-key JSON).
3. The model call is ``effect_free`` and logged as a digest (``log_args = "digest"``): a
   call in flight at a crash is sent again at once, and the log does not grow with the
   square of the conversation. Tool calls are effects: they carry the key and the deadline
   downstream and have a ``lookup`` (here, the pipeline's ``notify`` and ``write``), so one
   in flight at a crash is looked up by key, never sent blindly.
4. The model only ever reaches the tools this agent lists: a name it makes up, arguments
   that are not JSON, or a tool that fails become a result the model is told about, not a
   crash.
5. Budgets bound the loop: a model that never stops asking ends the run ``failed``
   (``budget_exhausted``) at 10 model calls or 30 steps, whichever comes first.

Where things are: the model is ``DURABLE_MODEL_BASE_URL`` (any OpenAI-compatible API;
``DURABLE_MODEL_API_KEY``, ``DURABLE_MODEL_NAME``), and the tools' world is
``DURABLE_WORLD_URL``. The world serves a scripted model too (``examples.world.model``: it
asks for ``notify``, then ``write``, then answers). Try it::

    python -m examples world &
    export DURABLE_MODEL_BASE_URL=http://127.0.0.1:8765/v1
    durable worker &
    durable start assistant --input '{"task": "Tell ops@example.com the report is ready"}'
    durable log RUN --follow          # the model's replies and the tool calls, step by step
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

# Importing durable.models registers the ``chat`` step; ``chat`` takes it, ``tool_message``
# turns a tool's result into the message that gives it to the model.
from durable.code import RunContext, StepFailed, agent
from durable.models import ChatReply, ToolCall, chat, tool_message, tool_schemas

# The tools the model may call are the pipeline's (registered when it is imported): they
# speak to the world with the key and the deadline, and implement ``lookup``.
from examples.agents import pipeline  # noqa: F401

#: What the model is told it is.
SYSTEM = ("You are an operations assistant. Use the tools to do what the user asks: notify "
          "people with `notify`, record what you did with `write`. Answer briefly when done.")

#: The tools, as the model sees them (OpenAI tool schemas), derived from the registered
#: tools' argument models (``args_model``). Their names are those of registered tools,
#: listed in the agent's ``tools`` below: nothing else can be called.
TOOLS: list[dict[str, Any]] = tool_schemas(["notify", "write"])
CALLABLE = frozenset(t["function"]["name"] for t in TOOLS)


class AssistantInput(BaseModel):
    task: str = Field(
        default="Tell ops@example.com that the nightly orders report is ready, and record it.",
        min_length=1, max_length=2000, description="what the user asks the assistant to do")


def refused(call: ToolCall) -> dict[str, Any] | None:
    """What the model is told about a call that never reaches a tool, or None."""
    if call.error:  # the model's arguments could not be read: tell it, call nothing
        return {"error": call.error}
    if call.name not in CALLABLE:  # a made-up tool: never reaches ctx.call
        return {"error": f"no tool {call.name!r}; the tools are {sorted(CALLABLE)}"}
    return None


def run_tools(ctx: RunContext, calls: Sequence[ToolCall]) -> list[Any]:
    """The tool calls of one reply, as steps taken at once (``ctx.parallel``: each its own
    step, key and outcome, numbered in the reply's order); what went wrong is a result."""
    results: list[Any] = [refused(call) for call in calls]
    sent = [i for i, call in enumerate(calls) if results[i] is None]
    outcomes = ctx.parallel([(calls[i].name, calls[i].arguments) for i in sent],
                            return_exceptions=True) if sent else []
    for i, outcome in zip(sent, outcomes, strict=True):
        # A failed or canceled call is recorded in the log; the model decides what next.
        results[i] = {"error": outcome.error, "error_type": outcome.error_type} \
            if isinstance(outcome, StepFailed) else outcome
    return results


@agent(input_model=AssistantInput, tools=("chat", *sorted(CALLABLE)), version="1",
       budgets={"model_calls": 10, "steps": 30})
def assistant(ctx: RunContext, inp: AssistantInput) -> dict[str, Any]:
    # The conversation: rebuilt identically on every execution of this function.
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": inp.task}]
    done: list[str] = []
    while True:
        # A model call: one step. After a crash, a recorded reply comes back from the log.
        reply: ChatReply = chat(ctx, messages, tools=TOOLS, temperature=0)
        messages.append(reply.message)  # the assistant's turn, tool calls included
        if not reply.tool_calls:  # the model answered: the run's result
            return {"answer": reply.content, "tools_called": done,
                    "model_calls": sum(1 for m in messages if m["role"] == "assistant")}
        # The reply's tool calls run at once, one step each.
        for call, result in zip(reply.tool_calls, run_tools(ctx, reply.tool_calls),
                                strict=True):
            done.append(call.name)
            messages.append(tool_message(call, result))
