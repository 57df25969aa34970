"""What a model call cost, in money, from a maintained price table.

Each model step's recorded outcome carries its cost (``ActionSucceeded.cost``, a
``durable.log.state.Cost``): the price of the reply's usage by token kind (input, cached input
read and written, output, audio), looked up in the ``genai-prices`` package's table for the
model and provider the call used, in US dollars as exact decimal text, with the table's name
and version (``genai-prices 0.2.5``): which prices a figure came from is part of the evidence,
and a later release of the table does not change what a run cost then.

A call whose price cannot be found costs **unknown**, never 0: no table installed
(``pip install 'durable-agents[costs]'``), a model the table does not know, a reply that
reported no usage. The run counts such calls (``RunState.uncosted``); a run with a budget in
a currency fails at one (``durable.flow.budgets``), since what it spent is no longer known.

The model: the reply's own ``model`` (``model_name``), else the request's (``args["model"]``).
The provider: the step tool's ``provider`` when it declares one, else a model id's prefix
(``openai:gpt-4o``, ``anthropic/claude-...``), else the table's best match for the model;
for the built-in ``chat`` step, the host of ``DURABLE_MODEL_BASE_URL`` when it is a provider's.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from durable.log.state import Cost

__all__ = ["USAGE_KINDS", "price", "table_version", "usage_of"]

#: The token kinds a price is computed from, under genai-prices' names, and the names
#: providers' replies give them (OpenAI's chat completions and responses, pydantic-ai's
#: ``RequestUsage``, the OpenAI Agents SDK's ``Usage``).
USAGE_KINDS: dict[str, tuple[str, ...]] = {
    "input_tokens": ("input_tokens", "prompt_tokens", "request_tokens"),
    "output_tokens": ("output_tokens", "completion_tokens", "response_tokens"),
    "cache_read_tokens": ("cache_read_tokens", "cached_tokens"),
    "cache_write_tokens": ("cache_write_tokens",),
    "input_audio_tokens": ("input_audio_tokens",),
    "output_audio_tokens": ("output_audio_tokens",),
}

_table: list[Any] = []


def _prices() -> Any:
    """The ``genai_prices`` module, or None when it is not installed."""
    if not _table:
        try:
            import genai_prices
        except ModuleNotFoundError:
            genai_prices = None  # type: ignore[assignment]
        _table.append(genai_prices)
    return _table[0]


def table_version() -> str:
    """The price table this process prices with ("" when none is installed)."""
    prices = _prices()
    return f"genai-prices {prices.__version__}" if prices is not None else ""


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        and value > 0 else 0


def usage_of(usage: Any) -> dict[str, int]:
    """A reply's usage by token kind (``USAGE_KINDS``), the kinds it does not report left
    out. OpenAI's nested details count too (``prompt_tokens_details.cached_tokens``,
    ``input_tokens_details.cached_tokens``)."""
    if not isinstance(usage, Mapping):
        return {}
    found: dict[str, int] = {}
    for kind, names in USAGE_KINDS.items():
        for name in names:
            n = _count(usage.get(name))
            if n:
                found[kind] = n
                break
    for nested in ("prompt_tokens_details", "input_tokens_details"):
        details = usage.get(nested)
        if isinstance(details, Mapping) and "cache_read_tokens" not in found:
            n = _count(details.get("cached_tokens"))
            if n:
                found["cache_read_tokens"] = n
    return found


def _provider(tool: Any, model: str, base_url: str) -> tuple[str, str]:
    """(provider id or "", the model id without a provider prefix)."""
    declared = getattr(tool, "provider", "")
    for sep in (":", "/"):
        prefix, found, rest = model.partition(sep)
        if found and prefix and rest:
            return (declared or prefix), rest
    if declared:
        return declared, model
    if getattr(tool, "name", "") == "chat" and base_url:
        from urllib.parse import urlsplit

        from durable.telemetry.tracing import PROVIDERS_BY_HOST

        return PROVIDERS_BY_HOST.get(urlsplit(base_url).hostname or "", ""), model
    return "", model


def price(tool: Any, args: Any, result: Any, base_url: str = "") -> Cost:
    """The cost of one model call that returned ``result`` for the request ``args``."""
    reply = result if isinstance(result, Mapping) else {}
    asked = args if isinstance(args, Mapping) else {}
    model = next((str(m) for m in (reply.get("model"), reply.get("model_name"),
                                   asked.get("model")) if isinstance(m, str) and m), "")
    tokens = usage_of(reply.get("usage"))
    table = table_version()
    if not table:
        return Cost(unknown="no price table installed (pip install "
                    "'durable-agents[costs]')", model=model, tokens=tokens)
    if not model:
        return Cost(unknown="the call names no model", prices=table, tokens=tokens)
    if not tokens:
        return Cost(unknown="the reply reported no usage", prices=table, model=model)
    provider, ref = _provider(tool, model, base_url)
    named = reply.get("provider_name") or reply.get("provider")
    if not provider and isinstance(named, str):
        provider = named
    prices = _prices()
    try:
        calc = prices.calc_price(prices.Usage(**tokens), ref, provider_id=provider or None)
    except (LookupError, ValueError) as exc:
        return Cost(unknown=f"{model}: {exc}"[:300], prices=table, model=model,
                    provider=provider, tokens=tokens)
    return Cost(usd=_text(calc.total_price), input_usd=_text(calc.input_price),
                output_usd=_text(calc.output_price), prices=table, model=model,
                provider=str(calc.provider.id), tokens=tokens)


def _text(amount: Decimal) -> str:
    return format(amount.normalize(), "f") if amount else "0"
