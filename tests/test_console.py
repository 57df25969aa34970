"""The web console, driven in a real headless Chromium (Debian's ``chromium``, through
Playwright with its executable path: no browser is downloaded), against a real
``durable console`` process, real Redis and real worker processes.

Set ``CONSOLE_SCREENSHOT=docs/console-run.png`` to write the screenshot docs/operations.md
shows: the run page of a running run (the cancel scenario, before the cancel).
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from playwright.sync_api import Page, expect

import tests.agents.settle  # noqa: F401  (registers peeker)
from durable.client import Client
from durable.log import events as ev
from durable.log import keys
from durable.testing import AdminKey, wait_for
from tests.browser import PASSWORDS, Console, login
from tests.conftest import WorkerFactory


def events_of(client: Client, run: str, kind: type[ev.Event]) -> list[Any]:
    return [e.event for e in client.events(run) if isinstance(e.event, kind)]


def _waiting_for_approval(client: Client, worker: WorkerFactory, run: str) -> None:
    client.start("payer", {"amount": 42}, run_id=run)
    worker()
    assert client.wait(run, 30).state == "waiting_approval"


def test_an_approver_finds_a_waiting_run_approves_it_and_watches_it_complete(
        console: Console, page: Page, client: Client, worker: WorkerFactory,
        tmp_path: Path) -> None:
    run = "pay-1"
    _waiting_for_approval(client, worker, run)
    login(page, console, "alice")
    waiting = page.locator(f"#waiting tr[data-run='{run}']")
    expect(waiting).to_contain_text("approval")
    waiting.locator("a").click()
    expect(page.locator("#run-state")).to_have_attribute("data-state", "waiting_approval")
    row = page.locator(f"#approvals tr[data-run='{run}']")
    expect(row).to_contain_text("invoice:42")  # the evidence
    expect(row).to_contain_text('"amount": 42')  # the arguments
    digest = client.status(run).approvals[row.get_attribute("data-request") or ""].digest
    expect(row.locator("code.digest")).to_have_attribute("title", digest)
    row.locator("button.approve").click()
    expect(page.locator("#flash")).to_contain_text("approve")
    # No reload from here: the page follows the run by server-sent events.
    expect(page.locator("#run-state")).to_have_attribute("data-state", "completed")
    expect(page.locator("#timeline")).to_contain_text("approval_decided")
    expect(page.locator("#steps")).to_contain_text("succeeded")
    (decided,) = events_of(client, run, ev.ApprovalDecided)
    assert decided.approver == "alice" and decided.actor == "alice"
    assert client.status(run).result == {"paid": True, "status": "succeeded"}
    # A finished run offers no cancel (the live refresh hid it) and no approval form.
    expect(page.locator("#cancel-form")).to_be_hidden()
    expect(page.locator("#no-actions")).to_be_visible()
    expect(page.locator("#approvals")).to_have_count(0)


def test_a_rejection_from_the_approvals_page_is_an_outcome_the_agent_handles(
        console: Console, page: Page, client: Client, worker: WorkerFactory) -> None:
    run = "pay-5"
    _waiting_for_approval(client, worker, run)
    login(page, console, "alice", "/approvals")
    row = page.locator(f"#approvals tr[data-run='{run}']")
    row.locator("input[name=note]").fill("not this month")
    row.locator("button.reject").click()
    expect(page).to_have_url(f"{console.url}/approvals")
    expect(page.locator("#flash")).to_contain_text("reject")
    expect(page.locator(f"#approvals tr[data-run='{run}']")).to_have_count(0)
    assert client.wait(run, 30).result == {"paid": False, "status": "rejected"}
    (decided,) = events_of(client, run, ev.ApprovalDecided)
    assert (decided.decision, decided.approver, decided.note) == \
        ("reject", "alice", "not this month")


CLOCK = re.compile(r"^\d\d:\d\d:\d\d\.\d{3}$")


def test_an_operator_cancels_a_running_run_and_sees_it_canceled(
        console: Console, page: Page, client: Client, worker: WorkerFactory,
        tmp_path: Path) -> None:
    """A run a worker drives is shown running (its state stays pending: running is the
    lease's business), with the holder and since when, on the list and on its page; its
    steps have wall-clock times and durations; once canceled, cancel is offered no more."""
    run = client.start("count", {"steps": 200, "sleep_s": 0.5}, run_id="long-1").run_id
    worker()
    assert wait_for(lambda: client.lease(run) is not None and client.status(run).step >= 2,
                    30, interval=0.1)
    lease = client.lease(run)
    assert lease is not None
    login(page, console, "alice", "/runs")
    row = page.locator(f"#runs tr[data-run='{run}']")
    expect(row).to_have_attribute("data-status", "running")
    expect(row.locator("td.holder")).to_contain_text(lease.owner)
    expect(row.locator("td.holder")).to_contain_text("since")
    row.locator("a").click()
    expect(page.locator("#run-state")).to_have_attribute("data-state", "pending")
    expect(page.locator("#run-state")).to_have_attribute("data-status", "running")
    expect(page.locator("#holder")).to_have_text(lease.owner)
    acquired = [e for e in events_of(client, run, ev.LeaseAcquired) if e.epoch == lease.epoch]
    since = datetime.fromtimestamp(acquired[0].ts / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]
    expect(page.locator("#held-since")).to_contain_text(since)
    first = page.locator("#steps tr[data-step='1']")
    expect(first.locator("td.t").first).to_have_text(CLOCK)
    expect(first.locator("td.took")).to_have_text(re.compile(r"^\d+ ms$|^\d+\.\d s$"))
    expect(page.locator("#timeline tbody tr").first.locator("td.t").first).to_have_text(CLOCK)
    shot = Path(os.environ.get("CONSOLE_SCREENSHOT") or tmp_path / "run.png")
    page.locator("#partial").evaluate("el => el.textContent = ''")
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    page.fill("#cancel-form input[name=reason]", "not needed any more")
    page.click("#cancel")
    expect(page.locator("#run-state")).to_have_attribute("data-state", "canceled")
    expect(page.locator("#run-state")).to_have_attribute("data-status", "canceled")
    expect(page.locator("#cancel-form")).to_be_hidden()
    expect(page.locator("#reconcile")).to_be_hidden()
    (asked,) = events_of(client, run, ev.CancelRequested)
    assert (asked.by, asked.actor, asked.reason) == ("alice", "alice", "not needed any more")
    assert client.status(run).state == "canceled"


def test_a_viewers_approve_is_refused_and_writes_nothing(
        console: Console, page: Page, client: Client, worker: WorkerFactory) -> None:
    run = "pay-2"
    _waiting_for_approval(client, worker, run)
    version = client.status(run).version
    login(page, console, "vera", "/approvals")
    row = page.locator(f"#approvals tr[data-run='{run}']")
    expect(row).to_contain_text("needs the approver role")
    expect(row.locator("button")).to_have_count(0)
    # Offering no button is only a hint: the server refuses a viewer's POST itself.
    status = page.evaluate("""async ([run, request]) => {
        const body = new URLSearchParams({request, decision: "approve",
            csrf: document.querySelector('meta[name="csrf-token"]').content});
        const r = await fetch(`/runs/${run}/approve`, {method: "POST", body});
        return r.status; }""", [run, row.get_attribute("data-request")])
    assert status == 403
    state = client.status(run)
    assert state.state == "waiting_approval" and state.version == version
    assert events_of(client, run, ev.ApprovalDecided) == []


def test_a_post_without_the_csrf_token_is_refused(
        console: Console, page: Page, client: Client, worker: WorkerFactory) -> None:
    """A logged-in operator's browser made to POST by another page (no token) acts not."""
    run = "pay-3"
    _waiting_for_approval(client, worker, run)
    login(page, console, "alice", f"/runs/{run}")
    status = page.evaluate("""async (run) => {
        const r = await fetch(`/runs/${run}/cancel`, {method: "POST",
            body: new URLSearchParams({scope: "run"})});
        return r.status; }""", run)
    assert status == 403
    assert client.status(run).state == "waiting_approval"


def test_every_page_needs_a_login_and_a_wrong_password_gets_none(
        console: Console, page: Page) -> None:
    for path in ("/runs", "/approvals", "/workers", "/runs/x", "/live/runs"):
        r = httpx.get(console.url + path, follow_redirects=False, timeout=10)
        assert r.status_code == 303 and r.headers["location"].startswith("/login"), path
    page.goto(console.url + "/workers")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", "wrong")
    page.click("button[type=submit]")
    expect(page.locator("#login-error")).to_contain_text("wrong name or password")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", PASSWORDS["alice"])
    page.click("button[type=submit]")
    expect(page).to_have_url(console.url + "/workers")


def test_the_runs_page_counts_filters_and_updates_live(
        console: Console, page: Page, client: Client, worker: WorkerFactory,
        reconciler: Any) -> None:
    for i in range(3):
        client.start("count", {"steps": 1}, run_id=f"done-{i}", enqueue=False)
    login(page, console, "vera")
    expect(page.locator("#counts a[data-state=pending] b")).to_have_text("3")
    page.fill("#search", "done-1")
    page.click("#filters button[type=submit]")
    expect(page.locator("#runs tbody tr")).to_have_count(1)
    page.goto(console.url + "/runs?state=pending")
    expect(page.locator("#runs tbody tr")).to_have_count(3)
    expect(page.locator("#live-runs")).to_have_text("live")
    for i in range(3):
        client.enqueue(f"done-{i}")
    worker()
    reconciler()
    # No reload: the counts and the list change by server-sent events.
    expect(page.locator("#counts a[data-state=completed] b")).to_have_text("3")
    expect(page.locator("#runs tbody tr")).to_have_text("no runs match")
    page.goto(console.url + "/workers")
    expect(page.locator("#workers tbody tr")).to_have_count(1)
    expect(page.locator("#sweeps")).to_contain_text("reconciler:")


def test_an_operator_forks_from_the_slider_releases_and_reconciles(
        console: Console, page: Page, client: Client, worker: WorkerFactory,
        r: redis.Redis) -> None:
    run = client.start("count", {"steps": 2}, run_id="src-1").run_id
    worker()
    assert client.wait(run, 30).state == "completed"
    entries = client.events(run)
    login(page, console, "alice", f"/runs/{run}")
    page.locator("#slider").fill("3")  # run_started, lease, step 1's intent, its dispatch
    expect(page.locator("#fork-at")).to_have_value(entries[3].id)
    page.fill("#fork-form input[name=new_run_id]", "src-1-again")
    page.click("#fork")
    expect(page.locator("#flash")).to_contain_text("as src-1-again")
    first = client.events("src-1-again")[0].event
    assert isinstance(first, ev.RunStarted)
    assert (first.parent, first.forked_at, first.actor) == (run, entries[3].id, "alice")
    assert client.wait("src-1-again", 30).state == "completed"  # a worker drove the fork

    stuck = client.start("count", {"steps": 1}, run_id="stuck-1", enqueue=False).run_id
    client.log.quarantine(stuck, "for the test", "test")
    page.goto(f"{console.url}/runs/{stuck}")
    expect(page.locator("#run-state")).to_have_attribute("data-state", "quarantined")
    page.click("#reconcile")
    expect(page.locator("#flash")).to_contain_text("due now")
    assert r.zscore(keys.DUE, stuck) is not None
    page.click("#release")
    expect(page.locator("#flash")).to_contain_text("released by alice")
    (released,) = events_of(client, stuck, ev.Released)
    assert (released.by, released.actor) == ("alice", "alice")
    assert client.wait(stuck, 30).state == "completed"


def test_a_live_refresh_leaves_the_message_for_the_page_the_action_redirects_to(
        console: Console, page: Page, client: Client) -> None:
    """Window: an action is done and its redirect not loaded yet when the page it was sent
    from refreshes its live fragments (the run moved on at once): the action's message is
    still there for the page the redirect loads."""
    run = client.start("count", {"steps": 1}, run_id="flash-1", enqueue=False).run_id
    login(page, console, "alice", f"/runs/{run}")
    csrf = page.locator("meta[name=csrf-token]").get_attribute("content") or ""
    reply = page.request.post(f"{console.url}/runs/{run}/reconcile", form={"csrf": csrf},
                              max_redirects=0)
    assert reply.status in (302, 303), reply.status
    first = client.log.read(run)[0].id
    for fragment in (f"/runs/{run}/panel", "/runs/table", f"/runs/{run}/state?at={first}"):
        assert page.request.get(console.url + fragment).ok, fragment
    page.goto(f"{console.url}/runs/{run}")
    expect(page.locator("#flash")).to_contain_text("due now")


def test_bad_input_is_one_line_refusal_and_writes_nothing(
        console: Console, page: Page, client: Client, worker: WorkerFactory) -> None:
    run = "pay-4"
    _waiting_for_approval(client, worker, run)
    version = client.status(run).version
    login(page, console, "alice", f"/runs/{run}")
    csrf = page.locator("meta[name=csrf-token]").get_attribute("content") or ""
    for action, form, said in (
            ("approve", {"request": "nope", "decision": "approve"}, "no approval request"),
            ("approve", {"request": client.status(run).wait.request,  # type: ignore[union-attr]
                         "decision": "maybe"}, "decision must be one of"),
            ("cancel", {"scope": "everything"}, "scope must be"),
            ("fork", {"at": "not-an-id"}, "is not a log entry id")):
        reply = page.request.post(f"{console.url}/runs/{run}/{action}",
                                  form={**form, "csrf": csrf})
        assert reply.ok and "refused: " in reply.text() and said in reply.text(), action
    reply = page.request.get(f"{console.url}/runs/{run}/state?at=garbage")
    assert reply.status == 400 and "is not a log entry id" in reply.text()
    assert page.request.get(f"{console.url}/runs/nothing-here").status == 404
    assert client.status(run).version == version  # nothing was written
    api = page.request.get(f"{console.url}/api/runs/{run}").json()
    assert api["summary"]["state"] == "waiting_approval" and api["steps"][0]["key"] == f"{run}:1"
    assert api["open_approvals"][0]["evidence"] == ["invoice:42"]
    assert page.request.get(f"{console.url}/api/runs/nothing-here").json() == {
        "error": "run nothing-here not found"}
    assert httpx.get(f"{console.url}/api/runs", timeout=10).status_code == 401


def test_the_run_page_follows_the_run_and_its_streamed_output_live(
        console: Console, page: Page, client: Client, worker: WorkerFactory) -> None:
    """Opened before any worker takes the run: with no reload, the page shows the partial
    output of the step in flight (not in the log), then the run completed."""
    run = client.start("chat", {"parts": 3, "pause_s": 5.0}, run_id="chat-1",
                       enqueue=False).run_id
    login(page, console, "vera", f"/runs/{run}")
    expect(page.locator("#run-state")).to_have_attribute("data-state", "pending")
    expect(page.locator("#live-run")).to_have_text("live")
    client.enqueue(run)
    worker()
    expect(page.locator("#partial")).to_contain_text("tok0tok1tok2")
    assert client.status(run).state == "pending"  # the step is still in flight
    expect(page.locator("#run-state")).to_have_attribute("data-state", "completed")
    expect(page.locator("#live-run")).to_have_text("ended")
    page.locator("#slider").fill("0")  # the state after the first entry
    expect(page.locator("#state-entry")).to_have_text(client.events(run)[0].id)
    expect(page.locator("#state-at-state")).to_have_text("pending")


def test_the_timeline_puts_each_event_in_its_column_and_masks_secrets(
        client: Client, worker: WorkerFactory) -> None:
    """Intended (start, intents), happened (lease, dispatch, outcomes), stopped (the end);
    the steps table takes every step from the log, with its ledger entry."""
    from durable.console.timeline import MASK, masked, timeline

    run = client.start("count", {"steps": 2}, run_id="tl-1").run_id
    worker()
    assert client.wait(run, 30).state == "completed"
    tl = timeline(client.events(run), client.ledger(run))
    cols = {r.type: r.column for r in tl.rows}
    assert cols["run_started"] == cols["step_decided"] == "intended"
    assert cols["action_dispatched"] == cols["action_succeeded"] == "happened"
    assert cols["completed"] == "stopped"
    assert [(s.step, s.attempts, s.outcome) for s in tl.steps] == \
        [(1, 1, "succeeded"), (2, 1, "succeeded")]
    assert all(s.ledger.startswith("done|") and s.deadline > 0 for s in tl.steps)
    assert tl.ids == [e.id for e in client.events(run)]
    assert masked({"to": "a", "api_key": "k", "nested": [{"Password": "p", "n": 1}]}) == \
        {"to": "a", "api_key": MASK, "nested": [{"Password": MASK, "n": 1}]}


def test_the_console_serves_prometheus_metrics_without_a_login(
        console: Console, client: Client, worker: WorkerFactory) -> None:
    """A scraper cannot log in: ``/metrics`` answers without one, with counts only, and
    ``durable_runs`` agrees with the runs the client lists."""
    from prometheus_client.parser import text_string_to_metric_families

    runs = [client.start("count", {"steps": 2}).run_id for _ in range(3)]
    worker(burst=True).wait(60)
    assert all(client.status(r).state == "completed" for r in runs)
    resp = httpx.get(console.url + "/metrics", follow_redirects=False, timeout=10)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(resp.text)}
    by_state = {s.labels["state"]: s.value for s in families["durable_runs"].samples}
    assert by_state["completed"] == len(client.runs("completed")) == 3
    steps = sum(s.value for s in families["durable_steps"].samples
                if s.name == "durable_steps_total")
    assert steps == 6
    assert all(r not in resp.text for r in runs)


def test_an_operator_settles_an_unknown_outcome_from_the_run_page(
        console: Console, page: Page, client: Client, worker: WorkerFactory,
        admin_key: AdminKey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run waits for an operator because its tool has no lookup: the run page offers a
    settle to an operator (not to a viewer); alice's settle is signed with her key, which
    the registry must hold with the operator role, and the run completes."""
    monkeypatch.setenv("TEST_PEEK_FILE", str(tmp_path / "peek-calls"))
    monkeypatch.setenv("DURABLE_AGENTS", os.environ["DURABLE_AGENTS"] + ",tests.agents.settle")
    run = client.start("peeker", {"q": "a"}, run_id="settle-me").run_id
    w = worker()
    assert client.wait(run, 30).state == "waiting_external"
    w.stop()
    login(page, console, "vera", f"/runs/{run}")
    expect(page.locator("#run-state")).to_have_attribute("data-state", "waiting_external")
    expect(page.locator("#settle-1")).to_have_count(0)
    page.context.clear_cookies()  # log out
    login(page, console, "alice", f"/runs/{run}")
    form = page.locator("form.settle-form")
    form.locator("select[name=resolution]").select_option("not_applied")
    form.locator("input[name=evidence]").fill("no request in the server's access log")
    page.click("#settle-1")
    expect(page.locator("#flash")).to_contain_text("does not have the role 'operator'")
    client.approvers.grant("alice", ["operator"], admin_key=admin_key.private)
    form.locator("input[name=evidence]").fill("no request in the server's access log")
    page.click("#settle-1")
    expect(page.locator("#flash")).to_contain_text("settled not_applied by alice")
    (settle,) = [e for e in events_of(client, run, ev.ActionReconciled) if e.by == "operator"]
    assert (settle.operator, settle.actor, settle.evidence) == (
        "alice", "alice", "no request in the server's access log")
    worker()
    assert client.wait(run, 30).state == "completed"


def test_the_runs_page_shows_the_orphaned_runs_and_why(
        console: Console, page: Page, client: Client) -> None:
    """The runs page's "orphaned only" filter lists the runs nothing will move on (here:
    one whose due entry was lost, never enqueued), with why; not the one a reconciler's
    next sweep reaches. A bad value of the filter is refused (400)."""
    lost = client.start("count", {"steps": 1}, run_id="lost-1", enqueue=False).run_id
    assert client.redis.zrem(client.log.keys.due_of(lost), lost) == 1
    client.start("count", {"steps": 1}, run_id="due-1", enqueue=False)
    login(page, console, "vera")
    expect(page.locator("#runs tbody tr")).to_have_count(2)
    page.check("#orphaned")
    page.click("#filters button[type=submit]")
    expect(page.locator("#runs tbody tr")).to_have_count(1)
    expect(page.locator(f"#runs tr[data-run={lost}]")).to_contain_text(
        "no lease, on no ready list, not in the due-set")
    api = page.request.get(f"{console.url}/api/runs?orphaned=1").json()
    assert [r["run_id"] for r in api["runs"]] == [lost]
    assert page.request.get(f"{console.url}/runs?orphaned=yes").status == 400
    page.goto(console.url + "/runs?orphaned=1&state=waiting_input")
    expect(page.locator("#runs tbody tr")).to_have_text("no orphaned runs match")
