"""The DBOS rows of the I/O-bound comparisons (``bench.iobound``, ``bench.styles``): the same
batch of workflows of sleeping steps, run by ``dbos`` (PyPI) in a process of its own
(``bench.dbosrun``) against a throwaway local PostgreSQL (``bench.pg``), once with threads
(``DBOS.start_workflow``) and once as ``async`` workflows (``DBOS.start_workflow_async``);
plus PostgreSQL commits per step (``pg_stat_database.xact_commit``). When ``dbos`` or
PostgreSQL cannot be had, each row says why instead.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import pg
from bench.common import median
from bench.sampling import machine_busy_s

ROOT = Path(__file__).resolve().parent.parent

DBOS_MODES = (("DBOS, threads (start_workflow)", "threads"),
              ("DBOS, async (start_workflow_async)", "async"))


def _pg_commits(url: str) -> int | None:
    try:
        import psycopg
    except ImportError:
        return None
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT sum(xact_commit) FROM pg_stat_database").fetchone()
            return int(row[0]) if row and row[0] is not None else None
    except Exception:
        return None


def dbos(runs: int, rounds: int, log: Any, *, steps: int, sleep_s: float
         ) -> dict[str, dict[str, Any]]:
    """Each DBOS mode's medians over ``rounds`` batches of ``runs`` workflows of ``steps``
    sleeps of ``sleep_s``, or ``{"unavailable": reason}`` for each."""

    def unavailable(reason: str) -> dict[str, dict[str, Any]]:
        log(f"  iobound DBOS not available: {reason}")
        return {name: {"unavailable": reason} for name, _m in DBOS_MODES}

    if importlib.util.find_spec("dbos") is None:
        return unavailable("the dbos package is not installed (pip install -e '.[bench]')")
    try:
        cm = pg.local_postgres()
        url = cm.__enter__()
    except (pg.Unavailable, OSError) as exc:
        return unavailable(f"PostgreSQL: {exc}")
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name, _m in DBOS_MODES}
    errors: dict[str, str] = {}
    try:
        for rnd in range(rounds):
            for name, mode in DBOS_MODES:
                if name in errors:
                    continue
                c0 = _pg_commits(url)
                m0 = machine_busy_s()
                try:
                    proc = subprocess.run(
                        [sys.executable, "-m", "bench.dbosrun", "--url", url, "--runs",
                         str(runs), "--steps", str(steps), "--sleep", str(sleep_s),
                         "--modes", mode], cwd=ROOT, capture_output=True, text=True,
                        timeout=600)
                except subprocess.TimeoutExpired:
                    errors[name] = "timed out after 600 s"
                    continue
                lines = [json.loads(ln) for ln in proc.stdout.splitlines()
                         if ln.startswith("{")]
                rows = [x for x in lines if x.get("mode") == mode]
                if proc.returncode != 0 or not rows:
                    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
                    errors[name] = f"exit {proc.returncode}: {tail[0][:200]}"
                    continue
                c1 = _pg_commits(url)
                m1 = machine_busy_s()
                res = {**rows[0], **{k: v for x in lines if "launch_s" in x
                                     for k, v in x.items()}}
                res["machine_cpu_s"] = m1 - m0  # the whole process, launch included
                if c0 is not None and c1 is not None:
                    res["pg_commits_per_step"] = (c1 - c0) / (runs * steps)
                samples[name].append(res)
                log(f"  iobound round {rnd + 1}/{rounds} {name:36s} wall "
                    f"{res['wall_s']:6.2f} s (starts {res['start_s']:.2f} s)")
    finally:
        cm.__exit__(None, None, None)
    out: dict[str, dict[str, Any]] = {}
    for name, _m in DBOS_MODES:
        ss = samples[name]
        if not ss:
            out[name] = {"unavailable": f"DBOS failed: {errors.get(name, '?')}"}
            continue
        row: dict[str, Any] = {"runs": runs, "all": [round(s["wall_s"], 3) for s in ss]}
        for k in ("wall_s", "start_s", "rss_peak_mb", "threads_peak", "rss_idle_mb",
                  "cpu_s", "machine_cpu_s",
                  "launch_s", "pg_commits_per_step"):
            vals = [s[k] for s in ss if k in s]
            if vals:
                row[k] = median(vals)
        row["ratio_to_ideal"] = row["wall_s"] / (steps * sleep_s)
        out[name] = row
    return out
