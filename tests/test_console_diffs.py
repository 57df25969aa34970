"""The console shows a counterfactual fork against its parent (``/runs/A/diff/B`` and
``/api/runs/A/diff/B``): a real console process, a real browser, runs recorded by real
workers against the local model server (``tests.test_counterfactual_forks``' setting)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from durable.client import Client
from tests.browser import Console, login
from tests.conftest import ModelFactory, WorkerFactory
from tests.servers.model import ModelServer
from tests.test_counterfactual_forks import AGENTS, _held_fork, _shopped


@pytest.fixture()
def model(serve_model: ModelFactory, console: Console) -> ModelServer:
    """The model server, and the workers' agents (after the console: its users' files set
    ``TEST_DB``, where the charges are counted)."""
    return serve_model(AGENTS, tokens=5)


def test_a_fork_page_links_to_its_diff_which_names_the_first_divergence_and_the_held_step(
        console: Console, model: ModelServer, client: Client, worker: WorkerFactory,
        page: Page) -> None:
    world_db = Path(os.environ["TEST_DB"])
    run = _shopped(client, worker, world_db)
    fork = _held_fork(client, worker, run)
    login(page, console, "vera", f"/runs/{fork}")
    expect(page.locator("#forked-from")).to_contain_text("every new effect held")
    expect(page.locator("#forked-from")).to_contain_text("prompt=v2")
    page.click("#diff-parent")
    expect(page).to_have_url(f"{console.url}/runs/{run}/diff/{fork}")
    expect(page.locator("#first-divergence")).to_have_text("first divergence: step 1")
    expect(page.locator("#diff-2")).to_contain_text("held")
    expect(page.locator("#diff-2")).to_have_class("differs")
    expect(page.locator("#diff-totals")).to_contain_text("effects_sent")
    api = page.request.get(f"{console.url}/api/runs/{run}/diff/{fork}").json()
    assert api["first_divergence"] == 1 and api["totals"][fork]["held"] == 1
    assert api["steps"][1]["b"]["outcome"] == "held"
    assert page.request.get(f"{console.url}/runs/{run}/diff/nothing-here").status == 404
