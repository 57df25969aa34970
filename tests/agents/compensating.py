"""Tools that can be undone, and an agent that applies them and then holds, for the tests of
compensation (``tests/test_compensation.py``; workers import it through
``DURABLE_AGENTS``).

Every effect and every compensation is a row of the tests' SQLite database
(``tests.servers.effects``), keyed by its idempotency key: a compensation's key is its
step's key with ``:undo``, so the rows in insertion order show which effect was undone,
how often, and in which order.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel

from durable.agents import (
    Agent,
    Call,
    Cancel,
    Decision,
    Finish,
    Lookup,
    Tool,
    ToolContext,
    Wait,
    register,
)
from durable.log.state import RunState
from tests.agents.basic import SqlWrite


class Charge(Tool):
    """A charge that can be refunded: ``compensate`` writes the refund's row under its own
    key, and ``lookup_compensation`` asks the database for it. ``TEST_UNDO_SLOW_S`` makes
    the refund sleep first (a window to cancel or kill in)."""

    name = "charge"
    timeout_s = 2.0

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        SqlWrite().run(args, ctx)
        return {"charged": args.get("n"), "row": ctx.key}

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return SqlWrite().lookup(key, args)

    def compensate(self, args: dict[str, Any], outcome: Any, ctx: ToolContext) -> Any:
        import time

        time.sleep(float(os.environ.get("TEST_UNDO_SLOW_S", "0")))
        SqlWrite().run(args, ctx)
        return {"refunded": outcome["charged"], "row": ctx.key}

    def lookup_compensation(self, key: str, args: dict[str, Any]) -> Lookup:
        return SqlWrite().lookup(key, args)


class Notify(Tool):
    """An e-mail: sent is sent, it has no compensation."""

    name = "notify"
    timeout_s = 2.0

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return SqlWrite().run(args, ctx)

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return SqlWrite().lookup(key, args)


class Transfer(Charge):
    """A charge whose calls, refunds included, need an approver with the role ``finance``."""

    name = "transfer"
    requires_approval = True
    approver_role = "finance"
    approval_ttl_s = 120.0


for _tool in (Charge, Notify, Transfer):
    register(_tool)


class ShopInput(BaseModel):
    #: The tools called, one step each, in this order.
    plan: list[str] = []
    #: After the plan: hold (wait for input), or cancel with compensation itself.
    then: str = "hold"


@register
class Shop(Agent):
    """Calls the tools of its plan, then holds (waits for input) or, with ``then="undo"``,
    decides itself to cancel with compensation."""

    name = "shop"
    input_model = ShopInput
    tools = ("charge", "notify", "transfer")

    def decide(self, state: RunState) -> Decision:
        plan = state.input["plan"]
        if state.step < len(plan):
            return Call(plan[state.step], {"n": state.step + 1})
        if state.input["then"] == "undo":
            return Cancel("the order was abandoned", compensate=True)
        if state.last_wait is None or state.last_wait.kind != "input":
            return Wait("input", reason="holding the order", timeout_s=600)
        return Finish({"steps": state.step})
