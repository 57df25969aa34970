"""Per-run budgets: steps, model calls, tokens and money.

An agent declares its limits (``Agent.budgets``), a start may override them, and the run
records them in ``run_started``; what was used is part of the folded state. Before each new
step the worker checks them: reaching one ends the run ``failed`` with reason
``budget_exhausted``. A looping agent therefore stops exactly at its limit.

``model_calls`` counts model requests sent: a model step's first dispatch and each one
after (a request that timed out and was sent again was paid for twice); a model call is
not sent again once the budget is reached (:func:`resend_exhausted`).

``usd`` bounds what the run's model calls cost (``durable.costs``: each priced from its
reply's usage when its outcome is recorded), given in dollars (``{"usd": 2.5}``) and recorded
in millionths of one (``usd_micros``). A model call whose cost is unknown (a model the price
table does not know, no table installed) ends a run with a ``usd`` budget as the call that
crosses it does: what the run spent can no longer be kept under the limit. Children do not
share it (``share_budgets`` shares model calls and tokens).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from durable.errors import UsageError
from durable.log.state import RunState

#: The limits a run may have.
KINDS = ("steps", "model_calls", "tokens", "usd")
#: How a ``usd`` budget is recorded: millionths of a dollar.
USD_MICROS = "usd_micros"

#: The reason a run ended by a budget carries.
REASON = "budget_exhausted"


def checked(budgets: Mapping[str, Any]) -> dict[str, int]:
    """Budgets as given by an agent or a start, refused when malformed; ``usd`` (dollars,
    a number or decimal text) as ``usd_micros`` (a recorded budget is taken as it is)."""
    out = {}
    for kind, limit in budgets.items():
        if kind == "usd":
            try:
                amount = Decimal(str(limit)) if not isinstance(limit, bool) else Decimal(-1)
            except ArithmeticError:
                amount = Decimal(-1)
            if not amount.is_finite() or amount < 0:
                raise UsageError(f"budget usd must be an amount of dollars >= 0, not {limit!r}")
            out[USD_MICROS] = int((amount * 1_000_000).to_integral_value(ROUND_HALF_UP))
            continue
        if kind not in (*KINDS, USD_MICROS):
            raise UsageError(f"unknown budget {kind!r} (known: {', '.join(KINDS)})")
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise UsageError(f"budget {kind} must be a whole number >= 0, not {limit!r}")
        out[kind] = limit
    return out


def dollars(micros: int) -> str:
    """Millionths of a dollar as ``$1.234567`` (trailing zeros left out)."""
    return usd_text(Decimal(micros) / 1_000_000)


def usd_text(amount: Decimal | str) -> str:
    """An amount of dollars for people: ``$0.00120075``, ``$2.5``, ``$0``."""
    value = Decimal(amount or "0")
    text = format(value.normalize(), "f") if value else "0"
    return f"${text}"


def _money(state: RunState) -> str | None:
    limit = state.budgets.get(USD_MICROS)
    if limit is None:
        return None
    if state.uncosted:
        return (f"{state.uncosted} model call(s) of unknown cost: the budget of "
                f"{dollars(limit)} cannot be kept (see durable.costs)")
    if Decimal(state.cost_usd or "0") * 1_000_000 >= limit:
        return f"{usd_text(state.cost_usd)} spent, the limit is {dollars(limit)}"
    return None


def exhausted(state: RunState, model_call: bool) -> str | None:
    """Why the next step may not be taken, or None while every budget allows it."""
    limits = state.budgets
    if "steps" in limits and state.step >= limits["steps"]:
        return f"{state.step} steps taken, the limit is {limits['steps']}"
    if model_call and "model_calls" in limits and state.model_calls >= limits["model_calls"]:
        return f"{state.model_calls} model calls made, the limit is {limits['model_calls']}"
    if "tokens" in limits and state.tokens >= limits["tokens"]:
        return f"{state.tokens} tokens used, the limit is {limits['tokens']}"
    return _money(state)


def resend_exhausted(state: RunState, model_call: bool, attempts: int) -> str | None:
    """Why a model call already sent ``attempts`` times may not be sent again: every
    request sent counts against "model_calls" (the fold counts each dispatch), and "tokens"
    holds what the replies reported. None for other calls and first sends."""
    if not model_call or attempts < 1:
        return None
    limits = state.budgets
    if "model_calls" in limits and state.model_calls >= limits["model_calls"]:
        return (f"{state.model_calls} model requests sent, the limit is "
                f"{limits['model_calls']}")
    if "tokens" in limits and state.tokens >= limits["tokens"]:
        return f"{state.tokens} tokens used, the limit is {limits['tokens']}"
    return _money(state)


def spent(cost_usd: str, uncosted: int) -> str:
    """What a run's model calls cost, for people: ``$0.0123``, with the calls of unknown
    cost said (``+ 2 calls of unknown cost``; only those: ``unknown``)."""
    priced = bool(cost_usd and Decimal(cost_usd))
    if uncosted and not priced:
        return f"unknown ({uncosted} model call{'s' if uncosted > 1 else ''})"
    more = f" + {uncosted} call{'s' if uncosted > 1 else ''} of unknown cost" if uncosted else ""
    return usd_text(cost_usd) + more
