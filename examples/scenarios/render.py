"""Showing a scenario's outcome in the terminal: the log as a timeline, the effects table,
the approval requests and decisions (when there are any), the recovery trajectory with its
summary, the figures and the checks."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from examples.scenarios.outcome import Outcome


def console() -> Console:
    return Console(width=150, highlight=False)


def actor(name: str | None) -> str:
    """``host:pid:tag`` -> ``worker pid``; ``reconciler:tag`` -> ``reconciler``."""
    if not name:
        return ""
    parts = name.split(":")
    if parts[0] == "reconciler":
        return "reconciler"
    if len(parts) == 3 and parts[1].isdigit():
        return f"worker {parts[1]}"
    return name


def _table(title: str, columns: list[str]) -> Table:
    table = Table(title=title, title_justify="left", show_lines=False, pad_edge=False)
    for col in columns:
        table.add_column(col, overflow="fold")
    return table


def timeline(rows: list[dict[str, Any]], title: str = "log (timeline)") -> Table:
    t0 = next((r["ts"] for r in rows if r.get("ts")), 0)
    table = _table(title, ["seq", "+ms", "actor", "event", "what"])
    for r in rows:
        table.add_row(str(r.get("seq", "")), str(r["ts"] - t0) if r.get("ts") else "",
                      actor(r.get("actor")), r["type"], str(r["what"]))
    return table


def effects(rows: list[dict[str, Any]]) -> Table:
    table = _table("effects (log, ledger, world)", ["step", "tool", "key", "dispatches",
                                                     "log outcome", "ledger", "world",
                                                     "applied"])
    for r in rows:
        table.add_row(str(r["step"]), r["tool"], r["key"], str(r["dispatches"]), r["log"],
                      r["ledger"], r["system"], str(r["applied"]))
    return table


def approvals(rows: list[dict[str, Any]]) -> Table:
    table = _table("approval requests (log)", ["request", "step", "role", "digest",
                                               "evidence", "expires in s", "decision",
                                               "by"])
    for r in rows:
        table.add_row(r["request"], str(r["step"]), r["role"], r["digest"],
                      "\n".join(r["evidence"]), str(r["expires in s"]),
                      r["decision"] or "-", r["approver"] or "-")
    return table


def decisions(rows: list[dict[str, Any]]) -> Table:
    table = _table("decisions tried", ["approver", "roles", "decision", "answer",
                                       "log version", "events written"])
    for r in rows:
        table.add_row(r["approver"], ", ".join(r["roles"]) or "none", r["decision"],
                      r["answer"], f"{r['version before']} -> {r['version after']}",
                      str(r["events written"]))
    return table


def checks(out: Outcome) -> Table:
    table = _table("checks", ["", "check", "expected", "actual"])
    for c in out.checks:
        table.add_row("[green]ok[/]" if c.ok else "[red]FAIL[/]", c.name, _short(c.expected),
                      _short(c.actual))
    return table


def _short(value: Any, limit: int = 70) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render(con: Console, out: Outcome) -> None:
    verdict = "[bold green]PASS[/]" if out.ok else "[bold red]FAIL[/]"
    con.rule(f"[bold]{out.scenario}[/]: {out.title}  {verdict}  ({out.seconds:.1f} s)")
    con.print(f"window: {out.window}    run: {out.run_id or '-'}    final state: "
              f"[bold]{out.state or '-'}[/]")
    if out.timeline:
        con.print(timeline(out.timeline))
    if out.effects:
        con.print(effects(out.effects))
    if out.approvals:
        con.print(approvals(out.approvals))
    if out.decisions:
        con.print(decisions(out.decisions))
    if out.recovery:
        con.print(timeline(out.recovery, "recovery trajectory (replay from where it began)"))
    elif out.timeline:
        con.print("recovery trajectory: none (nothing was interrupted)")
    if out.summary:
        con.print("summary: " + "; ".join(f"{k}: {v}" for k, v in out.summary.items()))
    if out.applications:
        con.print("world applications per key: " + "; ".join(
            f"{system} {counts}" for system, counts in out.applications.items()))
    if out.figures:
        con.print("figures: " + "; ".join(f"{k}: {v}" for k, v in out.figures.items()))
    if out.checks:
        con.print(checks(out))
    for failure in out.failures():
        con.print(f"[bold red]FAILED[/] {failure}")
