"""The smallest agent: ``steps`` calls of a no-op tool, then finish.

Used by the benchmarks and the tests as a baseline with no external system.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from durable.agents import Agent, Call, Decision, Finish, Lookup, Tool, ToolContext, register
from durable.log.state import RunState


class CountInput(BaseModel):
    steps: int = Field(default=4, ge=0, le=1_000_000)
    sleep_s: float = Field(default=0.0, ge=0, le=60)


@register
class Noop(Tool):
    name = "noop"
    timeout_s = 10.0
    cancellable = True

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        sleep = float(args.get("sleep_s", 0))
        if sleep and ctx.token.wait(sleep):
            ctx.check()
        return {"n": args.get("n")}

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        # Nothing outside the worker: a no-op has no effect to look for.
        return Lookup.not_applied()


@register
class Count(Agent):
    name = "count"
    version = "1"
    input_model = CountInput
    tools = ("noop",)

    def decide(self, state: RunState) -> Decision:
        steps = int(state.input["steps"])
        if state.step >= steps:
            return Finish({"steps": state.step})
        return Call("noop", {"n": state.step + 1, "sleep_s": state.input.get("sleep_s", 0)})
