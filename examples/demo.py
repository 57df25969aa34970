"""``python -m examples demo``: the example agents through seven scenarios, on real processes.

It starts an embedded Redis server (``appendfsync always``) in a temporary directory, the
example's world (in its non-deduplicating mode: only the system prevents duplicates) and,
per scenario, real worker processes and the reconciler; then runs ``normal``, ``crash``,
``timeout``, ``cancel`` and ``replay`` (the ``pipeline`` agent) and ``approval`` (the
``announce`` agent, whose ``publish`` waits for an approver) and ``assistant`` (the LLM
tool-calling agent against the world's scripted model, killed mid-conversation). For each
it prints the log as a timeline, the effects table (log, ledger and world, per key), the
approval requests and decisions when there are any, and the recovery trajectory, then a
summary table. Exit status 0 only when all pass.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from examples.scenarios.outcome import Outcome
from examples.scenarios.render import console, render
from examples.scenarios.runner import NAMES, load, run_one
from examples.scenarios.stack import Stack


def _figure(out: Outcome) -> str:
    if "model requests" in out.figures:
        return (f"model calls {out.figures.get('model calls')}, requests "
                f"{out.figures['model requests']}, recovered in ms "
                f"{out.figures.get('recovered in ms', '-')}")
    for name in ("recovered in ms", "cancel latency ms", "reply held s", "checkpoints",
                 "approval wait ms"):
        if name in out.figures:
            return f"{name}: {out.figures[name]}"
    return f"events: {out.figures.get('events', len(out.timeline))}"


def summary_table(outcomes: list[Outcome], seconds: float) -> Table:
    ok = all(o.ok for o in outcomes)
    table = Table(title=f"summary: {sum(o.ok for o in outcomes)}/{len(outcomes)} scenarios "
                  f"passed in {seconds:.1f} s", title_justify="left")
    for col in ("scenario", "window", "final state", "api", "db", "duplicates", "verify",
                "figure", "s", "result"):
        table.add_column(col, overflow="fold")
    for o in outcomes:
        verify_ok = next((c.ok for c in o.checks if c.name.startswith("verify")), False)
        table.add_row(o.scenario, o.window, o.state or "-",
                      str(sum(o.applications.get("api", {}).values())),
                      str(sum(o.applications.get("db", {}).values())),
                      str(sum(1 for c in o.checks if c.name == "duplicates in the world"
                              and not c.ok)),
                      "ok" if verify_ok else "FAIL", _figure(o), f"{o.seconds:.1f}",
                      "[green]PASS[/]" if o.ok else "[red]FAIL[/]")
    table.caption = "every scenario passed" if ok else "some scenarios FAILED (see above)"
    return table


def run_demo(names: Sequence[str] | None = None, *, as_json: bool = False,
             redis_url: str | None = None, workdir: Path | None = None) -> int:
    """Run the scenarios; ``workdir`` keeps Redis's data, the world's files and the logs."""
    names = list(names or NAMES)
    for name in names:
        load(name)  # unknown names fail before anything starts
    started = time.monotonic()
    con: Console = console()
    outcomes: list[Outcome] = []
    if not as_json:
        con.rule("[bold]durable demo[/]: the example agents through crashes, timeouts, "
                 "cancels, replay and an approval")
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=con, disable=as_json) as progress:
        setup = progress.add_task("starting an embedded Redis and the world", total=1)
        if workdir is not None:
            workdir.mkdir(parents=True, exist_ok=True)
        with Stack.up(redis_url, dedupe=False, workdir=workdir) as stack:
            progress.update(setup, completed=1, description=(
                f"Redis at {stack.redis_url}, world at {stack.world.url} (deduplication OFF: "
                "only the system prevents duplicates)"))
            tasks = {n: progress.add_task(f"{n}: waiting", total=1) for n in names}
            for name in names:
                progress.update(tasks[name], description=f"{name}: {load(name).TITLE} ...")
                out = run_one(stack, name)
                outcomes.append(out)
                verdict = "[green]PASS[/]" if out.ok else "[red]FAIL[/]"
                progress.update(tasks[name], completed=1,
                                description=f"{name}: {out.title} {verdict}")
                if as_json:
                    continue
                render(con, out)
    seconds = time.monotonic() - started
    ok = all(o.ok for o in outcomes)
    if as_json:
        print(json.dumps({"ok": ok, "seconds": round(seconds, 2),
                          "scenarios": [o.to_json() for o in outcomes]}, default=str))
    else:
        con.print(summary_table(outcomes, seconds))
        if workdir is not None:
            con.print(f"logs of every process kept in {workdir}")
    return 0 if ok else 1
