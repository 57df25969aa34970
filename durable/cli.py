"""``durable``: the command line. Tables for people, ``--json`` for scripts.

Exit codes: 0 ok, 1 a check failed or the run was not found, 2 a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import msgspec

from durable.errors import DurableError, RunNotFound, UsageError
from durable.settings import Settings

OK, CHECK_FAILED, USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse exits 2 on usage errors, as we want
        self.print_usage(sys.stderr)
        self.exit(USAGE, f"durable: error: {message}\n")


def _json_out(obj: Any) -> None:
    sys.stdout.write(msgspec.json.encode(obj).decode() + "\n")


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*["" if v is None else str(v) for v in row])
    Console(width=160).print(table)


def _client(args: argparse.Namespace) -> Any:
    from durable.client import Client

    return Client(Settings())


def cmd_redis(args: argparse.Namespace) -> int:
    from durable.embedded import run_foreground, stop

    settings = Settings()
    if args.stop:
        stopped = stop(settings.data_dir)
        print(f"stopped the server of {settings.data_dir}" if stopped
              else f"no server runs for {settings.data_dir}")
        return OK if stopped else CHECK_FAILED
    return run_foreground(settings, args.port)


def cmd_start(args: argparse.Namespace) -> int:
    try:
        data = json.loads(args.input) if args.input else {}
    except ValueError as exc:
        raise UsageError(f"--input is not valid JSON: {exc}") from None
    started = _client(args).start(args.agent, data, run_id=args.run_id)
    if args.json:
        _json_out({"run_id": started.run_id, "created": started.created, "state": started.state})
    else:
        print(started.run_id)
    return OK


def cmd_status(args: argparse.Namespace) -> int:
    from durable.replay import summary

    client = _client(args)
    client.projection(args.run)
    state = client.status(args.run)
    if args.json:
        _json_out({"run_id": args.run, **msgspec.to_builtins(state), **summary(state)})
        return OK
    info = summary(state)
    rows = [("run", args.run), ("agent", f"{state.agent} v{state.agent_version}"),
            *[(k, v) for k, v in info.items()]]
    if state.cancel:
        rows.append(("cancel", f"{state.cancel.scope}: {state.cancel.reason}"))
    if state.wait:
        rows.append(("wait", f"{state.wait.kind} until {state.wait.until}: {state.wait.reason}"))
    for appr in state.approvals.values():
        if appr.decision is None:
            rows.append(("approval", f"request {appr.request} ({appr.kind}, step {appr.step}) "
                                     f"role {appr.role}, expires {appr.expires}"))
    _table(f"run {args.run}", ["field", "value"], rows)
    return OK


def cmd_runs(args: argparse.Namespace) -> int:
    runs = _client(args).runs(args.state, args.limit)
    if args.json:
        for r in runs:
            _json_out(r.__dict__)
        return OK
    _table("runs", ["run", "state", "agent", "step", "version", "updated", "reason"],
           [(r.run_id, r.state, r.agent, r.step, r.version, r.updated, r.reason) for r in runs])
    return OK


def cmd_log(args: argparse.Namespace) -> int:
    from durable.replay import trajectory

    entries = _client(args).events(args.run, args.start, args.end)
    if args.json:
        from durable.events import to_builtins

        for e in entries:
            if e.event is None:
                _json_out({"id": e.id, "type": "undecodable", "error": e.error})
            else:
                _json_out({"id": e.id, **to_builtins(e.event)})
        return OK
    rows = trajectory(entries)
    _table(f"log of {args.run}", ["id", "seq", "type", "actor", "what"],
           [(r["id"], r["seq"], r["type"], r.get("actor"), r["what"]) for r in rows])
    return OK


def cmd_replay(args: argparse.Namespace) -> int:
    from durable.replay import replay, summary

    client = _client(args)
    client.projection(args.run)
    result = replay(client.log, args.run, args.start, args.end)
    info = summary(result.state)
    if args.json:
        _json_out({"run_id": args.run, "from_checkpoint": result.started_from,
                   "state": msgspec.to_builtins(result.state), "summary": info,
                   "trajectory": result.rows})
        return OK
    _table(f"trajectory of {args.run} from {args.start} to {args.end}",
           ["id", "seq", "type", "what"],
           [(r["id"], r["seq"], r["type"], r["what"]) for r in result.rows])
    _table("folded state" + (f" (from checkpoint {result.started_from})"
                             if result.started_from else ""),
           ["", ""], [(k, v) for k, v in info.items()])
    return OK


def cmd_verify(args: argparse.Namespace) -> int:
    from durable.verify import verify

    client = _client(args)
    client.projection(args.run)
    report = verify(client.log, args.run)
    if args.json:
        _json_out({"run_id": args.run, "ok": report.ok, "events": report.events,
                   "checks": report.checks})
    else:
        _table(f"verify {args.run}: {'OK' if report.ok else 'FAILED'} ({report.events} events)",
               ["check", "result"], list(report.checks.items()))
    return OK if report.ok else CHECK_FAILED


def cmd_cancel(args: argparse.Namespace) -> int:
    state = _client(args).cancel(args.run, args.reason, args.scope)
    if args.json:
        _json_out({"run_id": args.run, "state": state.state})
    else:
        print(f"{args.run}: {state.state}")
    return OK


def cmd_worker(args: argparse.Namespace) -> int:
    from durable.worker_runtime import run_worker

    return run_worker(Settings(), burst=args.burst, queue_name=args.queue)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="durable", description="Durable agent runs on Redis.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def add(name: str, fn: Any, help: str, run: bool = False, js: bool = True) -> Any:
        sp = sub.add_parser(name, help=help, description=help)
        sp.set_defaults(fn=fn)
        if run:
            sp.add_argument("run", help="run id")
        if js:
            sp.add_argument("--json", action="store_true", help="machine-readable output")
        return sp

    sp = add("redis", cmd_redis, "run the embedded Redis server in the foreground", js=False)
    sp.add_argument("--port", type=int, default=0)
    sp.add_argument("--stop", action="store_true", help="stop the server of the data dir")
    sp = add("start", cmd_start, "start a run; prints its id")
    sp.add_argument("agent")
    sp.add_argument("--input", default=None, help="the agent's input as JSON")
    sp.add_argument("--run-id", default=None, help="idempotent: an existing id returns that run")
    add("status", cmd_status, "a run's folded state", run=True)
    sp = add("runs", cmd_runs, "list runs, newest first")
    sp.add_argument("--state", default=None)
    sp.add_argument("--limit", type=int, default=100)
    for name, fn, helptext in (("log", cmd_log, "a run's log entries"),
                               ("replay", cmd_replay, "state and trajectory from an offset")):
        sp = add(name, fn, helptext, run=True)
        sp.add_argument("--from", dest="start", default="-", help="first entry id")
        sp.add_argument("--to", dest="end", default="+", help="last entry id")
    add("verify", cmd_verify, "check a run's invariants (exit 1 if any fails)", run=True)
    sp = add("cancel", cmd_cancel, "request cancellation of a run", run=True)
    sp.add_argument("--reason", default="operator request")
    sp.add_argument("--scope", choices=["run", "call"], default="run")
    sp = add("worker", cmd_worker, "run a worker (RQ) process", js=False)
    sp.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    sp.add_argument("--queue", default=None)
    from durable import cli_more, cli_world

    cli_more.extend(add)
    cli_world.extend(add)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.fn(args)
        return code
    except RunNotFound as exc:
        print(f"durable: {exc}", file=sys.stderr)
        return CHECK_FAILED
    except UsageError as exc:
        print(f"durable: {exc}", file=sys.stderr)
        return USAGE
    except DurableError as exc:
        print(f"durable: {exc}", file=sys.stderr)
        return CHECK_FAILED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
