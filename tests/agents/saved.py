"""Agents of the saved-run tests (``tests.test_saved_runs``): changed versions of agents
whose runs are saved and replayed offline against them. Each differs from the recorded
agent in one thing: a tool's argument at one step, the prompt of its first model request,
the arguments of a ``decide()`` agent's third step. Registered on import, under names of
their own (a test hands them to the replay explicitly)."""

from __future__ import annotations

import json
from typing import Any

from durable.agents import Call, Decision, register
from durable.code import RunContext, agent
from durable.log.state import RunState
from durable.models import chat
from examples.agents.basic import Count
from tests.agents.model_steps import LoopInput


@agent(input_model=LoopInput, tools=("chat", "noop"))
def looper_other_argument(ctx: RunContext, inp: LoopInput) -> dict[str, Any]:
    """``model_looper`` whose third tool step (step 6) sends ``n`` plus one."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for n in range(inp.calls):
        reply = chat(ctx, messages)
        messages.append(reply.message)
        done = ctx.call("noop", {"n": n + 1 if n == 2 else n})
        messages.append({"role": "user", "content": json.dumps(done, sort_keys=True)})
    return {"calls": inp.calls, "messages": len(messages)}


@agent(input_model=LoopInput, tools=("chat", "noop"))
def looper_other_prompt(ctx: RunContext, inp: LoopInput) -> dict[str, Any]:
    """``model_looper`` with another first message: its first model request differs."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go on, then"}]
    for n in range(inp.calls):
        reply = chat(ctx, messages)
        messages.append(reply.message)
        done = ctx.call("noop", {"n": n})
        messages.append({"role": "user", "content": json.dumps(done, sort_keys=True)})
    return {"calls": inp.calls, "messages": len(messages)}


@register
class CountOtherThird(Count):
    """``count`` whose third step counts from 30."""

    name = "count_other_third"

    def decide(self, state: RunState) -> Decision:
        decision = super().decide(state)
        if isinstance(decision, Call) and state.step == 2:
            return Call("noop", {**decision.args, "n": 30})
        return decision
