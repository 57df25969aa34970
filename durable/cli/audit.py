"""Reading the evidence: log, replay, verify (a run, an archive file), seal, export, and fork
from an offset."""

from __future__ import annotations

import argparse
import gzip
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import msgspec

from durable.audit import whatif
from durable.audit.archives import verify_archive
from durable.audit.diff import diff
from durable.audit.forks import fork, parse_sets
from durable.audit.replay import replay, summary, trajectory
from durable.audit.seals import seal_run
from durable.audit.verify import Report, verify
from durable.cli.output import CHECK_FAILED, OK, Add, client, json_out, table
from durable.errors import UsageError
from durable.log import events as ev
from durable.log.context import removed
from durable.log.events import to_builtins
from durable.log.export import export_lines
from durable.log.store import Entry
from durable.security.sealing import Keyring, shown, shown_struct
from durable.security.signing import read_key_file
from durable.streams.streaming import Partial


def cmd_log(args: argparse.Namespace) -> int:
    if args.follow:
        return _follow(args)
    c = client()
    entries = [shown_entry(e, c.log.keyring) for e in c.events(args.run, args.start, args.end)]
    rows = trajectory(entries, removed(c.events(args.run)) if (args.start, args.end) != (
        "-", "+") else None)
    if args.json:
        for e, row in zip(entries, rows, strict=True):
            if e.event is None:
                json_out({"id": e.id, "type": "undecodable", "error": e.error})
            else:  # a value removed by context retention says so, and when
                json_out({"id": e.id, **to_builtins(e.event), "what": row["what"],
                          **({"removed": row["removed"]} if "removed" in row else {})})
        return OK
    table(f"log of {args.run}", ["id", "seq", "type", "actor", "what"],
          [(r["id"], r["seq"], r["type"], r.get("actor"), r["what"]) for r in rows])
    return OK


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class _Text:
    """Partial text printed as a stream: one line per step's dispatch, written as it comes,
    ended when anything else is printed."""

    def __init__(self) -> None:
        self.open: tuple[int, int] | None = None

    def write(self, item: Partial) -> None:
        if self.open != (item.step, item.attempt):
            self.end()
            again = f" (attempt {item.attempt})" if item.attempt > 1 else ""
            sys.stdout.write(f"  step {item.step}{again} partial: ")
            self.open = (item.step, item.attempt)
        sys.stdout.write(_CONTROL.sub("", item.data))  # no terminal escapes from a model

    def end(self) -> None:
        if self.open is not None:
            sys.stdout.write("\n")
            self.open = None


def _follow(args: argparse.Namespace) -> int:
    """``durable log RUN --follow``: each event as it comes, one line each, and partial text
    as a stream, until the run is terminal (or quarantined: exit 1)."""
    if args.end != "+":
        raise UsageError("--to cannot be combined with --follow")
    c = client()
    text = _Text()
    with c.follow(args.run, from_id=_before(args.start)) as items:
        for item in items:
            if not isinstance(item, Partial):
                item = shown_entry(item, c.log.keyring)
            if isinstance(item, Partial):
                if args.json:
                    json_out({"type": "partial", "run": item.run, "step": item.step,
                              "attempt": item.attempt, "seq": item.seq, "data": item.data})
                elif isinstance(item.data, str):
                    text.write(item)
                else:
                    text.end()
                    print(f"  step {item.step} partial {item.seq}: "
                          f"{msgspec.json.encode(item.data).decode()[:300]}")
                sys.stdout.flush()
                continue
            text.end()
            if args.json:
                json_out({"id": item.id, "type": "undecodable", "error": item.error}
                         if item.event is None else {"id": item.id, **to_builtins(item.event)})
            else:
                row = trajectory([item])[0]
                print(f"{row['id']}  {row['seq'] or '-':>4}  {row['type']:<20} "
                      f"{row.get('actor') or '':<24} {row['what']}")
            sys.stdout.flush()
            if isinstance(item, Entry) and isinstance(item.event, ev.Quarantined) \
                    and c.status(args.run).state == "quarantined":
                # Nothing more comes until an operator releases it: stop, and say so.
                print(f"durable: {args.run} is quarantined ({item.event.reason}): nothing "
                      f"more happens until `durable quarantine release {args.run}`",
                      file=sys.stderr)
                return CHECK_FAILED
    return OK


def shown_entry(entry: Entry, keyring: Keyring) -> Entry:
    """The entry for display: sealed fields opened if this caller holds their key, else
    ``***``."""
    if entry.event is None:
        return entry
    return Entry(entry.id, shown_struct(entry.event, keyring), entry.error)


def _before(entry_id: str) -> str:
    """The stream id just before ``entry_id`` (``--from`` is inclusive, following reads
    the entries after an id)."""
    if entry_id in ("-", "0", "0-0", ""):
        return "0"
    ms, _, seq = entry_id.partition("-")
    try:
        if seq and int(seq) > 0:
            return f"{int(ms)}-{int(seq) - 1}"
        return f"{int(ms) - 1}-18446744073709551615" if int(ms) > 0 else "0"
    except ValueError:
        raise UsageError(f"--from {entry_id!r} is not a stream entry id") from None


def cmd_replay(args: argparse.Namespace) -> int:
    c = client()
    c.projection(args.run)
    result = replay(c.log, args.run, args.start, args.end)
    result.state = shown_struct(result.state, c.log.keyring)
    result.rows = trajectory([shown_entry(e, c.log.keyring) for e in result.entries])
    info = summary(result.state)
    if args.json:
        json_out({"run_id": args.run, "from_checkpoint": result.started_from,
                  "state": msgspec.to_builtins(result.state), "summary": info,
                  "trajectory": result.rows})
        return OK
    table(f"trajectory of {args.run} from {args.start} to {args.end}",
          ["id", "seq", "type", "what"],
          [(r["id"], r["seq"], r["type"], r["what"]) for r in result.rows])
    table("folded state" + (f" (from checkpoint {result.started_from})"
                            if result.started_from else ""),
          ["", ""], [(k, v) for k, v in info.items()])
    return OK


def cmd_verify(args: argparse.Namespace) -> int:
    c = client()
    c.projection(args.run)
    report = verify(c.log, args.run, settle_role=c.settings.security.settle_role,
                    require_seal=args.require_seal)
    _report(report, args.json)
    return OK if report.ok else CHECK_FAILED


def _report(report: Report, as_json: bool) -> None:
    if as_json:
        json_out({"run_id": report.run_id, "ok": report.ok, "events": report.events,
                  "checks": report.checks, "failed": report.failed,
                  "bad_entry": report.bad_entry})
    else:
        verdict = "OK" if report.ok else "FAILED" + (
            f" from entry {report.bad_entry}" if report.bad_entry else "")
        table(f"verify {report.run_id}: {verdict} ({report.events} events)",
              ["check", "result"], list(report.checks.items()))


def cmd_seal(args: argparse.Namespace) -> int:
    c = client()
    seal = seal_run(c.log, c.approvers, args.run, args.signer, read_key_file(args.key))
    if args.json:
        json_out({"run_id": args.run, "by": seal.by, "key": seal.key, "entry": seal.entry})
    else:
        print(f"sealed {args.run} at entry {seal.entry} by {seal.by} ({seal.key})")
    return OK


def cmd_verify_archive(args: argparse.Namespace) -> int:
    c = client()
    report = verify_archive(Path(args.file), c.approvers, require_seal=args.require_seal)
    _report(report, args.json)
    return OK if report.ok else CHECK_FAILED


def cmd_export(args: argparse.Namespace) -> int:
    c = client()
    c.projection(args.run)
    lines = export_lines(c.log, args.run, keep_sealed=args.saved, with_blobs=args.saved,
                         with_chain=args.saved)
    if args.output and args.output.endswith(".gz"):
        with gzip.open(args.output, "wt") as packed:
            for line in lines:
                packed.write(line + "\n")
        return OK
    out = open(args.output, "w") if args.output else sys.stdout
    try:
        for line in lines:
            out.write(line + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return OK


def cmd_fork(args: argparse.Namespace) -> int:
    if args.where is not None:
        return _fork_where(args)
    if args.run is None:
        raise UsageError("fork: name the run (or give --where for many)")
    c = client()
    c.projection(args.run)
    new_id = args.new_run_id or f"{args.run[:100]}-fork-{uuid.uuid4().hex[:6]}"
    handle = fork(c.log, args.run, args.at, new_id, overrides=parse_sets(args.set),
                  hold_effects=args.hold_effects, reuse_replies=args.reuse_replies)
    c.enqueue(new_id)
    if args.json:
        json_out({"run_id": new_id, "parent": args.run, "at": args.at,
                  "state": handle.state.state, "overrides": handle.state.overrides,
                  "hold_effects": handle.state.hold_effects})
    else:
        print(new_id)
    return OK


def cmd_diff(args: argparse.Namespace) -> int:
    c = client()
    c.projection(args.run)
    c.projection(args.other)
    found = diff(c.log, args.run, args.other)
    if args.json:
        json_out({"a": args.run, "b": args.other, "first_divergence": found.first,
                  "states": [found.a.state, found.b.state],
                  "totals": {args.run: found.a.totals(), args.other: found.b.totals()},
                  "steps": [{**row, "a": _shown(row["a"], c), "b": _shown(row["b"], c)}
                            for row in found.rows]})
        return OK

    def cell(side: dict[str, Any] | None) -> str:
        if side is None:
            return "-"
        result = "" if side["held"] else \
            f" -> {_clip(shown(side['result'], c.log.keyring))}"
        return f"{_clip(side['call'], 50)} {side['outcome']}{result}"

    table(f"{args.run} ({found.a.state}) against {args.other} ({found.b.state})",
          ["step", "", args.run, args.other],
          [(row["step"], "" if row["same"] else "≠", cell(row["a"]), cell(row["b"]))
           for row in found.rows])
    totals = [(name, *(str(t[name]) for t in (found.a.totals(), found.b.totals())))
              for name in found.a.totals()]
    table("totals", ["", args.run, args.other], totals)
    print(f"first divergence: step {found.first}" if found.first else
          "the trajectories are the same")
    return OK


def _shown(side: dict[str, Any] | None, c: Any) -> dict[str, Any] | None:
    """A side for display: its result's sealed fields masked unless this caller holds
    their key."""
    return None if side is None else {**side, "result": shown(side["result"], c.log.keyring)}


def _clip(value: Any, limit: int = 40) -> str:
    text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fork_where(args: argparse.Namespace) -> int:
    """``durable fork --where ...``: a held fork of every matching run, then a summary."""
    if args.run is not None or args.new_run_id is not None:
        raise UsageError("--where forks many runs: give no run id and no --new-run-id")
    if not args.hold_effects:
        raise UsageError("--where forks many runs: give --hold-effects")
    where, overrides = whatif.parse_where(args.where), parse_sets(args.set)
    c = client()
    pairs = whatif.fork_all(c, whatif.matching(c, where), args.at, overrides,
                            args.reuse_replies)
    found = whatif.settle(c, pairs, args.wait)
    if args.json:
        json_out({"summary": found.as_dict(), "forks": [vars(o) for o in found.outcomes]})
        return OK
    table(f"what if {', '.join(f'{k}={v}' for k, v in overrides.items()) or 'nothing'}",
          ["run", "fork", "state", "diverges at", "would send (held)"],
          [(o.run_id, o.fork, o.state, o.first or "-",
            "; ".join(f"step {h['step']} {h['tool']}({_clip(h['args'], 60)})"
                      for h in o.held) or "-") for o in found.outcomes])
    total = found.as_dict()
    print(f"{total['runs']} run(s) forked: {total['diverged']} diverged (first divergence "
          f"by step: {total['first_divergence'] or '-'}); {total['held']} effect(s) held, "
          f"{total['simulated']} simulated, {total['reused']} reused, "
          f"{total['effects_sent']} sent")
    return OK


def register(add: Add) -> None:
    for name, fn, helptext in (("log", cmd_log, "a run's log entries"),
                               ("replay", cmd_replay, "state and trajectory from an offset")):
        sp = add(name, fn, helptext, run=True)
        sp.add_argument("--from", dest="start", default="-", help="first entry id")
        sp.add_argument("--to", dest="end", default="+", help="last entry id")
        if name == "log":
            sp.add_argument("--follow", "-f", action="store_true",
                            help="print events and partial output as they come; exit when "
                                 "the run is terminal")
    sp = add("verify", cmd_verify, "check a run's invariants, its log's hash chain and its "
             "seal (exit 1 if any fails)", run=True)
    sp.add_argument("--require-seal", action="store_true",
                    help="fail a run whose log is not sealed up to its last entry (by "
                         "default an unsealed run passes, shown 'unsealed (chain only)')")
    sp = add("verify-archive", cmd_verify_archive, "check an archive file of `durable "
             "archive` on its own: entries, hash chain, seal, large values (exit 1 if any "
             "fails)")
    sp.add_argument("file", help="the run's archive file (<run>.jsonl.gz)")
    sp.add_argument("--require-seal", action="store_true",
                    help="fail a run whose log is not sealed up to its last entry")
    sp = add("seal", cmd_seal, "seal an ended run's log: sign its hash chain head with a "
             "registered key (role sealer)", run=True)
    sp.add_argument("--signer", required=True, help="the key's name in the approver registry")
    sp.add_argument("--key", required=True, help="the signer's private key file")
    sp = add("export", cmd_export, "write a run's evidence as JSON lines", run=True, js=False)
    sp.add_argument("--output", "-o", default=None,
                    help="the file to write (gzip when it ends with .gz); default stdout")
    sp.add_argument("--saved", action="store_true",
                    help="a saved run, to replay offline (`durable replay-test`): the "
                         "encoding of archives (sealed fields stay sealed; large values and "
                         "the hash chain kept)")
    sp = add("diff", cmd_diff, "two runs' trajectories side by side (a fork against its "
             "parent): steps, arguments, outcomes, tokens, the first divergence", run=True)
    sp.add_argument("other", help="the other run id (the fork)")
    sp = add("fork", cmd_fork, "start a new run whose history is a prefix of this one (or, "
             "with --where, a held fork of each matching run, summed up)")
    sp.add_argument("run", nargs="?", default=None, help="run id")
    sp.add_argument("--where", default=None, metavar="agent=A,state=S,since=7d",
                    help="fork every matching run (agent, state [completed], since, tenant, "
                         "limit [100]) with --hold-effects, wait for the forks, and sum up "
                         "how many diverged, where, and what they would have sent")
    sp.add_argument("--wait", type=float, default=60.0, metavar="S",
                    help="with --where: how long to wait for the forks in all (s)")
    sp.add_argument("--at", required=True, help="last entry id of the inherited prefix, or a "
                    "step number N: the steps before N are inherited")
    sp.add_argument("--new-run-id", default=None)
    sp.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="run the fork with this instead of the parent's configuration "
                         "(model=..., prompt=..., tool_set=...: read by the agent); needs "
                         "--hold-effects")
    sp.add_argument("--hold-effects", action="store_true",
                    help="a counterfactual fork: no new effect is sent; a call identical to "
                         "the parent's at the same step reuses its outcome, a tool that "
                         "simulates answers, any other waits for a signed release")
    sp.add_argument("--reuse-replies", action="store_true",
                    help="a model request identical to one of the parent's (same digest) "
                         "reuses its recorded reply")
