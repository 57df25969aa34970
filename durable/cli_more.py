"""More ``durable`` subcommands: recovery, audit and operations.

Kept apart from ``cli.py`` so each module stays small; ``cli.build_parser`` calls
``extend`` with its ``add`` helper.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from durable.settings import Settings

Add = Callable[..., Any]


def _client() -> Any:
    from durable.client import Client

    return Client(Settings())


def _reconciler(client: Any) -> Any:
    from durable.reconcile import Reconciler

    return Reconciler(client.settings, client.redis, client.registry)


def cmd_reconciler(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    client = _client()
    rec = _reconciler(client)
    if args.once:
        report = rec.tick()
        print(msgspec.json.encode({"examined": report.examined, "actions": report.actions})
              .decode())
        return 0
    rec.run_forever(args.interval or client.settings.reconcile_interval_s, threading.Event())
    return 0


def cmd_reconcile(args: argparse.Namespace) -> int:
    client = _client()
    client.projection(args.run)
    done = _reconciler(client).reconcile(args.run)
    state = client.status(args.run)
    if args.json:
        print(msgspec.json.encode({"run_id": args.run, "done": done, "state": state.state})
              .decode())
    else:
        print(f"{args.run}: {done}; state {state.state}")
    return 0


def cmd_fork(args: argparse.Namespace) -> int:
    from durable.replay import fork

    client = _client()
    client.projection(args.run)
    new_id = args.new_run_id or f"{args.run[:100]}-fork-{uuid.uuid4().hex[:6]}"
    handle = fork(client.log, args.run, args.at, new_id)
    client.enqueue(new_id)
    if args.json:
        print(msgspec.json.encode({"run_id": new_id, "parent": args.run, "at": args.at,
                                   "state": handle.state.state}).decode())
    else:
        print(new_id)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from durable.export import export_lines

    client = _client()
    client.projection(args.run)
    out = open(args.output, "w") if args.output else sys.stdout
    try:
        for line in export_lines(client.log, args.run):
            out.write(line + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def cmd_quarantine_release(args: argparse.Namespace) -> int:
    from durable.quarantine import release

    client = _client()
    client.projection(args.run)
    state = release(client, args.run, by=args.by)
    print(f"{args.run}: {state}")
    return 0 if state != "quarantined" else 1


def cmd_repair_index(args: argparse.Namespace) -> int:
    from durable.index import repair

    n = repair(_client())
    print(f"reindexed {n} runs")
    return 0


def cmd_respond(args: argparse.Namespace) -> int:
    import json

    from durable.errors import UsageError

    try:
        data = json.loads(args.input)
    except ValueError as exc:
        raise UsageError(f"--input is not valid JSON: {exc}") from None
    client = _client()
    client.projection(args.run)
    if args.external:
        state = client.external_event(args.run, data, request=args.request)
    else:
        state = client.respond(args.run, data, request=args.request)
    print(msgspec.json.encode({"run_id": args.run, "state": state.state}).decode())
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    client = _client()
    client.projection(args.run)
    state = client.approve(args.run, args.request, args.decision, args.approver, args.note)
    print(msgspec.json.encode({"run_id": args.run, "state": state.state}).decode())
    return 0


def extend(add: Add) -> None:
    sp = add("respond", cmd_respond, "answer a run waiting for input (or an external event)",
             run=True)
    sp.add_argument("--input", required=True, help="the response as JSON")
    sp.add_argument("--request", default=None, help="only if the run waits for this request")
    sp.add_argument("--external", action="store_true", help="deliver an external event")
    sp = add("approve", cmd_approve, "approve or reject an action waiting for approval",
             run=True)
    sp.add_argument("--request", required=True)
    sp.add_argument("--decision", required=True, choices=["approve", "reject"])
    sp.add_argument("--approver", required=True)
    sp.add_argument("--note", default="")
    sp = add("reconciler", cmd_reconciler, "run the reconciler process", js=False)
    sp.add_argument("--once", action="store_true", help="one pass over what is due, then exit")
    sp.add_argument("--interval", type=float, default=None, help="seconds between passes")
    add("reconcile", cmd_reconcile, "reconcile one run now", run=True)
    sp = add("fork", cmd_fork, "start a new run whose history is a prefix of this one", run=True)
    sp.add_argument("--at", required=True, help="last entry id of the inherited prefix")
    sp.add_argument("--new-run-id", default=None)
    sp = add("export", cmd_export, "write a run's evidence as JSON lines", run=True, js=False)
    sp.add_argument("--output", "-o", default=None)
    sp = add("quarantine", cmd_quarantine_release,
             "quarantine release RUN: retry a quarantined run (after an upgrade)", js=False)
    sp.add_argument("verb", choices=["release"])
    sp.add_argument("run")
    sp.add_argument("--by", default="operator")
    add("repair-index", cmd_repair_index, "rebuild the global indexes from the run logs",
        js=False)
