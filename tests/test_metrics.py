"""Prometheus metrics after a known workload, against what the logs say.

A real worker process (with ``--metrics-port``) drives runs of the example and test agents
through success, a failure, an unknown outcome resolved by ``lookup``, a cancel and a wait.
Then ``durable.telemetry.metrics.exposition`` and the worker's own endpoint are scraped over
HTTP and parsed with prometheus-client's parser; every counter is compared with a count made here,
from the runs' logs.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from durable.client import Client
from durable.log import counters
from durable.log import events as ev
from durable.log.keys import KeyLayout
from durable.telemetry.metrics import exposition
from durable.testing import Server, wait_for
from durable.workers import metrics as worker_metrics
from examples.world import WorldProcess
from tests.conftest import WorkerFactory

Labels = tuple[tuple[str, str], ...]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def samples(text: str) -> dict[str, dict[Labels, float]]:
    """Sample name -> sorted label pairs -> value."""
    out: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def scrape(url: str) -> str:
    with httpx.Client(timeout=10) as http:
        reply = http.get(url)
        reply.raise_for_status()
        assert reply.headers["content-type"].startswith("text/plain")
        return reply.text


def from_logs(client: Client) -> dict[str, Any]:
    """Every count the metrics claim, made from the logs of every run."""
    steps: Counter[Labels] = Counter()
    worker_calls: Counter[tuple[str, str, str]] = Counter()  # actor, tool, outcome
    lookups: Counter[str] = Counter()
    duplicates = 0
    durations: dict[str, list[int]] = {}
    cancels: list[int] = []
    finals: Counter[str] = Counter()
    ended: Counter[Labels] = Counter()
    in_doubt: list[int] = []  # dispatch -> reconciled, ms
    run_ids = [r.decode() for shard in client.log.keys.shard_ids()
               for r in client.redis.zrange(client.log.keys.runs_index(shard), 0, -1)]
    for run in run_ids:
        agent, tools, dispatched, sent = "", {}, {}, {}
        for entry in client.events(run):
            e = entry.event
            assert e is not None
            if isinstance(e, ev.RunStarted):
                agent = e.agent
            elif isinstance(e, ev.StepDecided):
                tools[e.step] = e.tool
            elif isinstance(e, ev.ActionDispatched):
                dispatched[e.step] = sent[e.step] = e.ts
            elif type(e) in counters.OUTCOMES:
                step: int = e.step  # type: ignore[attr-defined]
                outcome = counters.OUTCOMES[type(e)]
                tool = tools[step]
                steps[(("agent", agent), ("outcome", outcome), ("tool", tool))] += 1
                if isinstance(e, ev.ActionReconciled):
                    in_doubt.append(e.ts - sent[step])
                    if e.by == "":
                        lookups[e.resolution] += 1
                        duplicates += e.resolution == "applied"
                else:
                    worker_calls[(e.actor, tool, outcome)] += 1
                    if step in dispatched:
                        durations.setdefault(tool, []).append(e.ts - dispatched[step])
                dispatched.pop(step, None)
            elif isinstance(e, ev.Canceled):
                cancels.append(e.latency_ms)
        final = client.status(run)
        finals[final.state] += 1
        if final.terminal:
            ended[(("agent", agent), ("state", final.state))] += 1
    return {"steps": steps, "lookups": lookups, "duplicates": duplicates,
            "durations": durations, "cancels": cancels, "finals": finals,
            "ended": ended, "in_doubt": in_doubt,
            "worker_calls": worker_calls, "runs": run_ids}


@pytest.mark.cluster  # on a cluster: one counters hash per shard, summed
def test_counters_equal_the_events_in_the_logs(client: Client, worker: WorkerFactory,
                                               world: WorldProcess, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Success, a non-retryable failure, a lost reply resolved by lookup (applied: not sent
    again), a cancel mid-call and a wait, by one worker; then both endpoints are scraped."""
    monkeypatch.setenv("TEST_DB", str(tmp_path / "effects.sqlite"))
    monkeypatch.setenv("TEST_FLAKY_FILE", str(tmp_path / "flaky"))
    port = free_port()
    # A lease that outlasts a loaded machine's pauses: a lost lease would discard a call's
    # outcome the worker's own counter already has.
    proc = worker(metrics_port=port, DURABLE_LEASE_TTL_MS="5000")
    try:
        done = [client.start("count", {"steps": 3}).run_id for _ in range(3)]
        done.append(client.start("pipeline", {}).run_id)
        done.append(client.start("unsure", {"steps": 2}).run_id)
        done.append(client.start("persistent", {"boom": True}).run_id)
        slow = client.start("count", {"steps": 3, "sleep_s": 30}).run_id
        asker = client.start("asker", {"text": "hi"}).run_id
        assert wait_for(lambda: (a := client.status(slow).actions.get(1)) is not None
                        and a.status == "dispatched", 30)
        client.cancel(slow, "metrics test")
        for run in [*done, slow]:
            assert client.wait(run, timeout=60).terminal, run
        assert client.wait(asker, timeout=30).state == "waiting_input"
        time.sleep(0.05)  # the waiting run is measurably old

        logs = from_logs(client)
        body, ctype = exposition(client)
        assert ctype.startswith("text/plain")
        shared = samples(body.decode())
        worker_text = scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        proc.stop()

    # The shared counters: one sample per (agent, tool, outcome), equal to the logs.
    assert {k: v for k, v in shared["durable_steps_total"].items()} == \
        {k: float(v) for k, v in logs["steps"].items()}
    assert logs["lookups"]["applied"] == 2  # the workload did what the test means it to
    assert shared["durable_lookups_total"] == \
        {(("answer", a),): float(n) for a, n in logs["lookups"].items()}
    assert shared["durable_duplicates_suppressed_total"][()] == logs["duplicates"] == 2
    for tool, values in logs["durations"].items():
        assert shared["durable_step_duration_seconds_count"][(("tool", tool),)] == len(values)
        assert shared["durable_step_duration_seconds_sum"][(("tool", tool),)] == \
            pytest.approx(sum(values) / 1000)
        inf = (("le", "+Inf"), ("tool", tool))
        assert shared["durable_step_duration_seconds_bucket"][inf] == len(values)
    assert len(shared["durable_step_duration_seconds_count"]) == len(logs["durations"])
    assert len(logs["cancels"]) == 1
    assert shared["durable_cancel_latency_seconds_count"][()] == len(logs["cancels"])
    assert shared["durable_cancel_latency_seconds_sum"][()] == \
        pytest.approx(sum(logs["cancels"]) / 1000)
    # Runs' ends by agent and state, and how long the unknown outcomes were in doubt.
    assert set(logs["ended"].values()) and logs["finals"]["failed"] == 1
    assert shared["durable_runs_ended_total"] == {k: float(v) for k, v in logs["ended"].items()}
    assert len(logs["in_doubt"]) == 2
    assert shared["durable_unknown_outcome_seconds_count"][()] == 2
    assert shared["durable_unknown_outcome_seconds_sum"][()] == \
        pytest.approx(sum(logs["in_doubt"]) / 1000)
    # Gauges, from the indexes.
    for state, n in logs["finals"].items():
        assert shared["durable_runs"][(("state", state),)] == n, state
    assert sum(shared["durable_runs"].values()) == len(logs["runs"])
    oldest = shared["durable_oldest_waiting_seconds"]
    assert oldest[(("state", "waiting_input"),)] > 0
    assert oldest[(("state", "waiting_approval"),)] == 0
    assert shared["durable_oldest_outcome_unknown_seconds"][()] == 0  # all were resolved

    # The worker's own endpoint: the calls this process made, by tool and outcome.
    own = samples(worker_text)
    assert "process_resident_memory_bytes" in own
    calls = {(("outcome", o), ("tool", t)): float(n)
             for (_actor, t, o), n in logs["worker_calls"].items()}
    assert own["durable_worker_steps_total"] == calls
    assert own["durable_worker_slots"][()] == client.settings.worker.concurrency


def test_lease_expiries_and_reconciler_actions(client: Client, worker: WorkerFactory,
                                               reconciler: Any) -> None:
    """Window: a worker SIGKILLed after step 1's effect, before its outcome is recorded: its
    lease expires instead of being released. The reconciler takes the run (counting the
    expiry once) and requeues it; a second worker finishes it, releasing its lease (no
    expiry). Counted from the logs: one lease taken per job, one of them after the kill."""
    run = client.start("count", {"steps": 2}).run_id
    # The test's 1 s lease expires soon; its liveness key outlives the test, so the
    # reconciler's liveness watch does not release the lease first (no expiry then).
    killed = worker(kill_at="after_effect:1", DURABLE_LIVENESS_TTL_MS="60000")
    assert killed.wait(30) != 0
    reconciler(DURABLE_LEASE_TTL_MS="5000")  # leases no pause of a loaded machine outlasts
    worker(DURABLE_LEASE_TTL_MS="5000")
    assert client.wait(run, timeout=60).state == "completed"
    shared = samples(exposition(client)[0].decode())
    stats = client.stats()
    owners = [e.event.owner for e in client.events(run)
              if isinstance(e.event, ev.LeaseAcquired)]
    assert len(owners) == 2 and owners[0] != owners[1]  # the killed worker's, the next one's
    assert shared["durable_lease_expiries_total"][()] == 1
    assert shared["durable_reconciler_actions_total"][(("action", "requeued"),)] == \
        stats["requeued"] >= 1


def test_durable_metrics_serves_the_same_over_http(server: Server, client: Client,
                                                   worker: WorkerFactory) -> None:
    """``durable metrics --port P`` serves what ``exposition`` returns."""
    run = client.start("count", {"steps": 2}).run_id
    worker()
    assert client.wait(run, timeout=30).state == "completed"
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "durable", "metrics", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        def up() -> bool:
            try:
                scrape(url)
            except httpx.HTTPError:
                return False
            return True

        assert wait_for(up, 30, 0.1)
        served = samples(scrape(url))
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    assert served["durable_steps_total"] == samples(exposition(client)[0].decode())[
        "durable_steps_total"]
    assert served["durable_steps_total"][
        (("agent", "count"), ("outcome", "succeeded"), ("tool", "noop"))] == 2


def _on_a_taken_port(*argv: str) -> tuple[int, subprocess.CompletedProcess[str]]:
    """Run ``durable ARGV PORT`` while PORT is taken by a listening socket of this test."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "durable", *argv, str(port)],
                              capture_output=True, text=True, timeout=60)
    return port, done


def test_a_port_in_use_is_one_line(client: Client) -> None:
    """Bad input: a port already taken is refused in one line, exit code 2."""
    port, done = _on_a_taken_port("metrics", "--port")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr


def _names(text: str) -> set[str]:
    """Every sample name the families in ``text`` can have."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "gauge": ("",)}
    return {f.name + sfx for f in text_string_to_metric_families(text)
            for sfx in suffixes.get(f.type, ("",))}


def test_the_dashboard_and_scrape_config_use_metrics_that_exist(r: Any,
                                                                layout: KeyLayout) -> None:
    """deploy/grafana-dashboard.json queries only names the two endpoints serve, and every
    metric the issue names is served."""
    assert worker_metrics.CALLS  # imported: the worker's own metrics are registered
    root = Path(__file__).resolve().parent.parent
    served = _names(exposition(r, layout)[0].decode()) | _names(generate_latest(REGISTRY).decode())
    dashboard = json.loads((root / "deploy" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {n for e in exprs for n in re.findall(r"\b(?:durable|process)_[a-z_]+", e)}
    assert used and used <= served, used - served
    assert {"durable_steps_total", "durable_runs", "durable_oldest_waiting_seconds",
            "durable_duplicates_suppressed_total", "durable_lookups_total",
            "durable_cancel_latency_seconds_bucket", "durable_step_duration_seconds_bucket",
            "durable_lease_expiries_total", "durable_reconciler_actions_total"} <= served
    scrape = (root / "deploy" / "prometheus.yml").read_text()
    assert "job_name: durable\n" in scrape and "job_name: durable-workers" in scrape


def test_a_worker_whose_metrics_port_is_taken_says_so_and_takes_nothing(
        client: Client, worker: WorkerFactory) -> None:
    """Bad input: ``--metrics-port`` on a port in use ends the worker at once with one line
    (exit 2), before it takes any run."""
    run = client.start("count", {"steps": 1}).run_id
    port, done = _on_a_taken_port("worker", "--metrics-port")
    assert done.returncode == 2, done.stderr
    assert done.stderr == \
        f"durable: --metrics-port: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    assert client.status(run).state == "pending" and client.status(run).version == 1


def _gen0_passes(port: int) -> float | None:
    """The worker's young-generation collector passes so far; None while it does not serve
    its metrics yet."""
    try:
        text = scrape(f"http://127.0.0.1:{port}/metrics")
    except httpx.TransportError:
        return None
    return samples(text)["python_gc_collections_total"][(("generation", "0"),)]


def _passes_over_120_runs(client: Client, worker: WorkerFactory, threshold: str) -> float:
    """Young-generation passes of a worker at ``threshold`` while it runs 120 runs held at
    once (3 steps of 0.2 s each)."""
    port = free_port()
    proc = worker(metrics_port=port, DURABLE_GC_THRESHOLD=threshold)
    try:
        assert wait_for(lambda: _gen0_passes(port) is not None, 30)
        # A run done: the worker serves, its collector is set (before its first job).
        warm = client.start("count", {"steps": 1}).run_id
        assert client.wait(warm, timeout=30).state == "completed"
        before = _gen0_passes(port)
        assert before is not None
        runs = [s.run_id for s in
                client.start_many("count", [{"steps": 3, "sleep_s": 0.2}] * 120)]
        for run in runs:
            assert client.wait(run, timeout=60).state == "completed", run
        after = _gen0_passes(port)
        assert after is not None
        return after - before
    finally:
        proc.stop()


def test_a_worker_holding_runs_runs_the_cycle_collector_rarely(
        client: Client, worker: WorkerFactory) -> None:
    """``DURABLE_GC_THRESHOLD`` (``workers.runtime.tune_collector``): the same 120 runs held
    at once, through a worker at the default threshold and one at the interpreter's (0:
    700), counted by the worker's own GC metric (prometheus-client's collector). The
    default's young-generation passes are a small fraction of the interpreter's."""
    passes = {t: _passes_over_120_runs(client, worker, t) for t in ("50000", "0")}
    assert passes["0"] >= 10, passes  # the workload is big enough to tell them apart
    assert passes["50000"] * 10 <= passes["0"], passes
