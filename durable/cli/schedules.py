"""Schedules: ``durable schedule add|list|pause|resume|delete``.

``durable schedule add NAME --cron EXPR AGENT --input JSON`` checks the expression, the
agent and the input as a start does (a usage error writes nothing); the running
reconcilers then start one run per slot, ``NAME-<slot in s since the epoch>``. Expressions
are croniter's, in UTC, with an optional sixth field for seconds (``durable.controls.schedules``).
"""

from __future__ import annotations

import argparse

from durable.cli.output import OK, Add, client, json_arg, json_out, local_time, table
from durable.controls.schedules import POLICIES, Listed, Schedules


def schedules() -> Schedules:
    return client().schedules


def said(entry: Listed, what: str, args: argparse.Namespace) -> int:
    if args.json:
        json_out(entry.to_json())
    else:
        print(f"schedule {entry.name}: {what}")
    return OK


def next_slot(entry: Listed) -> str:
    if entry.schedule is None:
        return ""
    return "paused" if entry.next_ms is None else local_time(entry.next_ms)


def cmd_add(args: argparse.Namespace) -> int:
    data = json_arg(args.input, "--input") if args.input else {}
    entry = schedules().add(args.name, args.cron, args.agent, data, missed=args.missed,
                            grace_s=args.grace, by=args.by, tenant=args.tenant,
                            owner=args.owner, session=args.session)
    return said(entry, f"{args.agent} at {args.cron!r} (UTC), first run {next_slot(entry)}",
                args)


def cmd_list(args: argparse.Namespace) -> int:
    found = schedules().list()
    if args.json:
        for entry in found:
            json_out(entry.to_json())
        return OK
    rows = []
    for e in found:
        s = e.schedule
        rows.append((e.name, s and s.cron, s and s.agent, s and f"{s.missed}, {s.grace_s} s",
                     next_slot(e), e.error))
    table("schedules", ["name", "cron (UTC)", "agent", "missed, grace", "next", "error"], rows)
    return OK


def cmd_pause(args: argparse.Namespace) -> int:
    return said(schedules().pause(args.name), "paused", args)


def cmd_resume(args: argparse.Namespace) -> int:
    entry = schedules().resume(args.name)
    return said(entry, f"active, next run {next_slot(entry)}", args)


def cmd_delete(args: argparse.Namespace) -> int:
    schedules().delete(args.name)
    if args.json:
        json_out({"name": args.name, "deleted": True})
    else:
        print(f"schedule {args.name}: deleted (the runs it started are left as they are)")
    return OK


def register(add: Add) -> None:
    sp = add("schedule", None, "schedules that start a run per slot: add, list, pause, "
                               "resume, delete", js=False)
    verbs = sp.add_subparsers(dest="verb", required=True, parser_class=type(sp))

    def verb(name: str, fn: object, help: str, named: bool = True) -> argparse.ArgumentParser:
        p = verbs.add_parser(name, help=help, description=help)
        p.set_defaults(fn=fn)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        if named:
            p.add_argument("name", help="the schedule's name")
        return p

    p = verb("add", cmd_add, "add a schedule: one run of AGENT per slot of --cron")
    p.add_argument("agent", help="the agent each slot starts")
    p.add_argument("--cron", required=True, metavar="EXPR",
                   help="cron expression in UTC: 5 fields, or 6 with seconds last "
                        "('* * * * * */10': every 10 s)")
    p.add_argument("--input", default=None, help="the agent's input as JSON")
    p.add_argument("--missed", choices=POLICIES, default="latest",
                   help="slots missed while everything was down: 'latest' starts the most "
                        "recent one (default), 'skip' none")
    p.add_argument("--grace", type=int, default=60, metavar="SECONDS",
                   help="how late a slot may start and still be on time (default 60)")
    p.add_argument("--by", default="operator", help="who adds it (recorded)")
    p.add_argument("--tenant", default=None, help="the tenant of the runs it starts")
    p.add_argument("--owner", default=None, help="the owner of the runs it starts")
    p.add_argument("--session", default=None, metavar="NAME",
                   help="each run is the next turn of this named session (a slot whose "
                   "session is busy is refused)")
    verb("list", cmd_list, "the schedules, their next slot and last error", named=False)
    verb("pause", cmd_pause, "stop starting runs (slots while paused never run)")
    verb("resume", cmd_resume, "start runs again from the next slot")
    verb("delete", cmd_delete, "delete a schedule (its runs are left as they are)")
