"""An agent for the recovery tests (``tests/test_liveness.py``): ``steps`` calls of an
effect-free tool that sleeps ``sleep_s``. Effect-free, so a run taken again after a fault
resends its open call at once (no deadline to wait for): its next log entry shows when it
was taken again."""

from __future__ import annotations

from pydantic import BaseModel, Field

from durable.agents import Agent, Call, Decision, Finish, register
from durable.log.state import RunState
from examples.agents.basic import Noop


class StepperInput(BaseModel):
    steps: int = Field(default=4, ge=0, le=1_000_000)
    sleep_s: float = Field(default=0.0, ge=0, le=600)


@register
class Tick(Noop):
    """``noop`` that is effect-free: a run taken again after its worker died sends it again
    at once (no deadline to wait for), so it writes at once."""

    name = "tick"
    timeout_s = 600.0
    effect_free = True


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
