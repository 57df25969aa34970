"""An agent and a tool with sensitive fields (``durable.security.sealing``): loaded only by the
tests that set ``DURABLE_ENCRYPTION_KEYS`` (a worker that loads them without keys refuses to
start)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr

from durable.agents import Agent, Call, Decision, Finish, Lookup, Tool, ToolContext, register
from durable.log.state import RunState


class CardInput(BaseModel):
    holder: str
    card_number: SecretStr          # sealed by being a SecretStr
    amount: int = 10


@register
class ChargeCard(Tool):
    """Writes what it received to ``TEST_SEEN_FILE`` (the test checks it got the card in
    clear) and returns an authorization code, a sensitive result field."""

    name = "charge_card"
    timeout_s = 5.0
    sensitive = ("card_number", "auth_code")

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        seen = os.environ.get("TEST_SEEN_FILE")
        if seen:
            with open(seen, "a") as out:
                out.write(f"{ctx.key} {args['card_number']}\n")
        return {"auth_code": f"AUTH-{args['card_number'][-4:]}-{ctx.key}", "amount": args["amount"]}

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        seen = os.environ.get("TEST_SEEN_FILE")
        if seen and Path(seen).exists() and key in Path(seen).read_text():
            return Lookup.applied({"auth_code": "AUTH-from-lookup", "amount": args["amount"]})
        return Lookup.not_applied()


@register
class Checkout(Agent):
    name = "secret_checkout"
    input_model = CardInput
    tools = ("charge_card",)
    sensitive = ("receipt",)

    def decide(self, state: RunState) -> Decision:
        if state.step == 0:
            return Call("charge_card", {"card_number": state.input["card_number"],
                                        "amount": state.input["amount"]})
        last = state.last
        assert last is not None and last.status == "succeeded", last
        return Finish({"receipt": last.result["auth_code"], "holder": state.input["holder"]})


class AskInput(BaseModel):
    question: str = "code?"


@register
class SecretAsker(Agent):
    """Waits for an answer holding a one-time code (sensitive), then says whether it got
    the code in clear."""

    name = "secret_asker"
    input_model = AskInput
    sensitive = ("otp",)

    def decide(self, state: RunState) -> Decision:
        from durable.agents import Wait

        if state.last_wait is None:
            return Wait("input", reason=state.input["question"])
        response = state.last_wait.response
        return Finish({"otp_length": len(response["otp"]), "clear": response["otp"].isdigit()})


@register
class ApprovedCharge(ChargeCard):
    """A card charge an approver with the role ``finance`` must approve: the approval's
    digest covers the card number in clear."""

    name = "approved_charge"
    requires_approval = True
    approver_role = "finance"
    approval_ttl_s = 120.0


@register
class SecretPayer(Agent):
    name = "secret_payer"
    input_model = CardInput
    tools = ("approved_charge",)

    def decide(self, state: RunState) -> Decision:
        if state.step == 0:
            return Call("approved_charge", {"card_number": state.input["card_number"],
                                            "amount": state.input["amount"]})
        last = state.last
        assert last is not None
        return Finish({"status": last.status})
