"""Per-run budgets: steps, model calls and tokens.

An agent declares its limits (``Agent.budgets``), a start may override them, and the run
records them in ``run_started``; what was used is part of the folded state. Before each new
step the worker checks them: reaching one ends the run ``failed`` with reason
``budget_exhausted``. A looping agent therefore stops exactly at its limit.

``model_calls`` counts model requests sent: a model step's first dispatch and each one
after (a request that timed out and was sent again was paid for twice); a model call is
not sent again once the budget is reached (:func:`resend_exhausted`).
"""

from __future__ import annotations

from collections.abc import Mapping

from durable.errors import UsageError
from durable.log.state import RunState

#: The limits a run may have.
KINDS = ("steps", "model_calls", "tokens")

#: The reason a run ended by a budget carries.
REASON = "budget_exhausted"


def checked(budgets: Mapping[str, int]) -> dict[str, int]:
    """Budgets as given by an agent or a start, refused when malformed."""
    out = {}
    for kind, limit in budgets.items():
        if kind not in KINDS:
            raise UsageError(f"unknown budget {kind!r} (known: {', '.join(KINDS)})")
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise UsageError(f"budget {kind} must be a whole number >= 0, not {limit!r}")
        out[kind] = limit
    return out


def exhausted(state: RunState, model_call: bool) -> str | None:
    """Why the next step may not be taken, or None while every budget allows it."""
    limits = state.budgets
    if "steps" in limits and state.step >= limits["steps"]:
        return f"{state.step} steps taken, the limit is {limits['steps']}"
    if model_call and "model_calls" in limits and state.model_calls >= limits["model_calls"]:
        return f"{state.model_calls} model calls made, the limit is {limits['model_calls']}"
    if "tokens" in limits and state.tokens >= limits["tokens"]:
        return f"{state.tokens} tokens used, the limit is {limits['tokens']}"
    return None


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
    return None
