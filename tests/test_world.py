"""The external world as a real process, and the pipeline's tools against it.

The world keeps the contract the system relies on: it deduplicates by key (or not, in the
non-deduplicating mode), refuses work past its deadline, answers lookups by key, and its
faults never lie (503 = not applied; a dropped reply or a late one = applied).
"""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from durable.agents import ToolContext
from durable.agents.cancel_token import Cancelled, CancelToken
from durable.log.state import Action, RunState
from durable.testing import wait_for
from examples.agents.pipeline import (
    DeadlinePassed,
    Fetch,
    Notify,
    Pipeline,
    Refused,
    WorldUnavailable,
    Write,
)
from examples.world import DEADLINE_HEADER, KEY_HEADER, WorldClient, WorldProcess


@pytest.fixture(scope="module")
def dedupe_world() -> Iterator[WorldProcess]:
    with WorldProcess(dedupe=True) as world:
        yield world


_n = iter(range(1_000_000))


def key() -> str:
    return f"t{time.time_ns() % 10**9}-{next(_n)}:1"


def now_ms() -> int:
    return int(time.time() * 1000)


def notify(w: WorldProcess, k: str, deadline: int | None = None, **kw: Any) -> httpx.Response:
    headers = {KEY_HEADER: k, DEADLINE_HEADER: str(deadline or now_ms() + 5000)}
    return httpx.post(f"{w.url}/notify", json={"recipient": "a@example.com", "message": "hi"},
                      headers=headers, **kw)


def ctx(k: str, timeout_s: float = 2.0, token: CancelToken | None = None) -> ToolContext:
    return ToolContext(run_id=k.split(":")[0], step=1, key=k,
                       deadline_ms=now_ms() + int(timeout_s * 1000), token=token or CancelToken())


# The world's contract ----------------------------------------------------------------------


def test_dedupe_mode_applies_a_key_once_and_replays_its_result(
        dedupe_world: WorldProcess) -> None:
    k = key()
    first, second = notify(dedupe_world, k), notify(dedupe_world, k)
    assert first.status_code == second.status_code == 200
    assert second.headers["Idempotent-Replayed"] == "true"
    assert first.json()["result"] == second.json()["result"]
    assert dedupe_world.applications(k.split(":")[0]).api == {k: 1}
    assert dedupe_world.client.lookup(k)["applied"] is True


def test_no_dedupe_mode_applies_every_request(world: WorldProcess) -> None:
    k = key()
    notify(world, k)
    notify(world, k)
    apps = world.applications(k.split(":")[0])
    assert apps.api == {k: 2}
    assert apps.duplicates == {f"api {k}": 2}


def test_requests_without_key_or_deadline_are_refused(world: WorldProcess) -> None:
    resp = httpx.post(f"{world.url}/notify", json={"recipient": "x@y"})
    assert resp.status_code == 400


def test_work_arriving_after_its_deadline_is_refused(world: WorldProcess) -> None:
    k = key()
    resp = notify(world, k, deadline=now_ms() - 1)
    assert resp.status_code == 408
    assert world.client.lookup(k)["applied"] is False
    assert world.client.requests(k)[0]["disposition"] == "refused_deadline"


def test_a_request_held_past_its_deadline_is_refused_when_it_gets_to_apply(
        world: WorldProcess) -> None:
    k = key()
    world.client.set_faults(slow_next=1, slow_s=0.6, slow_phase="apply")
    resp = notify(world, k, deadline=now_ms() + 300)
    assert resp.status_code == 408
    assert world.applications(k.split(":")[0]).api == {}


def test_fail_fault_is_a_503_and_applies_nothing(world: WorldProcess) -> None:
    k = key()
    world.client.set_faults(fail_next=2)
    assert [notify(world, k).status_code for _ in range(3)] == [503, 503, 200]
    assert world.applications(k.split(":")[0]).api == {k: 1}
    assert world.client.injected()["fail"] >= 2


def test_drop_fault_applies_then_closes_without_a_reply(world: WorldProcess) -> None:
    k = key()
    world.client.set_faults(drop_next=1)
    with pytest.raises(httpx.RemoteProtocolError):
        notify(world, k)
    assert world.client.lookup(k)["applied"] is True
    assert world.client.requests(k)[0]["disposition"] == "applied+dropped"


def test_slow_reply_fault_applies_at_once_and_replies_late(world: WorldProcess) -> None:
    k = key()
    world.client.set_faults(slow_next=1, slow_s=1.0, slow_phase="reply")
    with pytest.raises(httpx.ReadTimeout):
        notify(world, k, timeout=0.3)
    assert world.client.lookup(k)["applied"] is True


def test_abort_refuses_the_attempt_but_not_a_later_one(world: WorldProcess) -> None:
    k = key()
    deadline = now_ms() + 10_000
    # Held 3 s before applying: the abort must come within that, even on a loaded machine.
    world.client.set_faults(slow_next=1, slow_s=3.0, slow_phase="apply")
    held: list[httpx.Response] = []
    t = threading.Thread(target=lambda: held.append(notify(world, k, deadline=deadline)))
    t.start()
    assert wait_for(lambda: world.client.requests(k), 5)  # received, held before applying
    abort = httpx.post(f"{world.url}/notify/{k}/abort", headers={DEADLINE_HEADER: str(deadline)})
    assert abort.json() == {"key": k, "applied": False, "aborted": True, "result": None}
    t.join()
    assert held[0].status_code == 409
    assert notify(world, k, deadline=deadline + 1).status_code == 200  # a later attempt
    after = httpx.post(f"{world.url}/notify/{k}/abort", headers={DEADLINE_HEADER: "1"}).json()
    assert after["applied"] is True and after["result"]["notification_id"]


def test_random_faults_respect_the_per_key_budget(world: WorldProcess) -> None:
    k = key()
    world.client.set_faults(random={"p_fail": 1.0, "per_key": 1, "seed": 3})
    assert [notify(world, k).status_code for _ in range(3)] == [503, 200, 200]
    world.client.reset_faults()


def test_bad_fault_plans_are_refused(world: WorldProcess) -> None:
    resp = httpx.post(f"{world.url}/control/faults", json={"fail_next": -1})
    assert resp.status_code == 400
    resp = httpx.post(f"{world.url}/control/faults", json={"target": "moon"})
    assert resp.status_code == 400


def test_database_key_column_is_unique_only_in_dedupe_mode(
        dedupe_world: WorldProcess, raw_world: WorldProcess) -> None:
    row = ("k:1", "k", "orders", 1, 1.0, "{}", 0)
    sql = ("INSERT INTO reports (idem_key, run_id, source, count, total, body, written_ms) "
           "VALUES (?, ?, ?, ?, ?, ?, ?)")
    with sqlite3.connect(dedupe_world.db_path) as conn:
        conn.execute(sql, row)
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(sql, row)
    with sqlite3.connect(raw_world.db_path) as conn:
        conn.execute(sql, row)
        conn.execute(sql, row)
    assert raw_world.applications("k").db == {"k:1": 2}
    assert dedupe_world.applications("k").db == {"k:1": 1}


# The pipeline's tools against it ------------------------------------------------------------


def test_write_inserts_once_and_lookup_finds_it(world: WorldProcess) -> None:
    k = key()
    result = Write().run({"source": "orders", "summary": {"count": 2, "total": 3.5}}, ctx(k))
    assert Write().lookup(k, {}).status == "applied"
    assert Write().lookup(k, {}).result == result
    assert Write().lookup(key(), {}).status == "not_applied"


def test_write_refuses_past_its_deadline(world: WorldProcess) -> None:
    k = key()
    late = ToolContext(run_id="r", step=3, key=k, deadline_ms=now_ms() - 1, token=CancelToken())
    with pytest.raises(DeadlinePassed):
        Write().run({"source": "orders", "summary": {"count": 1, "total": 1}}, late)
    assert Write().lookup(k, {}).status == "not_applied"


def _locked(db: str) -> bool:
    conn = sqlite3.connect(db, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        conn.close()


def test_write_waits_out_a_short_database_lock(world: WorldProcess) -> None:
    k = key()
    world.client.set_faults(db_lock_s=0.5)
    assert wait_for(lambda: _locked(world.db_path), 5, 0.01)
    Write().run({"source": "orders", "summary": {"count": 1, "total": 1}}, ctx(k))
    assert not _locked(world.db_path)  # the lock is gone and the row is in: the write waited
    assert world.applications(k.split(":")[0]).db == {k: 1}


def test_notify_maps_503_to_a_retryable_error(world: WorldProcess) -> None:
    world.client.set_faults(fail_next=1)
    with pytest.raises(WorldUnavailable):
        Notify().run({"recipient": "a@b.c", "message": "m"}, ctx(key()))
    assert WorldUnavailable in Notify.retryable


def test_notify_recovers_a_dropped_reply_through_lookup(world: WorldProcess) -> None:
    k = key()
    world.client.set_faults(drop_next=1)
    result = Notify().run({"recipient": "a@b.c", "message": "m"}, ctx(k))
    assert result == world.client.lookup(k)["result"]
    assert world.applications(k.split(":")[0]).api == {k: 1}


def test_notify_canceled_mid_flight_promises_and_keeps_not_applied(world: WorldProcess) -> None:
    """Window: the request is held by the API; the cancel token fires meanwhile."""
    k = key()
    world.client.set_faults(slow_next=1, slow_s=1.0, slow_phase="apply")
    token = CancelToken()

    def cancel_once_held() -> None:  # the request is received; the API holds it 1 s
        if wait_for(lambda: world.client.requests(k), 5):
            token.cancel("test")

    threading.Thread(target=cancel_once_held, daemon=True).start()
    with pytest.raises(Cancelled):
        Notify().run({"recipient": "a@b.c", "message": "m"}, ctx(k, token=token))
    assert wait_for(lambda: world.client.requests(k)[0]["disposition"] != "pending", 10)
    assert world.client.requests(k)[0]["disposition"] == "refused_aborted"
    assert world.applications(k.split(":")[0]).api == {}


def test_fetch_reads_and_refuses_unknown_sources(world: WorldProcess) -> None:
    k = key()
    data = Fetch().run({"source": "orders"}, ctx(k))
    assert data["records"] and data == Fetch().run({"source": "orders"}, ctx(key()))
    with pytest.raises(Refused):
        Fetch().run({"source": "nope"}, ctx(key()))


def test_pipeline_fails_on_a_step_that_did_not_succeed() -> None:
    state = RunState(step=1, input={"source": "orders", "recipient": "a@b.c",
                                    "threshold": 1.0},
                     actions={1: Action(step=1, tool="fetch", key="r:1", status="failed",
                                        error="boom")})
    decision = Pipeline().decide(state)
    assert type(decision).__name__ == "Fail" and "boom" in decision.error  # type: ignore[union-attr]


# The CLI ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_durable_world_serves_shows_and_refuses_a_busy_port(tmp_path: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"DURABLE_WORLD_URL": url, "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([sys.executable, "-m", "examples", "world", "--data-dir",
                             str(tmp_path / "w"), "--no-dedupe"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        client = WorldClient(url)
        assert wait_for(lambda: client.health() or proc.poll() is not None, 15)
        assert proc.poll() is None, "the world exited before it answered"
        assert client.info()["dedupe"] is False
        show = subprocess.run([sys.executable, "-m", "examples", "world", "--show", "--json"],
                              env=env, capture_output=True, text=True, timeout=30)
        assert show.returncode == 0, show.stderr
        assert '"duplicates": {}' in show.stdout
        busy = subprocess.run([sys.executable, "-m", "examples", "world", "--data-dir",
                               str(tmp_path / "w2")], env=env, capture_output=True, text=True,
                              timeout=30)
        assert busy.returncode == 1 and "cannot listen" in busy.stderr
        client.close()
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert b"world on " + url.encode() in out
    mismatch = subprocess.run([sys.executable, "-m", "examples.world", "--port", "0",
                               "--data-dir", str(tmp_path / "w")], env=env, capture_output=True,
                              text=True, timeout=30)
    assert mismatch.returncode != 0 and "no-dedupe mode" in mismatch.stderr
