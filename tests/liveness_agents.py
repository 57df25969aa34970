"""An agent for the recovery tests (``tests/test_liveness.py``): ``steps`` calls of an
effect-free tool that sleeps ``sleep_s``. Effect-free, so a run taken again after a fault
resends its open call at once (no deadline to wait for): its next log entry shows when it
was taken again."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from durable.agents import Agent, Call, Decision, Finish, Lookup, Tool, ToolContext, register
from durable.log.state import RunState


class StepperInput(BaseModel):
    steps: int = Field(default=4, ge=0, le=1_000_000)
    sleep_s: float = Field(default=0.0, ge=0, le=600)


@register
class Tick(Tool):
    name = "tick"
    timeout_s = 600.0
    cancellable = True
    effect_free = True

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        sleep = float(args.get("sleep_s", 0))
        if sleep and ctx.token.wait(sleep):
            ctx.check()
        return {"n": args.get("n")}

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()


@register
class Stepper(Agent):
    name = "stepper"
    version = "1"
    input_model = StepperInput
    tools = ("tick",)

    def decide(self, state: RunState) -> Decision:
        if state.step >= int(state.input["steps"]):
            return Finish({"steps": state.step})
        return Call("tick", {"n": state.step + 1, "sleep_s": state.input["sleep_s"]})
