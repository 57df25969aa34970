"""The console's defences, over HTTP against a real ``durable console`` process and real
Redis: security headers, the login rate limit (kept in Redis), logout that ends the
session server-side, the ``Secure`` cookie flag, and actions refused to roles that may not
take them. And the derived statuses: busy, idle and stale workers; step durations."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from durable.client import Client
from durable.console import login as login_module
from durable.console.status import worker_views
from durable.console.timeline import timeline
from durable.log import events as ev
from durable.log import keys
from durable.log.scripts import Scripts
from durable.log.store import now_ms
from durable.telemetry.overview import LeaseInfo, WorkerInfo
from durable.testing import Server, wait_for
from tests.browser import PASSWORDS, Console, serving
from tests.conftest import ApproverFactory, WorkerFactory

CSRF = re.compile(r'name="csrf-token" content="([^"]+)"')


@pytest.fixture()
def folder(payer_files: Path, approver: ApproverFactory) -> Path:
    """The users file's folder, with alice's key where it names it."""
    (payer_files / "alice.pem").write_bytes(approver("alice", "finance"))
    return payer_files


@pytest.fixture()
def console(server: Server, settings: Any, folder: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    with serving(server, folder, monkeypatch) as running:
        yield running


def browser(console: Console) -> httpx.Client:
    """An HTTP client that keeps cookies, as a browser would; it reads the CSRF token from
    the login page."""
    return httpx.Client(base_url=console.url, timeout=20, follow_redirects=False)


def csrf(c: httpx.Client, path: str = "/login") -> str:
    m = CSRF.search(c.get(path).text)
    assert m, path
    return m.group(1)


def log_in(c: httpx.Client, name: str, password: str) -> httpx.Response:
    return c.post("/login", data={"username": name, "password": password,
                                  "csrf": csrf(c), "next": "/runs"})


def test_every_response_carries_the_security_headers(console: Console) -> None:
    with browser(console) as c:
        replies = [c.get("/login"), c.get("/static/console.js"), c.get("/api/runs"),
                   c.get("/metrics"), c.get("/runs"), c.get("/no-such-page")]
        assert [r.status_code for r in replies] == [200, 200, 401, 200, 303, 404]
        for r in replies:
            csp = r.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, r.url
            assert "unsafe-inline" not in csp
            assert r.headers["x-frame-options"] == "DENY"
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["referrer-policy"] == "same-origin"
        assert "strict-transport-security" not in replies[0].headers  # plain HTTP here
        cookie = replies[0].headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "secure" not in cookie


def _age(r: redis.Redis, *windows: str) -> None:
    """Make the oldest failure of each of the console's ``windows`` older than the window:
    what 15 minutes of waiting would do, without the wait."""
    for key in windows:
        (member, at), = r.zrange(key, 0, 0, withscores=True)
        r.zadd(key, {member: at - login_module.WINDOW_S * 1000 - 1})


def test_logins_are_refused_after_five_failures_in_the_window_even_with_the_right_password(
        console: Console, r: redis.Redis) -> None:
    """Bad input at browser speed: 12 wrong passwords, then the right one. The first five
    are checked (401); from the sixth on every attempt is refused (429, ``Retry-After``)
    without a look at the password, however fast they come, for as long as five failures
    are within the window: the lock is the window, not a time that early attempts
    outlast. The count is in Redis, so another console process (or this one restarted)
    refuses too. Once the oldest failure leaves the window, one attempt is checked again:
    the right password logs in and clears the name's count."""
    assert console.proc.log_path is not None
    user = keys.login_failures("user", "alice")
    addr = keys.login_failures("addr", "127.0.0.1")
    with browser(console) as c:
        codes = [log_in(c, "alice", f"wrong-{i}").status_code for i in range(12)]
        right = log_in(c, "alice", PASSWORDS["alice"])
    assert codes == [401] * 5 + [429] * 7, codes
    assert right.status_code == 429 and "too many failed logins" in right.text
    retry = int(right.headers["retry-after"])
    assert 0 < retry <= login_module.WINDOW_S
    assert r.zcard(user) == r.zcard(addr) == 5  # the refused ones: not counted
    assert 0 < r.pttl(user) <= login_module.WINDOW_S * 1000
    assert "5 failures within 900 s for user alice" in console.proc.log_path.read_text()
    _age(r, user, addr)
    with browser(console) as c:
        ok = log_in(c, "alice", PASSWORDS["alice"])
        assert ok.status_code == 303 and ok.headers["location"] == "/runs"
    assert not r.exists(user) and r.zcard(addr) == 4  # the address's failures stay


def test_concurrent_wrong_logins_check_at_most_five_passwords(console: Console,
                                                             r: redis.Redis) -> None:
    """Bad input: 20 wrong passwords for one name sent at once. Each attempt takes its place
    in the windows before its password is checked, so five are checked (401) and the rest
    refused (429), whatever their order."""
    def attempt(i: int) -> int:
        with browser(console) as c:
            return log_in(c, "alice", f"wrong-{i}").status_code

    with ThreadPoolExecutor(20) as pool:
        codes = sorted(pool.map(attempt, range(20)))
    assert codes == [401] * 5 + [429] * 15, codes
    assert r.zcard(keys.login_failures("user", "alice")) == 5


def test_one_address_guessing_many_names_is_locked_too(console: Console,
                                                       r: redis.Redis) -> None:
    with browser(console) as c:
        codes = [log_in(c, f"user-{i}", "guess").status_code for i in range(6)]
        assert codes == [401] * 5 + [429]
        assert log_in(c, "vera", PASSWORDS["vera"]).status_code == 429


def test_the_window_slides_one_failure_at_a_time(r: redis.Redis) -> None:
    """The script alone, on real Redis, at given times: five failures fill the window;
    the sixth attempt is refused until the first failure leaves it, then one place frees."""
    take = Scripts(r).login_take
    key, window = keys.login_failures("user", "slide"), 1000

    def at(ms: int, member: str) -> list[int]:
        return [int(v) for v in take(keys=[key], args=[ms, window, 5, member])]

    assert [at(100 * i, f"f{i}") for i in range(5)] == [[1, 0]] * 5
    assert at(950, "g") == [0, 50]  # the first failure (at 0) counts until 1000
    assert at(1001, "h") == [1, 0] and at(1002, "i") == [0, 98]
    r.set(key, 7)  # a count kept by the version before the window: it starts again
    assert at(2000, "j") == [1, 0] and r.zcard(key) == 1


def test_a_cookie_saved_before_logout_is_refused_after_it(console: Console,
                                                          r: redis.Redis) -> None:
    with browser(console) as c:
        assert log_in(c, "alice", PASSWORDS["alice"]).status_code == 303
        saved = c.cookies["durable_console"]
        assert c.get("/runs").status_code == 200
        (session,) = r.keys(keys.console_session("*"))
        assert 0 < r.pttl(session) <= 12 * 3600 * 1000
        assert r.get(session) == b"alice"
        token = csrf(c, "/runs")
        assert c.post("/logout", data={"csrf": token}).status_code == 303
        assert not r.exists(session)
    with httpx.Client(base_url=console.url, timeout=20, cookies={"durable_console": saved}) \
            as replay:
        again = replay.get("/runs", follow_redirects=False)
        assert again.status_code == 303 and again.headers["location"].startswith("/login")
        assert replay.get("/api/runs").status_code == 401


def test_secure_cookies_flag_the_session_cookie(server: Server, settings: Any, folder: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    with serving(server, folder, monkeypatch, "--secure-cookies") as secure, \
            browser(secure) as c:
        page = c.get("/login")
        assert "secure" in page.headers["set-cookie"].lower()
        assert page.headers["strict-transport-security"].startswith("max-age=")


ACTIONS = {"cancel": {"scope": "run"}, "reconcile": {}, "release": {}, "fork": {"at": "0-1"},
           "settle": {"step": "1", "resolution": "not_applied", "evidence": "x"},
           "approve": {"request": "r", "decision": "approve"}}


def test_a_viewer_sees_no_action_and_each_post_of_theirs_is_refused(
        console: Console, client: Client) -> None:
    run = client.start("count", {"steps": 1}, run_id="v-1", enqueue=False).run_id
    client.log.quarantine(run, "for the test", "test")
    version = client.status(run).version
    with browser(console) as c:
        assert log_in(c, "vera", PASSWORDS["vera"]).status_code == 303
        page = c.get(f"/runs/{run}").text
        assert 'id="run-state"' in page and "<button" not in page.split("<main>")[1]
        token = csrf(c, f"/runs/{run}")
        for action, form in ACTIONS.items():
            reply = c.post(f"/runs/{run}/{action}", data={**form, "csrf": token})
            assert reply.status_code == 403, action
            assert "does not have the console role" in reply.text
    assert client.status(run).version == version and client.status(run).state == "quarantined"


def test_the_run_page_offers_only_the_actions_that_apply(
        console: Console, client: Client, worker: WorkerFactory) -> None:
    done = client.start("count", {"steps": 1}, run_id="a-done").run_id
    worker()
    assert client.wait(done, 30).state == "completed"
    stuck = client.start("count", {"steps": 1}, run_id="a-stuck", enqueue=False).run_id
    client.log.quarantine(stuck, "for the test", "test")

    with browser(console) as c:
        assert log_in(c, "alice", PASSWORDS["alice"]).status_code == 303
        finished, quarantined = c.get(f"/runs/{done}").text, c.get(f"/runs/{stuck}").text
    assert 'data-actions="fork"' in finished
    assert 'data-actions="cancel reconcile release fork"' in quarantined
    assert re.search(r'id="cancel-form" data-action="cancel" hidden', finished)
    assert re.search(r'id="cancel-form" data-action="cancel" >', quarantined)
    assert re.search(r'data-action="release" hidden', finished)
    assert re.search(r'data-action="release" >', quarantined)


def test_workers_are_busy_while_they_hold_runs_idle_or_stale_after(
        console: Console, client: Client, worker: WorkerFactory) -> None:
    run = client.start("count", {"steps": 100, "sleep_s": 0.3}, run_id="busy-1").run_id
    w = worker()
    assert wait_for(lambda: client.lease(run) is not None, 30)
    with browser(console) as c:
        assert log_in(c, "alice", PASSWORDS["alice"]).status_code == 303
        assert wait_for(lambda: [x["status"] for x in c.get("/api/workers").json()["workers"]]
                        == ["busy"], 30)
        (seen,) = c.get("/api/workers").json()["workers"]
        assert seen["runs"] == [run] and seen["rq_state"] != "busy"  # RQ does not know
        assert 0 <= seen["renewed_ms"] <= client.settings.leases.ttl_ms
        client.cancel(run, "enough", by="test")
        assert client.wait(run, 30).state == "canceled"
        assert wait_for(lambda: [x["status"] for x in c.get("/api/workers").json()["workers"]]
                        == ["idle"], 30)
        html = c.get("/workers").text
        assert 'data-status="idle"' in html and "RQ heartbeat" in html
    w.stop()


def test_worker_status_from_leases_and_heartbeats() -> None:
    now = now_ms()

    def info(name: str, beat_s: float) -> WorkerInfo:
        return WorkerInfo(name, "idle", ["durable"], int(now - beat_s * 1000), now - 10**6)

    views = worker_views(
        [info("h.local:1:abcdef.1", 31), info("h:2:bbbbbb", 60), info("h:3:cccccc", 421)],
        [LeaseInfo("r1", "h.local:1:abcdef", 4, 4200, 800)], now=now)
    assert [(v.status, v.runs, v.renewed_ms) for v in views] == [
        ("busy", ["r1"], 800), ("idle", [], None), ("stale", [], None)]
    assert views[0].heartbeat_ms <= 1000  # a lease renewal, not RQ's 31 s old beat


def test_steps_have_wall_clock_times_and_durations(client: Client,
                                                   worker: WorkerFactory) -> None:
    run = client.start("count", {"steps": 2, "sleep_s": 0.2}, run_id="t-1").run_id
    worker()
    assert client.wait(run, 30).state == "completed"
    entries = client.events(run)
    tl = timeline(entries, client.ledger(run))
    assert tl.started == entries[0].event.ts  # type: ignore[union-attr]
    for s in tl.steps:
        assert s.decided_at <= s.sent_at < s.ended_at
        assert s.duration_ms is not None and 200 <= s.duration_ms < 10_000
    done = [e.event for e in entries if isinstance(e.event, ev.ActionSucceeded)]
    assert [s.ended_at for s in tl.steps] == [e.ts for e in done]


def test_page_timings(console: Console, client: Client, worker: WorkerFactory) -> None:
    """Not a limit: prints what the pages cost, for the CHANGELOG."""
    run = client.start("count", {"steps": 50, "sleep_s": 0.2}, run_id="p-1").run_id
    worker()
    assert wait_for(lambda: client.lease(run) is not None and client.status(run).step >= 3,
                    30)
    with browser(console) as c:
        assert log_in(c, "alice", PASSWORDS["alice"]).status_code == 303
        for path in ("/runs", f"/runs/{run}", f"/runs/{run}/panel", "/workers"):
            t0 = time.perf_counter()
            for _ in range(10):
                assert c.get(path).status_code == 200
            print(f"{path}: {(time.perf_counter() - t0) * 100:.1f} ms per GET")
