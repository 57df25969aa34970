"""Large tool results are kept whole beside the run, never replaced: the agent gets them
before and after a crash; past the ceiling or the run's budget the step fails with
``PayloadTooLarge``; they are sealed, archived, expired and verified with the run, and the
log shows a reference, not megabytes. Real worker processes, real SIGKILLs."""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from durable.audit.verify import verify
from durable.client import Client
from durable.log.fold import fold
from durable.log.keys import KeyLayout
from durable.testing import wait_for
from tests.conftest import ReconcilerFactory, WorkerFactory
from tests.pages import page, sha

MB = 1_000_000
AGENTS = ["page_reader", "page_decider"]


@pytest.fixture(autouse=True)
def _env(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker loads these agents; their tool marks ``token`` sensitive, so a key. The
    client registers them now, not when the module is collected: a sensitive tool in the
    registry of the whole test process would make its in-process CLI ask for keys."""
    importlib.import_module("tests.agents.large_values")
    monkeypatch.setenv("DURABLE_AGENTS",
                       os.environ["DURABLE_AGENTS"] + ",tests.agents.large_values")
    monkeypatch.setenv("DURABLE_ENCRYPTION_KEYS",
                       f"k1:{base64.b64encode(os.urandom(32)).decode()}")


def durable(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durable", *args],
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120)


def expected(n: int, size: int) -> dict[str, Any]:
    body = page(size, f"page-{n}")
    return {"sha256": sha(body), "bytes": size}


def noted(client: Client, run: str, step: int) -> Any:
    """What the agent recorded, live, in its ``note`` step's arguments."""
    return client.status(run).actions[step].args["seen"]


def stored(layout: KeyLayout, r: redis.Redis, run: str) -> dict[bytes, bytes]:
    blobs: dict[bytes, bytes] = r.hgetall(layout.blobs(run))
    return blobs


@pytest.mark.cluster
@pytest.mark.parametrize("window", ["after_effect", "after_outcome"])
@pytest.mark.parametrize("name", AGENTS)
def test_a_1mb_result_reaches_the_agent_whole_before_and_after_a_crash(
    layout: KeyLayout, name: str, window: str, client: Client, r: redis.Redis,
    worker: WorkerFactory,
    reconciler: ReconcilerFactory,
) -> None:
    """SIGKILL at step 1's window: ``after_effect`` (the page was fetched, its outcome not
    recorded: fetched again) or ``after_outcome`` (the outcome and its 1 MB value recorded
    with the next intent, the note computed live from the page: the next worker reads the
    value back, and the agent must decide the same note from it, else the run would be
    quarantined). The note recorded before the crash and the result computed after it
    both hold the digest of the whole page; the log entry holds a reference only."""
    run = client.start(name, {"pages": [MB]}, run_id=f"big-{name}-{window}").run_id
    doomed = worker(kill_at=f"{window}:1")
    assert doomed.wait(60) == -signal.SIGKILL
    worker()
    reconciler()
    final = client.wait(run, timeout=60)
    assert final.state == "completed", (final.state, final.reason, final.error)
    want = [expected(1, MB)]
    assert final.result == {"seen": want}
    assert noted(client, run, 2) == want

    # Step 1 as the log folds it (a code agent's checkpoints keep only its latest step, so
    # the projection's window may not hold it any more).
    act = fold([e.event for e in client.events(run) if e.event is not None]).actions[1]
    assert act.result is None and act.blob is not None  # a reference, not the value
    assert act.blob.size > MB
    values = stored(layout, r, run)
    assert list(values) == [act.blob.field.encode()]
    assert hashlib.sha256(values[act.blob.field.encode()]).hexdigest() == act.blob.sha256
    entries = r.xrange(client.log.keys.log(run))
    assert max(len(fields[b"e"]) for _, fields in entries) < 4096
    k = client.log.keys
    assert key_slot(k.blobs(run).encode()) == key_slot(k.log(run).encode())
    report = verify(client.log, run)
    assert report.ok and report.checks["large_values"] == "ok", report.checks


@pytest.mark.parametrize("name", AGENTS)
def test_past_the_ceiling_the_agent_sees_a_payload_too_large_step_failure(
    layout: KeyLayout, name: str, client: Client, r: redis.Redis, worker: WorkerFactory,
) -> None:
    """A code agent's ``ctx.call`` raises ``StepFailed``, a ``decide()`` agent sees the
    action failed, both naming ``PayloadTooLarge`` and the limit; nothing is stored and
    the next page, under the ceiling, is kept."""
    run = client.start(name, {"pages": [400_000, 300_000]}, run_id=f"ceil-{name}").run_id
    worker(burst=True, DURABLE_MAX_RESULT_BYTES="350000").wait(60)
    final = client.wait(run, timeout=30)
    assert final.state == "completed", (final.state, final.reason, final.error)
    failed, kept = final.result["seen"]
    assert failed["status"] == "failed" and failed["error_type"] == "PayloadTooLarge"
    assert "over the limit of 350000 (DURABLE_MAX_RESULT_BYTES)" in failed["error"]
    assert kept == expected(2, 300_000)
    assert [f.decode().split(".")[0] for f in stored(layout, r, run)] == ["2"]


def test_a_ceiling_below_the_inline_limit_still_holds(
    client: Client, r: redis.Redis, worker: WorkerFactory, layout: KeyLayout,
) -> None:
    """``DURABLE_MAX_RESULT_BYTES`` under ``DURABLE_MAX_PAYLOAD_BYTES`` (the inline limit):
    a result between the two is refused by the ceiling, not kept inline because it fits."""
    run = client.start(AGENTS[0], {"pages": [200_000, 50_000]}, run_id="low-ceil").run_id
    worker(burst=True, DURABLE_MAX_RESULT_BYTES="100000").wait(60)
    final = client.wait(run, timeout=30)
    assert final.state == "completed", (final.state, final.reason, final.error)
    failed, kept = final.result["seen"]
    assert failed["status"] == "failed" and failed["error_type"] == "PayloadTooLarge"
    assert "over the limit of 100000 (DURABLE_MAX_RESULT_BYTES)" in failed["error"]
    assert kept == expected(2, 50_000)
    assert stored(layout, r, run) == {}


def test_the_run_byte_budget_fails_the_step_that_would_exceed_it(
    layout: KeyLayout, client: Client, r: redis.Redis, worker: WorkerFactory,
) -> None:
    run = client.start("page_reader", {"pages": [400_000, 400_000, 100]},
                       run_id="budget").run_id
    worker(burst=True, DURABLE_BLOB_BUDGET_BYTES="700000").wait(60)
    final = client.wait(run, timeout=30)
    assert final.state == "completed", (final.state, final.reason, final.error)
    first, second, small = final.result["seen"]
    assert first == expected(1, 400_000) and small == expected(3, 100)
    assert second["error_type"] == "PayloadTooLarge"
    assert "over the limit of 700000 (DURABLE_BLOB_BUDGET_BYTES)" in second["error"]
    state = client.status(run)
    assert state.blob_bytes == state.actions[1].blob.size  # type: ignore[union-attr]
    assert len(stored(layout, r, run)) == 1


def test_a_large_sensitive_result_is_sealed_at_rest_and_whole_for_the_agent(
    layout: KeyLayout, client: Client, r: redis.Redis, worker: WorkerFactory,
) -> None:
    run = client.start("page_reader", {"pages": [400_000], "secret": True},
                       run_id="sealed-big").run_id
    worker(burst=True).wait(60)
    final = client.wait(run, timeout=30)
    assert final.state == "completed", (final.state, final.reason, final.error)
    token = page(400_000, "token")
    assert final.result["seen"][0]["token_sha256"] == sha(token)
    (value,) = stored(layout, r, run).values()
    assert b"_sealed" in value and token[:64].encode() not in value
    assert page(400_000, "page-1")[:64].encode() in value  # what is not sensitive stays
    assert verify(client.log, run).ok


def test_archive_carries_the_value_and_deletes_it_with_the_run(
    client: Client, r: redis.Redis, worker: WorkerFactory, tmp_path: Path,
) -> None:
    run = client.start("page_reader", {"pages": [300_000]}, run_id="arch").run_id
    worker(burst=True).wait(60)
    assert client.wait(run, timeout=30).state == "completed"
    ref = client.status(run).actions[1].blob
    assert ref is not None
    done = durable("archive", "--older-than", "1ms", "--to", str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["archived"] == [run]
    assert not r.exists(client.log.keys.blobs(run)) and not r.exists(client.log.keys.log(run))
    with gzip.open(tmp_path / f"{run}.jsonl.gz", "rt") as f:
        lines = [json.loads(line) for line in f]
    (kept,) = [line for line in lines if line["kind"] == "blob"]
    assert kept["field"] == ref.field and kept["sha256"] == ref.sha256
    assert hashlib.sha256(kept["data"].encode()).hexdigest() == ref.sha256
    assert json.loads(kept["data"])["body"] == page(300_000, "page-1")


def test_retention_expires_the_value_with_the_run(
    client: Client, r: redis.Redis, worker: WorkerFactory,
) -> None:
    run = client.start("page_reader", {"pages": [300_000]}, run_id="ret").run_id
    worker(burst=True, DURABLE_RETENTION="2s").wait(60)
    assert client.wait(run, timeout=30).state == "completed"
    ttl = r.pttl(client.log.keys.blobs(run))
    assert 0 < ttl <= 2000 and 0 < r.pttl(client.log.keys.log(run)) <= 2000
    assert wait_for(lambda: not r.exists(client.log.keys.blobs(run), client.log.keys.log(run)), 10)


def test_verify_checks_the_digest_and_log_and_export_show_a_reference(
    layout: KeyLayout, client: Client, r: redis.Redis, worker: WorkerFactory,
) -> None:
    run = client.start("page_decider", {"pages": [MB]}, run_id="shown").run_id
    worker(burst=True).wait(60)
    assert client.wait(run, timeout=30).state == "completed"
    ref = client.status(run).actions[1].blob
    assert ref is not None
    for command in (("log", "--json"), ("export",), ("status", "--json"), ("log",)):
        shown = durable(*command, run)
        assert shown.returncode == 0, shown.stderr
        text = "".join(shown.stdout.split())  # a table may wrap the digest
        assert ref.sha256 in text or ref.sha256[:20] in text, command
        assert len(shown.stdout) < 50_000, (command, len(shown.stdout))
    assert durable("verify", run).returncode == 0

    forked = durable("fork", run, "--at", client.events(run)[-1].id, "--new-run-id", "shown2")
    assert forked.returncode == 0, forked.stderr
    assert verify(client.log, "shown2").checks["large_values"] == "ok"
    assert list(stored(layout, r, "shown2").values()) == list(stored(layout, r, run).values())

    r.hset(client.log.keys.blobs(run), ref.field, b'{"body": "altered"}')
    report = verify(client.log, run)
    assert not report.ok and "does not match the digest" in report.checks["large_values"]
    assert durable("verify", run).returncode == 1
    r.hdel(client.log.keys.blobs(run), ref.field)
    assert "missing" in verify(client.log, run).checks["large_values"]


def test_a_missing_value_quarantines_the_run_instead_of_giving_the_agent_none(
    client: Client, r: redis.Redis, worker: WorkerFactory, reconciler: ReconcilerFactory,
) -> None:
    """Killed after step 1's outcome (its value recorded); the value is then deleted
    behind the system's back: the next worker refuses to give the agent anything else."""
    run = client.start("page_decider", {"pages": [300_000]}, run_id="lost").run_id
    assert worker(kill_at="after_outcome:1").wait(60) == -signal.SIGKILL
    r.delete(client.log.keys.blobs(run))
    worker()
    reconciler()
    assert wait_for(lambda: client.status(run).state == "quarantined", 30)
    assert "missing" in (client.status(run).reason or "")


def test_a_runs_result_over_the_ceiling_fails_the_run_naming_the_limit(
    client: Client, r: redis.Redis, worker: WorkerFactory, layout: KeyLayout,
) -> None:
    """Bad input: an agent ends its run with a result over ``DURABLE_MAX_RESULT_BYTES``, each
    of its steps' results under it. The run fails (reason ``result_too_large``) naming the
    size and the limit, no ``completed`` is written (the result is not in the log), and the
    steps' results stay as evidence."""
    run = client.start("page_returner", {"pages": [60_000, 60_000]}, run_id="big-end").run_id
    worker(burst=True, DURABLE_MAX_RESULT_BYTES="100000").wait(60)
    final = client.wait(run, timeout=30)
    assert final.state == "failed", (final.state, final.reason, final.error)
    assert final.reason == "result_too_large"
    assert final.error is not None and "the run's result is" in final.error
    assert "over the limit of 100000 (DURABLE_MAX_RESULT_BYTES)" in final.error
    assert final.result is None
    assert [sha(a.result["body"]) for a in final.actions.values()] == \
        [expected(1, 60_000)["sha256"], expected(2, 60_000)["sha256"]]
    raw = r.xrevrange(layout.log(run), count=1)[0][1][b"e"]
    assert len(raw) < 1000  # the failure, not the 120 KB result
