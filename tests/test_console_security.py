"""The console's defences, over HTTP against a real ``durable console`` process and real
Redis: security headers, the login rate limit (kept in Redis), logout that ends the
session server-side, the ``Secure`` cookie flag, and actions refused to roles that may not
take them. And the derived statuses: busy, idle and stale workers; step durations."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
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


#: How long ``_held`` keeps the console's locks: far longer than the attempts under them.
HOLD_MS = 120_000


@contextlib.contextmanager
def _held(r: redis.Redis, *locks: str) -> Iterator[list[int]]:
    """The console's ``locks`` held while a test makes its attempts under them, then given
    back the time they had left (what it yields), to end by themselves. The first lock
    lasts 1 s, the second 2 s: a loaded machine makes fewer logins than a test needs in
    that time, and an attempt made after the lock ended would count as a failure. The
    locks are lengthened in Redis, where the console (and any other console) reads them,
    as soon as the login that set them returned: one reply against the lock's length
    instead of a hundred logins."""
    pipe = r.pipeline()
    for lock in locks:
        pipe.pttl(lock)
        pipe.pexpire(lock, HOLD_MS)
    left = [int(ms) for ms in pipe.execute()[::2]]
    assert all(ms > 0 for ms in left), left  # set by the login that just returned
    try:
        yield left
    finally:
        pipe = r.pipeline()
        for lock, ms in zip(locks, left, strict=True):
            pipe.pexpire(lock, ms)
        pipe.execute()


def test_logins_are_locked_after_five_failures_even_with_the_right_password(
        console: Console, r: redis.Redis) -> None:
    """100 wrong passwords, then the right one: the sixth attempt on is refused (429) without
    a look at the password, for a lock that grows; the count is in Redis, so another
    console process (or this one restarted) refuses too. Once the lock ends, the right
    password logs in. The attempts under a lock are made while the test holds it
    (``_held``); its length is the console's own (its log, the time it had left)."""
    assert console.proc.log_path is not None
    user_lock, addr_lock = keys.login_lock("user", "alice"), keys.login_lock("addr", "127.0.0.1")
    with browser(console) as c:
        codes = [log_in(c, "alice", f"wrong-{i}").status_code for i in range(5)]
        with _held(r, user_lock, addr_lock) as left:
            codes += [log_in(c, "alice", f"wrong-{i}").status_code for i in range(5, 100)]
            right = log_in(c, "alice", PASSWORDS["alice"])
            assert r.get(user_lock) == b"5"  # the count that set it
    assert codes[:5] == [401] * 5 and set(codes[5:]) == {429}
    assert right.status_code == 429 and int(right.headers["retry-after"]) >= 1
    assert "too many failed logins" in right.text
    assert all(0 < ms <= login_module.lock_s(5) * 1000 for ms in left), left
    assert "logins locked for 1 s" in console.proc.log_path.read_text()
    assert int(r.get(keys.login_failures("user", "alice")) or 0) == 5  # refused ones: uncounted
    assert 0 < r.pttl(keys.login_failures("user", "alice")) <= login_module.WINDOW_S * 1000
    assert wait_for(lambda: not r.exists(user_lock, addr_lock), 10, interval=0.1)
    with browser(console) as c:
        wrong = log_in(c, "alice", "wrong-again")  # the sixth failure: a 2 s lock
        assert wrong.status_code == 401
        with _held(r, user_lock, addr_lock) as left:
            assert log_in(c, "alice", PASSWORDS["alice"]).status_code == 429
            assert r.get(user_lock) == b"6"
        assert all(0 < ms <= login_module.lock_s(6) * 1000 for ms in left), left
        assert "logins locked for 2 s" in console.proc.log_path.read_text()
        assert wait_for(lambda: not r.exists(user_lock, addr_lock), 10, interval=0.1)
        ok = log_in(c, "alice", PASSWORDS["alice"])
        assert ok.status_code == 303 and ok.headers["location"] == "/runs"
        assert not r.exists(keys.login_failures("user", "alice"))  # cleared by the success


def test_one_address_guessing_many_names_is_locked_too(console: Console,
                                                       r: redis.Redis) -> None:
    with browser(console) as c:
        codes = [log_in(c, f"user-{i}", "guess").status_code for i in range(6)]
        assert codes == [401] * 5 + [429]
        assert log_in(c, "vera", PASSWORDS["vera"]).status_code == 429


def test_lock_lengths_double_past_the_limit() -> None:
    assert [login_module.lock_s(n) for n in (1, 4, 5, 6, 7, 10)] == [0, 0, 1, 2, 4, 32]
    assert login_module.lock_s(10_000) == login_module.MAX_LOCK_S


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
