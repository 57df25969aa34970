"""Item: 10,000 slow runs at once in every agent style, on 2 worker processes.

The load is ``bench.iobound``'s -- each run ``STEPS`` (3) calls of a tool that waits
``SLEEP_S`` (0.5 s), so the ideal wall time is 1.5 s whatever the number of runs -- with
``RUNS`` (10,000) runs on 2 worker processes of ``HELD`` (5,000) slots each, every run
queued first (one ``start_many`` while the workers are stopped; the clock starts when they
continue, as ``bench.iobound``'s backlog rows). One row per agent style
(``bench.style_agents``):

- ``async code``: an ``async def`` code agent awaiting an ``async def`` tool: each run a
  task on the worker's event loop, no thread of its own;
- ``sync code``: a plain code agent calling a plain tool: a thread per run's function,
  and the tool calls on the hub's threads (``DURABLE_USER_THREADS`` raised to ``HELD``,
  as a deployment of slow sync tools would);
- ``decide()``: the examples' ``count`` (a plain tool, the same threads), and
  ``count_async`` (the async tool, no thread per call);
- ``pydantic-ai agent``: an unchanged pydantic-ai ``Agent`` made durable
  (``bench.framework_agents``: 3 model requests of 0.5 s, a tool call between two), at
  ``FRAMEWORK_RUNS`` (1,000) runs, beside the same agent run plainly with
  ``asyncio.gather`` in this process, with the interpreter's collector and with the
  worker's (``DURABLE_GC_THRESHOLD``): what durability adds to the framework's own CPU;
- ``async code, 5,000 runs``: the same agent at 5,000 runs, beside DBOS at 5,000 runs
  (``bench.dbosrows``: its threads and its async workflows, on a local PostgreSQL).

First the floor of the run's CPU (``bench.cpufloor``, at ``RUNS`` runs): the program
without durability (``asyncio`` coroutines of the same sleeps) and the same runs' events
recorded in Redis, one Lua transition each, pipelined from one client; every row's CPU per
run (workers + Redis, the starts' included) is reported as a multiple of it. Beside it, not
part of it: the same program on threads, ``HELD`` at once (what the styles whose user code
is plain functions pay for their threads alone).

Also reported: the pydantic-ai row's CPU per run over the plain run's with the worker's
collector (the workers' alone, and with Redis's), and a 100-call conversation's cost per
call early and late in it, of pydantic-ai and of the OpenAI Agents SDK
(``bench.conversation``), beside each framework's own.

Reported per row: wall, wall / ideal, peak RSS and threads of each worker (at ``HELD``
runs held), starts, latency, and the problems the worker logs show; and the ratio of
DBOS's wall to ours at 5,000 runs. ``--quick``: 600 runs on 2 x 300 slots (200 of the
pydantic-ai agent), no DBOS.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from bench import conversation, cpufloor, dbosrows, framework_agents, iobound
from bench.common import AGENTS
from durable.settings import WorkerSettings

RUNS = 10_000
HELD = 5_000
DBOS_RUNS = 5_000
STYLE_AGENTS = f"{AGENTS},bench.style_agents"
#: The pydantic-ai row's workers load the framework too (the other rows' do not: 60 MB).
FRAMEWORK_AGENTS = f"{STYLE_AGENTS},bench.framework_agents"
ROOT = Path(__file__).resolve().parent.parent

#: Runs of the pydantic-ai rows (``bench.framework_agents``): the framework spends a few
#: milliseconds of CPU per model request of its own, so 10,000 runs would take minutes.
FRAMEWORK_RUNS = 1_000

#: What a worker sets Python's collector to (``DURABLE_GC_THRESHOLD``'s default).
GC_THRESHOLD = WorkerSettings.model_fields["gc_threshold"].default

#: (row, agent, whether its user code needs a thread per call in flight)
STYLES = (("async code", "async_count", False), ("sync code", "sync_count", True),
          ("decide(), sync tool", "count", True), ("decide(), async tool", "count_async",
                                                   False))


def _config(name: str, agent: str, held: int, threads: bool,
            agents: str = STYLE_AGENTS) -> iobound.Config:
    env: tuple[tuple[str, str], ...] = (("DURABLE_USER_THREADS", str(held)),) if threads else ()
    return iobound.Config(name, 2, held, pool=held + 100, agent=agent, agents=agents,
                          env=env, backlog=True)


def run(servers: Any, quick: bool = False, out_dir: Path | None = None,
        log: Any = print) -> dict[str, Any]:
    runs, held = (600, 300) if quick else (RUNS, HELD)
    log_dir = (out_dir or ROOT / "bench" / "results") / "styles-logs"
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    srv = servers.get("everysec")
    rows: dict[str, Any] = {}
    plan = [(_config(f"{name}, {runs:,} runs", agent, held, threads), runs)
            for name, agent, threads in STYLES]
    framework = 200 if quick else FRAMEWORK_RUNS
    plan.append((_config(f"pydantic-ai agent, {framework:,} runs", "pai_count",
                         min(held, framework // 2), False, FRAMEWORK_AGENTS), framework))
    if not quick:
        plan.append((_config(f"async code, {DBOS_RUNS:,} runs", "async_count", held, False),
                     DBOS_RUNS))
    r = srv.client()
    try:
        floor = cpufloor.measure(r, runs, log=log, held=held)
    finally:
        r.close()
    for i, (cfg, n) in enumerate(plan):
        r = srv.client()
        try:
            res = iobound.durable(srv.url, r, cfg, n, log_dir, tag=f"s{i}")
        finally:
            r.close()
        keep = ("runs", "completed", "wall_s", "ratio_to_ideal", "start_s", "rss_idle_mb",
                "worker_round_trips_per_step",
                "rss_peak_mb", "threads_peak", "latency_ms", "runs_per_worker", "cpu_s",
                "log_problems", "incomplete", "concurrency")
        rows[cfg.name] = {k: res[k] for k in keep if k in res}
        # The floor is of the styles' run (3 sleeps), not of the framework agent's.
        same = cfg.agent != "pai_count"
        rows[cfg.name].update(cpu_floor(res, n, floor["floor_cpu_per_run_us"] if same else 0))
        log(f"  styles {cfg.name:34s} wall {res['wall_s']:6.2f} s "
            f"({res['ratio_to_ideal']:.2f}x ideal), peak RSS "
            f"{'/'.join(f'{x:.0f}' for x in res['rss_peak_mb'])} MB, threads "
            f"{'/'.join(str(x) for x in res['threads_peak'])}, starts {res['start_s']:.2f} s, "
            f"{res['log_problems']['count']} log problems; CPU per run "
            f"{rows[cfg.name]['worker_cpu_per_run_us']:.0f} us (workers) + "
            f"{rows[cfg.name]['redis_cpu_per_run_us']:.0f} us (Redis)"
            + (f", {rows[cfg.name]['over_floor']:.1f}x the floor" if same else "")
            + "; the cores' bound "
            f"{rows[cfg.name]['cpu_floor_s']:.2f} s")
        if "incomplete" in res:
            log(f"  WARNING: {cfg.name}: {res['incomplete']}")
    for collector, threshold in (("", 0), (", the worker's collector", GC_THRESHOLD)):
        name = f"pydantic-ai agent, plain asyncio.gather{collector}, {framework:,} runs"
        rows[name] = framework_agents.plain(framework, threshold)
        log(f"  styles {name}: wall {rows[name]['wall_s']:.2f} s, CPU per run "
            f"{rows[name]['cpu_per_run_us']:.0f} us")
    out: dict[str, Any] = {"runs": runs, "held_per_worker": held, "steps": iobound.STEPS,
                           "sleep_s": iobound.SLEEP_S,
                           "ideal_s": iobound.STEPS * iobound.SLEEP_S, "floor": floor,
                           "configs": rows}
    out["pydantic_ai_cpu"] = cpu_over_plain(rows[f"pydantic-ai agent, {framework:,} runs"],
                                            rows[name])
    log(f"  styles pydantic-ai CPU durable / plain (the worker's collector): "
        f"{out['pydantic_ai_cpu']['worker_over_plain']:.2f}x (workers), "
        f"{out['pydantic_ai_cpu']['with_redis_over_plain']:.2f}x (workers + Redis)")
    r = srv.client()
    try:
        out["conversation"] = {
            "durable": conversation.durable_calls(srv.url, r, FRAMEWORK_AGENTS,
                                                  log_dir=log_dir),
            "plain": conversation.plain_calls(gc_threshold=GC_THRESHOLD)}
        out["conversation_openai"] = {
            "durable": conversation.durable_calls(srv.url, r, "examples.agents,bench.openai_talk",
                                                  log_dir=log_dir, agent="oai_talk"),
            "plain": conversation.plain_openai_calls(gc_threshold=GC_THRESHOLD)}
    finally:
        r.close()
    for key, who in (("conversation", "pydantic-ai"), ("conversation_openai",
                                                       "OpenAI Agents SDK")):
        talk = out[key]
        log(f"  styles {framework_agents.TALK_CALLS}-call {who} conversation, ms per "
            f"call early / late: durable {talk['durable']['early_ms']:.1f} / "
            f"{talk['durable']['late_ms']:.1f} ({talk['durable']['late_over_early']:.2f}x), "
            f"worker CPU {talk['durable']['cpu_early_ms']:.2f} / "
            f"{talk['durable']['cpu_late_ms']:.2f}, plain CPU {talk['plain']['early_ms']:.2f} / "
            f"{talk['plain']['late_ms']:.2f} ({talk['plain']['late_over_early']:.2f}x)")
    if not quick:
        dbos = dbosrows.dbos(DBOS_RUNS, 1, log, steps=iobound.STEPS,
                             sleep_s=iobound.SLEEP_S)
        out["configs"].update({f"{name}, {DBOS_RUNS:,} runs": row
                               for name, row in dbos.items()})
        ours = rows[f"async code, {DBOS_RUNS:,} runs"]["wall_s"]
        out["dbos_over_ours_at_5000"] = {
            name: round(row["wall_s"] / ours, 2) for name, row in dbos.items()
            if "wall_s" in row}
        log(f"  styles DBOS wall / ours at {DBOS_RUNS:,} runs: {out['dbos_over_ours_at_5000']}")
    return out


def cpu_over_plain(durable: dict[str, Any], plain: dict[str, Any]) -> dict[str, float]:
    """A durable pydantic-ai run's CPU over the same agent's run plainly (with the worker's
    collector): the workers' alone, and with Redis's."""
    worker, redis_us = durable["worker_cpu_per_run_us"], durable["redis_cpu_per_run_us"]
    base = plain["cpu_per_run_us"]
    return {"worker_over_plain": worker / base, "with_redis_over_plain": (worker + redis_us)
            / base}


def cpu_floor(res: dict[str, Any], runs: int, floor_us: float) -> dict[str, float]:
    """The CPU the workers and Redis spent per run (Redis's with the runs' starts), its
    ratio to ``floor_us`` (``bench.cpufloor``: the program and its events' record alone),
    and what the machine's cores bound the row's wall to: those seconds on ``iobound.CPUS``
    cores, every core busy. A row whose wall is near that bound is CPU-bound: only less CPU
    per run (or more cores) makes it faster; one far above it waits on something else."""
    cpu = res["cpu_s"]
    workers, redis_s = sum(cpu["workers"]), cpu["redis"] + cpu.get("redis start", 0.0)
    bound = (workers + cpu["redis"]) / iobound.CPUS
    per_run = 1e6 * (workers + redis_s) / runs
    return {"worker_cpu_per_run_us": 1e6 * workers / runs,
            "redis_cpu_per_run_us": 1e6 * redis_s / runs,
            "redis_start_cpu_per_run_us": 1e6 * cpu.get("redis start", 0.0) / runs,
            "producer_start_cpu_per_run_us": 1e6 * cpu.get("producer start", 0.0) / runs,
            **({"over_floor": per_run / floor_us} if floor_us else {}),
            "cpu_floor_s": bound, "wall_over_cpu_floor": res["wall_s"] / bound if bound else 0.0}


def _floor_rows(fl: dict[str, Any]) -> list[str]:
    """The floor's rows of the table (``bench.cpufloor``), per run."""
    prog, client = fl["program_cpu_per_run_us"], fl["record_client_cpu_per_run_us"]
    red, total = fl["record_redis_cpu_per_run_us"], fl["floor_cpu_per_run_us"]
    blank = " | | | | |"
    return [f"| floor: the program, not durable ({fl['runs']:,} `asyncio` coroutines, "
            f"{iobound.STEPS} sleeps each) | | | {prog / 1000:.2f} ms | |{blank}",
            f"| floor: its events recorded, one Lua transition each "
            f"({fl['script_calls_per_run']:.0f} per run, pipelined from one client) | | | "
            f"{client / 1000:.2f} + {red / 1000:.2f} ms (client + Redis) | |{blank}",
            f"| **floor, together** | | | **{total / 1000:.2f} ms** | 1x |{blank}"] + (
        [f"| beside it: the program on threads ({fl['held']:,} at once: what sync code and "
         f"`decide()` with a plain tool pay for threads alone) | | | "
         f"{fl['threads_cpu_per_run_us'] / 1000:.2f} ms | |{blank}"]
        if "threads_cpu_per_run_us" in fl else [])


def report(st: dict[str, Any]) -> list[str]:
    """The item's section of ``results.md``."""
    out = [f"## Every agent style at once ({st['runs']:,} runs x {st['steps']} steps of "
           f"{st['sleep_s']} s on 2 workers x {st['held_per_worker']:,} slots: ideal "
           f"{st['ideal_s']} s)\n",
           "| configuration | wall s | x ideal | CPU per run (workers + Redis) | x floor | "
           "bound by the cores s | starts s | peak RSS per worker MB | threads per worker | "
           "log problems |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    if "floor" in st:
        out += _floor_rows(st["floor"])
    for name, c in st["configs"].items():
        if "unavailable" in c:
            out.append(f"| {name} | not available: {c['unavailable']} | | | | | | | | |")
        elif "rss_peak_mb" in c and "log_problems" in c:
            bad = f" ({c['incomplete']})" if c.get("incomplete") else ""
            over = f"{c['over_floor']:.1f}x" if "over_floor" in c else ""
            floor = (f"{c['worker_cpu_per_run_us'] / 1000:.2f} + "
                     f"{c['redis_cpu_per_run_us'] / 1000:.2f} ms | {over} | "
                     f"{c['cpu_floor_s']:.2f} | " if "cpu_floor_s" in c else " | | | ")
            out.append(f"| {name}{bad} | {c['wall_s']:.2f} | {c['ratio_to_ideal']:.2f} | "
                       f"{floor}{c['start_s']:.2f} | "
                       f"{' / '.join(f'{x:.0f}' for x in c['rss_peak_mb'])} | "
                       f"{' / '.join(str(x) for x in c['threads_peak'])} | "
                       f"{c['log_problems']['count']} |")
        elif "cpu_per_run_us" in c:  # the framework's own run, in one process
            out.append(f"| {name} | {c['wall_s']:.2f} | {c['ratio_to_ideal']:.2f} | "
                       f"{c['cpu_per_run_us'] / 1000:.2f} ms (one process) | | | | | | |")
        else:  # DBOS
            out.append(f"| {name} | {c['wall_s']:.2f} | {c['ratio_to_ideal']:.2f} | | | | "
                       f"{c.get('start_s', float('nan')):.2f} | "
                       f"{c.get('rss_peak_mb', float('nan')):.0f} | "
                       f"{c.get('threads_peak', '?')} | |")
    out.append("\nThe floor (`bench/cpufloor.py`, measured in the same run, medians of 3): "
               "the program without durability, and the same runs' events recorded in Redis "
               "and nothing else. A row's Redis CPU includes its runs' starts. The bound "
               "by the cores is the row's worker and Redis CPU over the machine's "
               f"{iobound.CPUS} cores: no wall can be shorter; the ideal is reachable only "
               "where that bound is below it.\n")
    if "pydantic_ai_cpu" in st:
        c = st["pydantic_ai_cpu"]
        out.append(f"\nA durable pydantic-ai run's CPU over the same agent run plainly with "
                   f"the worker's collector: {c['worker_over_plain']:.2f}x (the workers'), "
                   f"{c['with_redis_over_plain']:.2f}x (the workers' and Redis's).\n")
    if "conversation" in st:
        out += conversation.report(st["conversation"])
    if "conversation_openai" in st:
        out += conversation.report(st["conversation_openai"], "OpenAI Agents SDK")
    if "dbos_over_ours_at_5000" in st:
        out.append("\nDBOS's wall over ours (async code) at 5,000 runs: " + ", ".join(
            f"{k}: {v}x" for k, v in st["dbos_over_ours_at_5000"].items()) + ".\n")
    return out
