"""A code agent that charges a card, for the counterfactual fork tests
(``tests.test_counterfactual_forks``; workers import it through ``DURABLE_AGENTS``): a model
step whose system prompt is the run's ``prompt`` (``v1`` unless a fork sets another), a
charge whose amount the prompt decides (``v2`` offers a discount), and a receipt. The charge
is a real row of the tests' SQLite database (``tests.agents.compensating``' ``charge``), the
receipt one too unless the fork simulates it (``receipt``, which ``simulates``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from durable.agents import Lookup, Tool, ToolContext, register
from durable.code import RunContext, agent
from durable.models import chat
from tests.agents import compensating  # noqa: F401  (registers the charge tool)
from tests.agents.basic import SqlWrite

PROMPTS = {"v1": "You sell at the list price.", "v2": "You offer a 100 cents discount."}


@register
class Receipt(Tool):
    """A receipt sent to the customer; in a fork that holds effects it is simulated."""

    name = "receipt"
    timeout_s = 2.0
    simulates = True

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        SqlWrite().run(args, ctx)
        return {"sent": args["cents"]}

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return SqlWrite().lookup(key, args)

    def simulate(self, args: Any) -> Any:
        return {"sent": args["cents"], "simulated": True}


class ShopInput(BaseModel):
    item: str = "a lamp"
    cents: int = 1000


@agent(input_model=ShopInput, tools=("chat", "charge", "receipt"))
def card_shopper(ctx: RunContext, inp: ShopInput) -> dict[str, Any]:
    prompt = ctx.overrides.get("prompt", "v1")
    reply = chat(ctx, [{"role": "system", "content": PROMPTS[prompt]},
                       {"role": "user", "content": f"I take {inp.item}"}])
    cents = inp.cents - 100 if prompt == "v2" else inp.cents
    ctx.call("charge", {"n": cents, "card": "4242"})
    sent = ctx.call("receipt", {"cents": cents})
    return {"charged": cents, "receipt": sent, "said": reply.content}


@agent(input_model=ShopInput, tools=("chat", "charge", "receipt"))
def card_splitter(ctx: RunContext, inp: ShopInput) -> dict[str, Any]:
    """``card_shopper`` whose charge and receipt go out at once (one parallel decision)."""
    prompt = ctx.overrides.get("prompt", "v1")
    chat(ctx, [{"role": "system", "content": PROMPTS[prompt]},
               {"role": "user", "content": f"I take {inp.item}"}])
    cents = inp.cents - 100 if prompt == "v2" else inp.cents
    _, sent = ctx.parallel([("charge", {"n": cents, "card": "4242"}),
                            ("receipt", {"cents": cents})])
    return {"charged": cents, "receipt": sent}
