"""The console's test harness: a real headless Chromium (Debian's ``chromium``, through
Playwright with its executable path: no browser is downloaded) and a real ``durable console``
process with a users file, for the tests of the console's pages."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from durable.backend.embedded import free_port
from durable.security.users import hash_password
from durable.testing import Server, wait_for
from durable.testing.processes import Process

if TYPE_CHECKING:
    from tests.conftest import ApproverFactory

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]

#: Generous: the machine may be loaded by other test runs.
TIMEOUT_MS = 30_000
expect.set_options(timeout=TIMEOUT_MS)  # every `expect` waits as long as an action may

PASSWORDS = {"alice": "alice-pw-1", "vera": "vera-pw-1"}


@dataclass
class Console:
    url: str
    proc: Process


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium "
                    "(apt-get install chromium; ./test.sh does)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture()
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    pg = context.new_page()
    yield pg
    context.close()


@pytest.fixture()
def apps(payer_files: Path, approver: ApproverFactory) -> Path:
    """The payer agent's database and fact; alice's key is registered with the role
    finance, and her private key lies where the console's users file names it."""
    (payer_files / "alice.pem").write_bytes(approver("alice", "finance"))
    return payer_files


@contextlib.contextmanager
def serving(server: Server, folder: Path, monkeypatch: pytest.MonkeyPatch,
            *args: str, more_users: str = "") -> Iterator[Console]:
    """A ``durable console`` process (with ``args``) and a users file in ``folder``: alice
    (operator, approver, her key in ``folder/alice.pem``), vera (viewer), and the entries
    of ``more_users`` (TOML)."""
    users = folder / "users.toml"
    users.write_text(
        f'[users.alice]\npassword = "{hash_password(PASSWORDS["alice"])}"\n'
        'roles = ["operator", "approver"]\napprover_key = "alice.pem"\n\n'
        f'[users.vera]\npassword = "{hash_password(PASSWORDS["vera"])}"\nroles = ["viewer"]\n'
        + more_users)
    monkeypatch.setenv("DURABLE_CONSOLE_USERS", str(users))
    monkeypatch.setenv("DURABLE_CONSOLE_SECRET", "test-secret-" + "x" * 20)
    port = free_port()
    log = folder / f"console-{port}.log"
    proc = Process(server.url, ["console", "--port", str(port), *args], log_path=log)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/login", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        assert wait_for(up, 30, interval=0.2), log.read_text()
        yield Console(url, proc)
    finally:
        proc.stop()
    assert "Traceback" not in log.read_text()


@pytest.fixture()
def console(server: Server, settings: Any, apps: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    """A ``durable console`` process with a users file: alice (operator, approver) and
    vera (viewer)."""
    with serving(server, apps, monkeypatch) as running:
        yield running


def login(page: Page, console: Console, name: str, path: str = "/runs") -> None:
    page.goto(console.url + path)
    expect(page).to_have_url(re.compile(r"/login\?next="))
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", PASSWORDS[name])
    page.click("button[type=submit]")
    expect(page.locator("#whoami")).to_have_text(name)
