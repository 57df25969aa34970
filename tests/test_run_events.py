"""A run's events over HTTP (``GET /runs/{id}/events``, ``durable.streams.sse``): server-sent
events a client in any language reads, resumable by ``Last-Event-ID``.

A real ``durable console`` process, a real worker, and httpx as the HTTP client: it reads
part of a run's stream, drops the connection while a step is still emitting, and comes back
with the last id it got. Nothing is missed and nothing comes twice: every entry of the log
once, and every chunk of the step's output once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from durable.client import Client
from durable.security.users import hash_password
from durable.settings import Settings
from durable.streams import partials
from durable.testing import Server, wait_for
from tests.browser import PASSWORDS, Console, serving
from tests.conftest import WorkerFactory

CARL = "carl-pw-1"
#: carl may follow the runs of tenant acme only.
MORE_USERS = f'\n[users.carl]\npassword = "{hash_password(CARL)}"\ntenants = ["acme"]\n'


@pytest.fixture()
def events_console(server: Server, settings: Settings, tmp_path: Path,
                   monkeypatch: pytest.MonkeyPatch) -> Iterator[Console]:
    (tmp_path / "alice.pem").write_bytes(b"")  # alice approves nothing here
    with serving(server, tmp_path, monkeypatch, more_users=MORE_USERS) as running:
        yield running


def frames(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The server-sent events of a stream, as {"id", "event", "data"} (comments left out)."""
    frame: dict[str, Any] = {}
    for line in lines:
        if not line:
            if "event" in frame:
                yield frame
            frame = {}
            continue
        name, _, value = line.partition(": ")
        if name in ("id", "event"):
            frame[name] = value
        elif name == "data":
            frame["data"] = json.loads(value)


def _stream(console: Console, run: str, last: str | None = None,
            auth: tuple[str, str] = ("vera", PASSWORDS["vera"])) -> Any:
    headers = {"Last-Event-ID": last} if last else {}
    return httpx.stream("GET", f"{console.url}/runs/{run}/events", headers=headers,
                        auth=auth, timeout=httpx.Timeout(30.0))


def test_a_client_that_drops_and_reconnects_gets_every_entry_and_chunk_once(
        client: Client, worker: WorkerFactory, events_console: Console,
        tmp_path: Path) -> None:
    """Read until the step's third chunk, drop the connection; the step says three more
    while nobody listens; reconnect with ``Last-Event-ID``: the three missed chunks and the
    rest of the log come, none of what was had comes again, then ``end``."""
    gate = str(tmp_path / "gate")
    run = client.start("gated_chat", {"parts": 6, "first": 3, "gate": gate}).run_id
    worker()
    first: list[dict[str, Any]] = []
    with _stream(events_console, run) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        for frame in frames(resp.iter_lines()):
            first.append(frame)
            if frame["event"] == "partial" and frame["data"]["data"] == {"token": "tok2"}:
                break  # the connection drops here, mid-step
    Path(f"{gate}.1").touch()  # three more chunks, said to nobody
    assert wait_for(lambda: len(partials.kept(client.redis, client.log.keys, run)) == 6, 15)
    last = first[-1]["id"]
    second: list[dict[str, Any]] = []
    with _stream(events_console, run, last) as resp:
        assert resp.status_code == 200
        for frame in frames(resp.iter_lines()):
            second.append(frame)
            if frame["event"] == "partial" and frame["data"]["data"] == {"token": "tok5"}:
                Path(f"{gate}.2").touch()  # now the call may end
            if frame["event"] == "end":
                break
    tokens = [f["data"]["data"]["token"] for f in first + second if f["event"] == "partial"]
    assert tokens == [f"tok{i}" for i in range(6)]  # each once, in order
    got = [f["data"]["id"] for f in first + second if f["event"] == "entry"]
    assert got == [e.id for e in client.events(run)]  # every entry once, in order
    assert [f["data"]["type"] for f in second if f["event"] == "entry"][-1] == "completed"
    assert second[-1] == {"event": "end", "data": {"run": run, "last": got[-1]}}
    assert all(f["id"].startswith(f["data"]["id"]) for f in first + second
               if f["event"] == "entry")


def test_an_entry_id_resumes_after_that_entry(client: Client, worker: WorkerFactory,
                                              events_console: Console) -> None:
    """A finished run read from the third entry on: the entries after it, then ``end``."""
    run = client.start("count", {"steps": 2}).run_id
    worker(burst=True).wait(60)
    ids = [e.id for e in client.events(run)]
    with _stream(events_console, run, ids[2]) as resp:
        got = [f for f in frames(resp.iter_lines())]
    assert [f["data"]["id"] for f in got if f["event"] == "entry"] == ids[3:]
    assert got[-1]["event"] == "end"


def test_who_may_read_which_run(client: Client, worker: WorkerFactory,
                                events_console: Console) -> None:
    """No credentials: 401 with a Basic challenge; a wrong password: 401; a user limited to
    tenant acme: acme's run streams, another tenant's is the 404 of an unknown run; an id
    this stream never sent: 400."""
    ours = client.start("count", {"steps": 1}, tenant="acme").run_id
    theirs = client.start("count", {"steps": 1}, tenant="globex").run_id
    worker(burst=True).wait(60)
    url = events_console.url
    bare = httpx.get(f"{url}/runs/{ours}/events", timeout=10)
    assert bare.status_code == 401 and bare.headers["www-authenticate"].startswith("Basic")
    wrong = httpx.get(f"{url}/runs/{ours}/events", auth=("carl", "nope"), timeout=10)
    assert wrong.status_code == 401
    with _stream(events_console, ours, auth=("carl", CARL)) as resp:
        assert resp.status_code == 200
        assert [f["event"] for f in frames(resp.iter_lines())][-1] == "end"
    for run in (theirs, "no-such-run"):
        refused = httpx.get(f"{url}/runs/{run}/events", auth=("carl", CARL), timeout=10)
        assert refused.status_code == 404 and refused.json() == {"error": f"no run {run}"}
    bad = httpx.get(f"{url}/runs/{ours}/events", auth=("carl", CARL), timeout=10,
                    headers={"Last-Event-ID": "yesterday"})
    assert bad.status_code == 400 and "not an event id" in bad.json()["error"]


def test_durable_a2a_serves_the_same_stream_to_its_callers_tenant(
        client: Client, worker: WorkerFactory, server: Server, settings: Settings,
        tmp_path: Path) -> None:
    """``durable a2a``'s ``GET /runs/{id}/events``: a bearer token of the run's tenant gets
    the stream, resumed after an entry by ``Last-Event-ID``; another tenant's token, the 404
    of an unknown run; no token, a 401."""
    from tests.agent2agent import serving as a2a_serving

    ours = client.start("count", {"steps": 2}, tenant="acme").run_id
    worker(burst=True).wait(60)
    ids = [e.id for e in client.events(ours)]
    with a2a_serving(server, tmp_path / "a2a") as door:
        url = f"{door.url}/runs/{ours}/events"
        with httpx.stream("GET", url, headers={**door.headers("acme-bot"),
                                               "Last-Event-ID": ids[1]}, timeout=30) as resp:
            assert resp.status_code == 200
            got = list(frames(resp.iter_lines()))
        assert [f["data"]["id"] for f in got if f["event"] == "entry"] == ids[2:]
        assert got[-1]["event"] == "end"
        other = httpx.get(url, headers=door.headers("globex-bot"), timeout=10)
        assert other.status_code == 404 and other.json() == {"error": f"no run {ours}"}
        assert httpx.get(url, timeout=10).status_code == 401
