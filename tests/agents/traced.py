"""An agent whose tool opens a span of its own (``tests/test_tracing.py``): it must be a child
of the step's span although the tool runs on the worker's tool thread."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from pydantic import BaseModel

from durable.agents import Agent, Call, Decision, Finish, Lookup, Tool, ToolContext, register
from durable.log.state import RunState


class TracedInput(BaseModel):
    steps: int = 2


@register
class Traced(Tool):
    name = "traced"
    timeout_s = 10.0

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        with trace.get_tracer("tests").start_as_current_span("tool work"):
            return {"n": args.get("n")}

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()


@register
class Tracer(Agent):
    name = "tracer"
    input_model = TracedInput
    tools = ("traced",)

    def decide(self, state: RunState) -> Decision:
        if state.step >= int(state.input["steps"]):
            return Finish({"steps": state.step})
        return Call("traced", {"n": state.step + 1})
