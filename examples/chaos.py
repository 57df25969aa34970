"""The chaos suite: many runs of ``pipeline`` while workers die and the world misbehaves.

``python -m examples chaos --runs N [--workers K] [--seed S]`` starts an embedded Redis,
the world in its non-deduplicating mode (no unique key column, no deduplication by key in
the API: only the system's ledger and lookups stand between a retry and a duplicate), K
workers and the reconciler (or the recovery loop when this installation has no
reconciler), then N runs.
Meanwhile it SIGKILLs a random worker every so often and replaces it (some replacements die
by themselves inside a step-protocol window), the world fails, drops or delays random calls
(at most one fault per key) and now and then locks its database.

It reports runs, kills, faults injected, applications per key, duplicates (must be 0),
runs terminal (must be N), every run's ``verify``, and the time each killed worker's runs
took to come back (kill -> the next event another process wrote in the run's log). Exit
status 1 when there is a duplicate, a lost effect, a failed verify, or runs that stopped
making progress before they were all terminal.

The suite is bounded by progress, not by a wall clock that a loaded machine defeats. A kill
falls due after a random pause, and then only once every run the last victim held has come
back (another process wrote in its log) and some worker holds a run (a worker still
importing its modules holds nothing, and killing it tests nothing). The bound counts from
the last progress (a run took a step or ended), so a slow machine makes the suite longer,
never wrong.
"""

from __future__ import annotations

import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from durable.audit.verify import verify
from durable.log.state import TERMINAL
from durable.log.store import now_ms
from examples.scenarios.pool import WorkerPool
from examples.scenarios.stack import Scene, Stack
from examples.world.server import SOURCES


@dataclass
class ChaosConfig:
    runs: int = 100
    workers: int = 4
    seed: int = 0
    #: Seconds between two random SIGKILLs (uniform in this range).
    kill_every: tuple[float, float] = (0.8, 2.0)
    #: Share of replacement workers that carry a fault point.
    fault_workers: float = 0.3
    p_fail: float = 0.04
    p_drop: float = 0.04
    p_slow: float = 0.02
    #: The world's service time per effect call (ms, uniform in this range).
    latency_ms: tuple[float, float] = (20.0, 120.0)
    #: Seconds between two database locks, and how long each one holds.
    db_lock_every: tuple[float, float] = (3.0, 6.0)
    db_lock_s: float = 0.4
    #: Seconds between two starts (0: all at once). Runs arriving over time keep work in
    #: flight for the kills, however fast the machine finishes each run.
    arrive_every_s: float = 0.0
    #: The runs fail the suite when none of them took a step or ended for this long.
    stall_s: float = 60.0


@dataclass
class ChaosReport:
    config: ChaosConfig
    #: Where the log lived: "one server" or "a 3-master Redis Cluster".
    redis: str = "one server"
    runs: int = 0
    terminal: int = 0
    states: dict[str, int] = field(default_factory=dict)
    kills: int = 0
    kills_by: dict[str, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    api_keys: int = 0
    db_keys: int = 0
    applications: int = 0
    duplicates: dict[str, int] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)
    verify_failed: dict[str, Any] = field(default_factory=dict)
    recovery_ms: list[int] = field(default_factory=list)
    #: The slowest recoveries: "<run> <ms> ms (<how the worker died>)".
    slowest: list[str] = field(default_factory=list)
    recovery_by: str = ""
    seconds: float = 0.0
    all_terminal_s: float | None = None
    not_terminal: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (not self.duplicates and self.terminal == self.runs and not self.lost
                and not self.verify_failed)

    def recovery(self) -> dict[str, int | None]:
        xs = sorted(self.recovery_ms)
        if not xs:
            return {"n": 0, "p50": None, "p95": None, "max": None}
        return {"n": len(xs), "p50": int(statistics.median(xs)),
                "p95": xs[min(len(xs) - 1, int(0.95 * len(xs)))], "max": xs[-1]}

    def failures(self) -> list[str]:
        out = []
        if self.duplicates:
            out.append(f"duplicate applications: {self.duplicates}")
        if self.terminal != self.runs:
            out.append(f"{self.runs - self.terminal} runs not terminal, no progress in "
                       f"{self.config.stall_s} s: {self.not_terminal[:10]}")
        if self.lost:
            out.append(f"completed runs missing an effect: {self.lost[:10]}")
        if self.verify_failed:
            out.append(f"verify failed: {dict(list(self.verify_failed.items())[:5])}")
        return out

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k not in ("config", "recovery_ms")}
        data["config"] = dict(self.config.__dict__)
        data["recovery"] = self.recovery()
        data["duplicate_count"] = len(self.duplicates)
        data["ok"] = self.ok
        return data


Progress = Callable[[str, dict[str, Any]], None]


def _states(scene: Scene, run_ids: list[str]) -> dict[str, tuple[str, int, int]]:
    """Each run's state, step and version."""
    pipe = scene.client.redis.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.hmget(scene.client.log.keys.run(run_id), "state", "step", "version")
    return {run_id: ((state or b"?").decode(), int(step or 0), int(version or 0))
            for run_id, (state, step, version) in zip(run_ids, pipe.execute(), strict=True)}


def _drive(scene: Scene, cfg: ChaosConfig, pool: WorkerPool,
           starts: list[tuple[str, dict[str, Any]]], rng: random.Random,
           progress: Progress | None) -> tuple[dict[str, str], float | None]:
    """Start the runs, kill, lock and replace until every run is terminal, or until the runs
    made no progress (no step taken, no run ended) for ``cfg.stall_s``."""
    run_ids = [run_id for run_id, _ in starts]
    waiting = list(reversed(starts))
    started = next_start = time.monotonic()
    next_kill = started + rng.uniform(*cfg.kill_every)
    next_lock = started + rng.uniform(*cfg.db_lock_every)
    next_look = last_progress = started
    seen = (-1, -1)
    #: The runs the last victim held -> their version when it died.
    held: dict[str, int] = {}
    states: dict[str, tuple[str, int, int]] = {}
    while time.monotonic() - last_progress < cfg.stall_s:
        now = time.monotonic()
        while waiting and now >= next_start:
            run_id, data = waiting.pop()
            scene.client.start("pipeline", data, run_id=run_id)
            next_start += cfg.arrive_every_s
            last_progress = now
        pool.reap()
        if now >= next_kill and not held:
            death = pool.kill_random(min_age=0.0, holding=True)
            if death is not None:
                held = {r: v for r, (_, _, v) in _states(scene, death.runs).items()}
                next_kill = now + rng.uniform(*cfg.kill_every)
        if now >= next_lock and cfg.db_lock_s > 0:
            scene.world.set_faults(db_lock_s=cfg.db_lock_s)
            next_lock = now + rng.uniform(*cfg.db_lock_every)
        if now >= next_look:
            states = _states(scene, run_ids)
            done = sum(1 for s, _, _ in states.values() if s in TERMINAL)
            steps = sum(step for _, step, _ in states.values())
            if (done, steps) != seen:
                seen, last_progress = (done, steps), now
            held = {r: v for r, v in held.items()
                    if r in states and states[r][2] <= v and states[r][0] not in TERMINAL}
            if progress is not None:
                progress("progress", {"terminal": done, "runs": len(run_ids),
                                      "kills": len(pool.deaths)})
            if done == len(run_ids) and not waiting:
                return {r: s for r, (s, _, _) in states.items()}, time.monotonic() - started
            next_look = now + 0.25
        time.sleep(0.05)
    return {r: s for r, (s, _, _) in _states(scene, run_ids).items()}, None


def _recovery_times(scene: Scene, pool: WorkerPool,
                    states: dict[str, str]) -> list[tuple[int, str, str]]:
    """Per (death, run held): (kill -> first event written in the run after it, run, how)."""
    out = []
    for death in pool.deaths:
        for run_id in death.runs:
            if run_id not in states:
                continue
            for entry in scene.client.events(run_id, start=f"{death.ts_ms}-0"):
                if entry.event is not None and entry.event.ts >= death.ts_ms:
                    out.append((entry.event.ts - death.ts_ms, run_id, death.how))
                    break
    return out


def run_chaos(cfg: ChaosConfig, *, redis_url: str | None = None, cluster: bool = False,
              progress: Progress | None = None) -> ChaosReport:
    report = ChaosReport(cfg, runs=cfg.runs,
                         redis="a 3-master Redis Cluster" if cluster else "one server")
    rng = random.Random(cfg.seed)
    t0 = time.monotonic()
    with Stack.up(redis_url, dedupe=False, fsync="everysec", cluster=cluster) as stack, \
            stack.scene("chaos") as scene:
        scene.world.set_faults(random={
            "p_fail": cfg.p_fail, "p_drop": cfg.p_drop, "p_slow": cfg.p_slow,
            "slow_s": 3.0, "slow_phase": "mixed", "seed": cfg.seed, "per_key": 1},
            latency_ms=list(cfg.latency_ms))
        pool = WorkerPool(lambda spec: scene.worker(kill_at=spec), cfg.workers,
                          scene.client.redis, scene.client.log.keys, rng,
                          cfg.fault_workers).start()
        recovery = scene.recovery()
        report.recovery_by = recovery.mode
        tag = f"{now_ms() % 1_000_000:06d}"
        run_ids = [f"chaos-{cfg.seed}-{tag}-{i}" for i in range(cfg.runs)]
        starts = [(run_id, {"source": rng.choice(SOURCES),
                            "recipient": f"user{rng.randint(1, 99)}@example.com"})
                  for run_id in run_ids]
        if progress is not None:
            progress("started", {"runs": cfg.runs, "recovery": report.recovery_by})
        try:
            states, report.all_terminal_s = _drive(scene, cfg, pool, starts, rng, progress)
        finally:
            pool.stop()
            recovery.stop()
        _report(report, scene, pool, run_ids, states)
    report.seconds = round(time.monotonic() - t0, 2)
    return report


def _report(report: ChaosReport, scene: Scene, pool: WorkerPool, run_ids: list[str],
            states: dict[str, str]) -> None:
    report.states = dict(Counter(states.values()))
    report.terminal = sum(1 for s in states.values() if s in TERMINAL)
    report.not_terminal = [r for r, s in states.items() if s not in TERMINAL]
    report.kills = len(pool.deaths)
    report.kills_by = dict(Counter("sigkill" if d.how == "sigkill" else "fault point"
                                   for d in pool.deaths))
    report.faults = {k: v for k, v in scene.world.injected().items()}
    apps = scene.world.applications()
    report.api_keys, report.db_keys = len(apps.api), len(apps.db)
    report.applications = apps.total
    report.duplicates = apps.duplicates
    for run_id in run_ids:
        if states.get(run_id) == "completed" and (
                apps.api.get(f"{run_id}:4") != 1 or apps.db.get(f"{run_id}:3") != 1):
            report.lost.append(run_id)
        check = verify(scene.client.log, run_id)
        if not check.ok:
            report.verify_failed[run_id] = {k: v for k, v in check.checks.items() if v != "ok"}
    times = sorted(_recovery_times(scene, pool, states), reverse=True)
    report.recovery_ms = [ms for ms, _, _ in times]
    report.slowest = [f"{run} {ms} ms ({how})" for ms, run, how in times[:3]]


def print_report(report: ChaosReport) -> None:
    from rich.console import Console
    from rich.table import Table

    rec = report.recovery()
    table = Table(title=f"chaos: {report.runs} runs, {report.config.workers} workers, seed "
                  f"{report.config.seed}, the log on {report.redis}", title_justify="left")
    table.add_column("figure")
    table.add_column("value", overflow="fold")
    rows: list[tuple[str, Any]] = [
        ("runs", report.runs),
        ("runs terminal (must be all)", f"{report.terminal} {report.states}"),
        ("workers killed", f"{report.kills} {report.kills_by}"),
        ("faults injected by the world", f"{sum(report.faults.values())} {report.faults}"),
        ("applications (api keys, db keys)",
         f"{report.applications} ({report.api_keys}, {report.db_keys})"),
        ("duplicates (must be 0)", len(report.duplicates)),
        ("completed runs missing an effect", len(report.lost)),
        ("verify failures", len(report.verify_failed)),
        ("recovery after a kill (ms)",
         f"p50 {rec['p50']}, p95 {rec['p95']}, max {rec['max']} over {rec['n']} runs held"),
        ("slowest recoveries", ", ".join(report.slowest) or "-"),
        ("recovery by", report.recovery_by),
        ("all terminal after (s)", report.all_terminal_s and round(report.all_terminal_s, 1)),
        ("wall time (s)", report.seconds),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    con = Console(width=150, highlight=False)
    con.print(table)
    con.print("[bold green]OK[/]" if report.ok else "[bold red]FAILED[/]: "
              + "; ".join(report.failures()))
