"""The console's workers page in a real headless Chromium: the limits table shows what the
fleet's limiters hold while runs wait on them, and what they granted once the runs are done
(``durable.flow.limit_usage``, the same figures as ``durable limits``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from durable.client import Client
from durable.flow.limit_usage import usage
from durable.testing import wait_for
from durable.testing.provider import Provider
from tests.browser import Console, login
from tests.conftest import WorkerFactory


@pytest.fixture()
def provider() -> Iterator[Provider]:
    p = Provider(latency_s=1.5)
    yield p.start()
    p.stop()


def _cells(page: Page, limit: str) -> list[str]:
    row = page.locator(f"#limits tr[data-limit={limit}] td")
    return [text.strip() for text in row.all_inner_texts()]


def test_the_limits_table_shows_the_call_in_flight_the_runs_waiting_and_the_grants(
        console: Console, page: Page, client: Client, worker: WorkerFactory,
        provider: Provider, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three runs call a provider whose limit lets one call out at a time (each takes
    1.5 s): while the first call is out the table reads 1 of 1 in flight and two waiting;
    after the three runs it reads none in flight and three grants."""
    monkeypatch.setenv("DURABLE_AGENTS",
                       "examples.agents,tests.agents.basic,durable.testing.provider")
    monkeypatch.setenv("PROVIDER_URL", provider.url)
    monkeypatch.setenv("LIMIT_IN_FLIGHT", "1")
    runs = [client.start("calls_provider", {"calls": 1}, run_id=f"limited-{i}").run_id
            for i in range(3)]
    login(page, console, "vera", "/workers")
    expect(page.locator("#limits")).to_contain_text("no limit in use")
    worker()
    assert wait_for(lambda: [(u.in_flight, u.waiting) for u in usage(client.redis)] == [(1, 2)],
                    30), usage(client.redis)
    page.reload()
    row = page.locator("#limits tr[data-limit=provider]")
    expect(row).to_have_count(1)
    in_flight, waiting = _cells(page, "provider")[2], _cells(page, "provider")[6]
    assert (in_flight, waiting) == ("1 / 1", "2"), _cells(page, "provider")
    expect(row.locator("td").nth(1)).to_have_text("p1")
    completed = client.log.keys.runs_in_state("completed")
    assert wait_for(lambda: client.redis.zcard(completed) == 3, 30), \
        [client.status(r).state for r in runs]
    page.reload()
    cells = _cells(page, "provider")
    assert cells[2] == "0 / 1" and cells[6] == "0", cells
    granted, waited, throttled = (int(n) for n in cells[8].split(" / "))
    assert granted == 3 and waited >= 2 and throttled == 0, cells
    assert provider.stats["max_in_flight"] == 1 and provider.stats["rejected"] == 0
