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


def _looped(ctx: RunContext, inp: LoopInput, first: str = "go",
            bumped: int | None = None) -> dict[str, Any]:
    """``model_looper``'s loop, its first message ``first``, and the ``noop`` of cycle
    ``bumped`` sending ``n`` plus one."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": first}]
    for n in range(inp.calls):
        reply = chat(ctx, messages)
        messages.append(reply.message)
        done = ctx.call("noop", {"n": n + 1 if n == bumped else n})
        messages.append({"role": "user", "content": json.dumps(done, sort_keys=True)})
    return {"calls": inp.calls, "messages": len(messages)}


@agent(input_model=LoopInput, tools=("chat", "noop"))
def looper_other_argument(ctx: RunContext, inp: LoopInput) -> dict[str, Any]:
    """``model_looper`` whose third tool step (step 6) sends ``n`` plus one."""
    return _looped(ctx, inp, bumped=2)


@agent(input_model=LoopInput, tools=("chat", "noop"))
def looper_other_prompt(ctx: RunContext, inp: LoopInput) -> dict[str, Any]:
    """``model_looper`` with another first message: its first model request differs."""
    return _looped(ctx, inp, first="go on, then")


@register
class CountOtherThird(Count):
    """``count`` whose third step counts from 30."""

    name = "count_other_third"

    def decide(self, state: RunState) -> Decision:
        decision = super().decide(state)
        if isinstance(decision, Call) and state.step == 2:
            return Call("noop", {**decision.args, "n": 30})
        return decision
