"""An agent that asks for input with a form (the wait's ``data`` names its schema), as a
front door turns into an MCP elicitation; registered when this module is imported."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from durable.code import RunContext, agent

#: The form ``booker`` asks for.
FORM = {"type": "object", "required": ["seats"],
        "properties": {"seats": {"type": "integer", "minimum": 1, "title": "Seats"},
                       "window": {"type": "boolean", "title": "Window seat"}}}


class TripInput(BaseModel):
    to: str = "Lisbon"


@agent(tools=("noop",))
def booker(ctx: RunContext, inp: TripInput) -> dict[str, Any]:
    """Asks how many seats (a form), takes one step, returns the booking."""
    form = ctx.wait("input", reason=f"How many seats to {inp.to}?", timeout_s=300,
                    data={"schema": FORM})
    ctx.call("noop", {"n": 1})
    return {"to": inp.to, "seats": form["seats"], "window": bool(form.get("window"))}
