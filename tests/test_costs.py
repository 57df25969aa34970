"""Money (``durable.costs``): each model call's cost, priced from its reply's usage by the
``genai-prices`` table, recorded with the table's version; shown per run, per agent and
tenant; bounding a run (``budgets={"usd": ...}``) and a tenant's spend per period shared by
every worker. A model the table does not know costs "unknown", never 0.

The built-in ``chat`` step of real worker processes against a local OpenAI-compatible
server (``tests.servers.model``) whose replies name a model the table prices
(``gpt-4o-mini``) or one it does not (``local``); the expected prices are computed here from
the same table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import genai_prices
import pytest

from durable.client import Client
from durable.log import events as ev
from durable.telemetry.metrics import exposition
from tests.agents.model_steps import SPEND_USD
from tests.conftest import WorkerFactory, run_durable
from tests.runs import events_of
from tests.servers.model import ModelServer
from tests.test_metrics import samples

AGENTS = "examples.agents,tests.agents.basic,tests.agents.model_steps"
#: Tokens of each reply (its prompt is 5 tokens): a priced call costs about $0.0012.
REPLY_TOKENS = 2000


def price_of_one_call() -> Decimal:
    calc = genai_prices.calc_price(genai_prices.Usage(input_tokens=5, output_tokens=REPLY_TOKENS),
                                   "gpt-4o-mini", provider_id="openai")
    return Decimal(calc.total_price)


def _serve(monkeypatch: pytest.MonkeyPatch, model: str) -> ModelServer:
    srv = ModelServer(tokens=REPLY_TOKENS, model=model).start()
    monkeypatch.setenv("DURABLE_MODEL_BASE_URL", srv.url)
    monkeypatch.setenv("DURABLE_AGENTS", AGENTS)
    return srv


@pytest.fixture()
def priced(monkeypatch: pytest.MonkeyPatch, settings: Any, client: Client
           ) -> Iterator[ModelServer]:
    srv = _serve(monkeypatch, "gpt-4o-mini")
    client.registry.load(AGENTS)
    yield srv
    srv.stop()


@pytest.fixture()
def unpriced(monkeypatch: pytest.MonkeyPatch, settings: Any, client: Client
             ) -> Iterator[ModelServer]:
    srv = _serve(monkeypatch, "local")
    client.registry.load(AGENTS)
    yield srv
    srv.stop()


def test_each_model_call_records_its_price_and_the_run_adds_them_up(
        client: Client, worker: WorkerFactory, priced: ModelServer) -> None:
    run = client.start("model_looper", {"calls": 3}, tenant="acme").run_id
    worker(burst=True).wait(60)
    final = client.status(run)
    assert final.state == "completed", (final.state, final.error)
    one = price_of_one_call()
    costs = [e.cost for e in events_of(client, run)
             if isinstance(e, ev.ActionSucceeded) and e.cost is not None]
    assert len(costs) == 3  # the model calls, and only them (the noop steps have none)
    for cost in costs:
        assert Decimal(cost.usd) == one
        assert (cost.model, cost.provider) == ("gpt-4o-mini", "openai")
        assert cost.prices == f"genai-prices {genai_prices.__version__}"
        assert cost.tokens == {"input_tokens": 5, "output_tokens": REPLY_TOKENS}
        assert Decimal(cost.input_usd) + Decimal(cost.output_usd) == one
    assert Decimal(final.cost_usd) == 3 * one and final.uncosted == 0
    env = dict(os.environ, COLUMNS="250")
    shown = run_durable("status", run, env=env)
    assert f"${3 * one:f}" in shown.stdout, shown.stdout
    listed = run_durable("runs", "--cost", env=env)
    assert listed.returncode == 0 and f"${3 * one:f}" in listed.stdout, listed.stdout
    rows = [json.loads(line) for line in run_durable("runs", "--json", env=env).stdout.split()]
    assert [Decimal(r["cost_usd"]) for r in rows if r["run_id"] == run] == [3 * one]
    logged = [json.loads(line)["what"] for line in
              run_durable("log", run, "--json", env=env).stdout.splitlines()]
    said = [w for w in logged if "; cost $" in w]
    assert len(said) == 3 and all(f"cost ${one:f} (gpt-4o-mini, openai, genai-prices "
                                  in w for w in said), said
    metrics = samples(exposition(client)[0].decode())
    assert metrics["durable_model_cost_usd_total"][(("agent", "model_looper"),
                                                    ("tenant", "acme"))] == \
        pytest.approx(float(3 * one))


def test_a_usd_budget_stops_the_run_at_the_call_that_crosses_it(
        client: Client, worker: WorkerFactory, priced: ModelServer) -> None:
    """A budget of 2.5 calls' price: the third call crosses it and is the last sent."""
    one = price_of_one_call()
    run = client.start("model_looper", {"calls": 10},
                       budgets={"usd": float(one * Decimal("2.5"))}).run_id
    worker(burst=True).wait(60)
    final = client.status(run)
    assert (final.state, final.reason) == ("failed", "budget_exhausted"), final.error
    assert final.model_calls == 3 and Decimal(final.cost_usd) == 3 * one
    assert "spent, the limit is $" in (final.error or ""), final.error
    assert len(priced.seen) == 3


def test_a_model_the_table_does_not_know_costs_unknown_never_zero(
        client: Client, worker: WorkerFactory, unpriced: ModelServer) -> None:
    free = client.start("model_looper", {"calls": 2}).run_id
    bounded = client.start("model_looper", {"calls": 2}, budgets={"usd": 5}).run_id
    worker(burst=True).wait(60)
    done = client.status(free)
    assert done.state == "completed"
    assert (done.cost_usd, done.uncosted) == ("", 2)
    [cost, _] = [e.cost for e in events_of(client, free)
                 if isinstance(e, ev.ActionSucceeded) and e.cost is not None]
    assert cost.usd == "" and "local" in cost.unknown and cost.tokens
    shown = run_durable("status", free, env=dict(os.environ, COLUMNS="250")).stdout
    assert "unknown (2 model calls)" in shown and "$0" not in shown, shown
    stopped = client.status(bounded)  # its spend cannot be kept under the budget
    assert (stopped.state, stopped.reason, stopped.model_calls) == \
        ("failed", "budget_exhausted", 1)
    assert "of unknown cost" in (stopped.error or ""), stopped.error
    metrics = samples(exposition(client)[0].decode())
    assert metrics["durable_model_calls_uncosted_total"][(("agent", "model_looper"),
                                                          ("tenant", ""))] == 3


def test_a_tenants_spend_limit_is_shared_by_its_runs_and_every_worker(
        client: Client, worker: WorkerFactory, priced: ModelServer) -> None:
    """acme may spend $0.002 an hour: its first run's two calls pass it (the check is of
    what was spent before each call); its second run's call waits for the period, while
    another tenant's run is not held."""
    assert price_of_one_call() < Decimal(str(SPEND_USD)) < 2 * price_of_one_call()
    first = client.start("spender", {"calls": 2}, tenant="acme").run_id
    worker(burst=True).wait(60)
    assert client.status(first).state == "completed"
    held = client.start("spender", {"calls": 1}, tenant="acme").run_id
    other = client.start("spender", {"calls": 1}, tenant="globex").run_id
    worker(burst=True).wait(60)
    assert client.status(other).state == "completed"
    assert client.status(held).state != "completed"
    assert not [s for s in priced.seen if s.key.startswith(f"{held}:")]  # nothing sent
    assert len(priced.seen) == 3
    reason = client.projection(held).get("reason", "")
    assert "waits for limit model-spend[acme]" in reason and "$0.002" in reason, reason


def test_the_integrations_records_are_priced_by_their_model_and_kinds() -> None:
    """What the pydantic-ai and OpenAI Agents SDK model steps record names the model, the
    provider and the token kinds a price needs; cached input is priced apart."""
    from pydantic_ai.durable_exec import ModelRequestId

    from durable import costs
    from durable.integrations.pydantic_ai.compat import recorded

    usage = {"input_tokens": 1000, "cache_read_tokens": 400, "output_tokens": 50}
    pai = recorded(ModelRequestId(model_name="gpt-4o"), {
        "parts": [], "usage": usage, "model_name": "gpt-4o", "provider_name": "openai"})
    expected = genai_prices.calc_price(genai_prices.Usage(**usage), "gpt-4o",
                                       provider_id="openai").total_price
    got = costs.price(None, None, pai)
    assert (Decimal(got.usd), got.model, got.provider) == (expected, "gpt-4o", "openai")
    assert got.tokens == usage
    oai = {"output": [], "model": "openai:gpt-4o", "usage": {
        "input_tokens": 1000, "output_tokens": 50, "total_tokens": 1050,
        "input_tokens_details": {"cached_tokens": 400}}}
    assert Decimal(costs.price(None, None, oai).usd) == expected
