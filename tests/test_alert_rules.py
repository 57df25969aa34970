"""deploy/prometheus-alerts.yml, loaded by a real Prometheus (Debian's ``prometheus``
package: ``prometheus`` and ``promtool``): the rules parse, name only metrics the system
serves, fire on the series they are meant for (``promtool test rules``), and a Prometheus
scraping ``durable metrics`` evaluates them over a real orphaned run.

Skipped, with why, when the package is not installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from durable.client import Client
from durable.log.keys import KeyLayout
from durable.telemetry.metrics import exposition
from durable.testing import Server, wait_for
from durable.testing.processes import Process
from tests.test_metrics import _names, free_port, scrape

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus-alerts.yml"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (Debian's prometheus package has it)")
    return path


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_tool("promtool"), *args], capture_output=True, text=True,
                          timeout=60)


def test_the_rules_and_the_scrape_config_load_and_use_metrics_that_exist(
        r: Any, layout: KeyLayout) -> None:
    """``promtool check`` accepts the rules and the scrape config that loads them, and every
    metric a rule queries is one the system's endpoint serves."""
    rules = _promtool("check", "rules", str(RULES))
    assert rules.returncode == 0 and "SUCCESS: 9 rules found" in rules.stdout, rules
    config = _promtool("check", "config", str(ROOT / "deploy" / "prometheus.yml"))
    assert config.returncode == 0 and "1 rule files found" in config.stdout, config
    served = _names(exposition(r, layout)[0].decode())
    used = set(re.findall(r"\bdurable_[a-z_]+", RULES.read_text()))
    assert {"durable_runs_orphaned", "durable_resume_failures_total",
            "durable_migration_errors_total", "durable_oldest_waiting_seconds",
            "durable_oldest_outcome_unknown_seconds"} <= used
    assert used <= served, used - served


def _case(series: dict[str, str], at: str, fired: list[dict[str, Any]],
          alert: str) -> dict[str, Any]:
    return {"interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in series.items()],
            "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": fired}]}


def test_the_rules_fire_on_the_series_they_watch_and_not_before(tmp_path: Path) -> None:
    """Prometheus' own rule engine (``promtool test rules``) over given series: an orphan
    fires after 10 min, not after 5; a resume failure and a migration error fire at once,
    with their reason and kind; an unknown outcome fires past 15 min."""
    orphans = {"durable_runs_orphaned": "0 1x20"}
    cases = [
        _case(orphans, "5m", [], "DurableOrphanedRuns"),
        _case(orphans, "12m", [{"exp_labels": {"severity": "page"}}], "DurableOrphanedRuns"),
        _case({'durable_resume_failures_total{reason="nondeterminism"}': "0 0 1 1 1"}, "3m",
              [{"exp_labels": {"severity": "page", "reason": "nondeterminism"}}],
              "DurableResumeFailures"),
        _case({'durable_migration_errors_total{kind="future_version"}': "0 2 2"}, "2m",
              [{"exp_labels": {"severity": "page", "kind": "future_version"}}],
              "DurableMigrationErrors"),
        _case({"durable_oldest_outcome_unknown_seconds": "0+60x30"}, "10m", [],
              "DurableUnknownOutcomeOld"),
        _case({"durable_oldest_outcome_unknown_seconds": "0+60x30"}, "25m",
              [{"exp_labels": {"severity": "page"}}], "DurableUnknownOutcomeOld"),
    ]
    for case in cases:  # promtool compares the annotations whole
        for t in case["alert_rule_test"]:
            for a in t["exp_alerts"]:
                a["exp_annotations"] = _annotations(
                    t["alertname"], case["input_series"][0]["series"], t["eval_time"])
    spec = tmp_path / "alerts-test.yml"  # JSON is YAML
    spec.write_text(json.dumps({"rule_files": [str(RULES)], "evaluation_interval": "1m",
                                "tests": cases}))
    done = _promtool("test", "rules", str(spec))
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def _annotations(alert: str, series: str, at: str) -> dict[str, str]:
    """The annotations the rules give ``alert`` for ``series`` at ``at`` (promtool compares
    them whole)."""
    label = re.search(r'"(.*)"', series)
    value = label.group(1) if label else ""
    texts = {
        "DurableOrphanedRuns": {
            "summary": "1 runs have no valid next event",
            "description": "Runs not over that nothing will move on: no lease, on no ready "
                           "list, no due entry a reconciler will reach, no answer awaited. "
                           "Is a reconciler running? List them with `durable runs "
                           "--orphaned`; `durable repair-index` rebuilds a lost due-set."},
        "DurableResumeFailures": {
            "summary": f"Runs could not be resumed ({value})",
            "description": "A worker took runs over and quarantined them instead of going "
                           "on: changed agent code (nondeterminism), an agent error while "
                           "re-observing, a version policy or an unreadable log. `durable "
                           "runs --state quarantined` shows the reasons."},
        "DurableMigrationErrors": {
            "summary": f"Run logs this code cannot read ({value})",
            "description": "Entries written by a newer schema (a rollback under live runs), "
                           "with no migration, or undecodable: the runs are quarantined, "
                           "nothing is lost. Roll forward, then `durable quarantine release "
                           "RUN`."},
        "DurableUnknownOutcomeOld": {
            "summary": f"An effect's outcome has been unknown for {_minutes(at)}",
            "description": "A dispatched effect waits for reconciliation (the tool's "
                           "lookup) far past any sane deadline: is the reconciler running, "
                           "and does the tool's lookup answer?"},
    }
    return texts[alert]


def _minutes(at: str) -> str:
    return f"{int(at.rstrip('m'))}m 0s"


@pytest.fixture()
def prometheus(server: Server, tmp_path: Path) -> Iterator[str]:
    """``durable metrics`` on a port, and a real Prometheus scraping it every second and
    evaluating deploy/prometheus-alerts.yml every second; yields Prometheus' URL."""
    binary = _tool("prometheus")
    metrics_port, port = free_port(), free_port()
    metrics = Process(server.url, ["metrics", "--port", str(metrics_port)])
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "durable", "static_configs": [
            {"targets": [f"127.0.0.1:{metrics_port}"]}]}]}))
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([binary, f"--config.file={config}",
                                 f"--storage.tsdb.path={tmp_path / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: _ready(url), 60, 0.2), log.read_text()[-2000:]
        assert wait_for(lambda: _up(f"http://127.0.0.1:{metrics_port}/metrics"), 30, 0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        metrics.stop()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _up(url: str) -> bool:
    try:
        scrape(url)
    except httpx.HTTPError:
        return False
    return True


def _alerts(url: str) -> dict[str, str]:
    """Alert name -> state (pending, firing) as Prometheus has evaluated them."""
    data = httpx.get(f"{url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    return {a["labels"]["alertname"]: a["state"] for a in data}


def _value(url: str, query: str) -> float | None:
    result = httpx.get(f"{url}/api/v1/query", params={"query": query},
                       timeout=5).json()["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def test_a_real_prometheus_evaluates_the_orphan_rule_over_a_scrape(
        client: Client, prometheus: str) -> None:
    """A run whose due entry is lost, never enqueued, is scraped as orphaned: Prometheus'
    rule goes pending (it fires after 10 min); once the run is due again (the console's
    reconcile button), the gauge drops to 0 and the alert goes away."""
    run = client.start("count", {"steps": 1}, run_id="lost-1", enqueue=False).run_id
    assert client.redis.zrem(client.log.keys.due_of(run), run) == 1
    assert wait_for(lambda: _alerts(prometheus).get("DurableOrphanedRuns") == "pending", 60,
                    0.5), _alerts(prometheus)
    assert _value(prometheus, "max(durable_runs_orphaned)") == 1
    client.reconcile_soon(run)
    assert wait_for(lambda: _value(prometheus, "max(durable_runs_orphaned)") == 0, 60, 0.5)
    assert wait_for(lambda: "DurableOrphanedRuns" not in _alerts(prometheus), 60, 0.5)
