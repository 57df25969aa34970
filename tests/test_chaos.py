"""The chaos suite, short form: runs of ``pipeline`` while workers are SIGKILLed at random
moments and inside the step protocol's windows, and the world (which deduplicates
nothing) fails, drops, delays and locks."""

from __future__ import annotations

import subprocess
import sys

from examples.chaos import ChaosConfig, run_chaos


def test_chaos_short_form_has_no_duplicates_and_every_run_terminal() -> None:
    """Windows: random SIGKILLs of workers holding runs, and replacement workers that
    SIGKILL themselves after_intent / after_effect / after_outcome of a random step; world
    faults fail (503), drop (applied, no reply), slow (reply late or applied past the
    deadline) and database locks. Must end with every run terminal, each key applied once.
    Bounded by progress: it fails when no run took a step or ended for 60 s."""
    cfg = ChaosConfig(runs=60, workers=4, seed=11, kill_every=(0.2, 0.6), fault_workers=0.4,
                      p_fail=0.06, p_drop=0.06, p_slow=0.04, arrive_every_s=0.25,
                      stall_s=60)
    report = run_chaos(cfg)
    print(report.to_json())
    assert report.ok, report.failures()
    assert report.duplicates == {}
    assert report.terminal == report.runs == 60
    assert report.states == {"completed": 60}
    assert report.kills >= 5
    assert sum(report.faults.values()) >= 5
    assert report.api_keys == report.db_keys == 60


def test_chaos_on_a_cluster_has_no_duplicates_and_every_run_terminal() -> None:
    """The same windows with the log on a 3-master Redis Cluster (RQ on a plain server):
    SIGKILLed workers, world faults; every run terminal, each key applied once."""
    # Slower calls keep the runs in flight while kills wait for a worker that holds one
    # (with the default latency all the runs could finish first: few kills).
    cfg = ChaosConfig(runs=20, workers=3, seed=5, kill_every=(0.3, 0.8), fault_workers=0.4,
                      p_slow=0.04, latency_ms=(150.0, 400.0), arrive_every_s=0.5,
                      stall_s=60)
    report = run_chaos(cfg, cluster=True)
    print(report.to_json())
    assert report.redis == "a 3-master Redis Cluster"
    assert report.ok, report.failures()
    assert report.duplicates == {}
    assert report.terminal == report.runs == 20
    assert report.kills >= 3
    assert report.api_keys == report.db_keys == 20


def test_chaos_cli_refuses_bad_arguments() -> None:
    proc = subprocess.run([sys.executable, "-m", "examples", "chaos", "--runs", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--runs" in proc.stderr
