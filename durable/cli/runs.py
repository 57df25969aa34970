"""Commands on runs: start, status, runs, cancel (with compensation), respond, approve,
settle, quarantine release."""

from __future__ import annotations

import argparse
import sys
import time
from decimal import Decimal

import msgspec

from durable.agents.configuration import actions, changes, describe, strictest
from durable.audit.replay import summary
from durable.cli.output import (
    CHECK_FAILED,
    OK,
    Add,
    age,
    client,
    json_arg,
    json_out,
    local_time,
    table,
)
from durable.client import Client
from durable.controls.children import blocking_child
from durable.controls.compensation import not_undone_why, read_whole
from durable.errors import UsageError
from durable.flow import budgets
from durable.log.state import TERMINAL, RunState
from durable.security.sealing import shown_struct
from durable.security.signing import load_private_key, read_key_file
from durable.telemetry.liveness import served_agents


def cmd_start(args: argparse.Namespace) -> int:
    data = json_arg(args.input, "--input") if args.input else {}
    started = client().start(args.agent, data, run_id=args.run_id,
                             continue_from=args.continue_from, tenant=args.tenant,
                             owner=args.owner, priority=args.priority, session=args.session)
    if args.json:
        json_out({"run_id": started.run_id, "created": started.created, "state": started.state})
    else:
        print(started.run_id)
    return OK


def cmd_status(args: argparse.Namespace) -> int:
    c = client()
    c.projection(args.run)
    state = shown_struct(c.status(args.run), c.log.keyring)
    info = summary(state)
    drift = config_drift(c, state)
    blocked = blocking_child(c.log, state)  # a quarantined child it waits for
    if args.json:
        why = not_undone_why(read_whole(c.log, args.run)) if state.not_undone else {}
        json_out({"run_id": args.run, **msgspec.to_builtins(state), **info,
                  **({"config_drift": drift} if drift else {}),
                  **({"blocked_by_child": {"child": blocked[0], "reason": blocked[1]}}
                     if blocked else {}),
                  **({"not_undone_why": why} if why else {})})
        return OK
    rows = [("run", args.run), ("agent", f"{state.agent} v{state.agent_version}"),
            *[(k, v) for k, v in info.items()]]
    if state.config:
        rows.append(("config", " ".join(f"{k}={v or '-'}" for k, v in sorted(
            state.config.items()))))
    if drift:
        rows.append(("config drift", f"{describe(drift)} (this code's, on resume: "
                                     f"{drift_policy(c, state.agent, drift)})"))
    if state.state == "pending" and not c.redis.exists(c.log.keys.lease(args.run)):
        rows.append(("worker", waiting_for_worker(c, state.agent)))
    if state.parent and state.parent_step:
        rows.append(("parent", f"{state.parent} (step {state.parent_step})"))
    if state.children:
        rows.append(("children", ", ".join(state.children)))
    if state.session or state.continue_from:
        rows.append(("session", f"{state.session or '-'} (continues "
                                f"{state.continue_from or 'nothing: its first turn'})"))
    for ref in state.evidence:  # checked again on every resume after a wait
        rows.append(("evidence", f"{ref.source}/{ref.id} version {ref.version or '-'} "
                                 f"(step {ref.step})"))
    for ref in state.evidence_failed:
        rows.append(("evidence failed", f"{ref.source}/{ref.id}: {ref.why}"))
    if state.cancel:
        undo = " (with compensation)" if state.cancel.compensate else ""
        rows.append(("cancel", f"{state.cancel.scope}{undo}: {state.cancel.reason}"))
    undoing = [a for a in state.actions.values() if a.undoes]
    if undoing or state.compensated or state.not_undone:
        done = state.compensated or [a.undoes for a in undoing if a.status == "succeeded"]
        rows.append(("compensated", ", ".join(f"step {s}" for s in done) or (
            "none" if state.terminal else "none yet")))
    if state.not_undone:
        why = not_undone_why(read_whole(c.log, args.run))
        rows.append(("not undone", ", ".join(f"step {s} ({why[s]})" for s in state.not_undone)))
    for act in undoing:  # a compensation that did not go through, while the run goes on
        if act.status in ("failed", "rejected") and not state.terminal:
            rows.append(("compensation", f"step {act.step} (undoing step {act.undoes}) "
                                         f"{act.status}" + (f": {act.error}" if act.error else "")))
    if state.cost_usd or state.uncosted or budgets.USD_MICROS in state.budgets:
        limit = state.budgets.get(budgets.USD_MICROS)
        rows.append(("cost", budgets.spent(state.cost_usd, state.uncosted) + (
            f" (budget {budgets.dollars(limit)})" if limit is not None else "")))
    if state.wait:
        until = local_time(state.wait.deadline) if state.wait.deadline else "no expiry"
        rows.append(("wait", f"{state.wait.kind} until {until}: {state.wait.reason}"))
    if blocked is not None:
        rows.append(("blocked", f"child {blocked[0]} is quarantined: {blocked[1]} (its "
                                f"agent's on_child_quarantined: {on_child(c, state)})"))
    for appr in state.approvals.values():
        if appr.decision is None:
            rows.append(("approval", f"request {appr.request} ({appr.kind}, step {appr.step}) "
                                     f"role {appr.role}, expires {local_time(appr.expires)}"))
    table(f"run {args.run}", ["field", "value"], rows)
    if state.traceback:
        print(f"traceback of the agent code that quarantined it:\n{state.traceback.rstrip()}")
    return OK


def config_drift(c: Client, state: RunState) -> dict[str, list[str]]:
    """How the configuration this process has for the run's agent differs from the run's
    pin (``durable.agents.configuration``); {} when it has no such agent or the run no pin."""
    agent = c.registry.agents.get(state.agent)
    if agent is None or not state.config:
        return {}
    return changes(state.config, agent.configuration(c.registry))


def on_child(c: Client, state: RunState) -> str:
    """What the run's agent does when the child it waits for is quarantined."""
    agent = c.registry.agents.get(state.agent)
    return str(getattr(agent, "on_child_quarantined", "wait")) if agent else "unknown here"


def drift_policy(c: Client, name: str, drift: dict[str, list[str]]) -> str:
    return strictest(actions(c.registry.agent(name).on_configuration_change, drift))


def waiting_for_worker(c: Client, agent: str) -> str:
    """Why a ready run no worker holds waits: whether a live worker has its agent."""
    serving = [w for w, routes in served_agents(c.redis).items() if agent in routes]
    if not serving:
        return f"waits: no live worker has agent {agent!r}; one that does takes it as " \
               "soon as it starts (routing by agent)"
    return f"ready for the {len(serving)} live worker(s) that have agent {agent!r}"


def cmd_runs(args: argparse.Namespace) -> int:
    if args.stuck and args.orphaned:
        raise UsageError("--stuck and --orphaned are two lists: give one of them")
    if args.stuck:
        return _stuck(args)
    if args.orphaned:
        return _orphaned(args)
    runs = client().runs(args.state, args.limit, agent=args.agent, after=args.after,
                         tenant=args.tenant, owner=args.owner, session=args.session)
    if args.json:
        for r in runs:
            json_out(r.__dict__)
        return OK
    who = any(r.tenant or r.owner for r in runs)  # the columns only when some run has them
    money = ["cost"] if args.cost else []
    table("runs", ["run", "state", "agent", *(["tenant", "owner"] if who else []), "step",
                   "version", "updated", *money, "reason"],
          [(r.run_id, r.state, r.agent, *((r.tenant, r.owner) if who else ()), r.step,
            r.version, age(r.updated),
            *([budgets.spent(r.cost_usd, r.uncosted)] if money else []), r.reason)
           for r in runs])
    if args.cost:
        total = sum((Decimal(r.cost_usd) for r in runs), Decimal(0))
        unknown = sum(r.uncosted for r in runs)
        print(f"cost of these {len(runs)} runs: {budgets.spent(str(total), unknown)}")
    return OK


def _stuck(args: argparse.Namespace) -> int:
    found = client().stuck(args.limit)
    if args.json:
        for row, act in found:
            json_out({**row.__dict__, "step": act.step, "tool": act.tool, "key": act.key})
        return OK
    table("runs waiting for an operator to settle an unknown outcome (durable settle)",
          ["run", "agent", "step", "tool", "key", "since"],
          [(row.run_id, row.agent, act.step, act.tool, act.key, age(row.updated))
           for row, act in found])
    return OK


def _orphaned(args: argparse.Namespace) -> int:
    narrowed = [f"--{n}" for n in ("state", "after", "agent", "tenant", "owner", "session")
                if getattr(args, n) is not None]
    if narrowed:
        raise UsageError(f"--orphaned looks at every run not over: without {', '.join(narrowed)}")
    if args.limit < 1:
        raise UsageError(f"--limit must be at least 1, not {args.limit}")
    found = client().orphaned()
    shown = found[:args.limit]
    if args.json:
        for o in shown:
            json_out(o.__dict__)
    else:
        table("runs with no valid next event (no lease, not ready, nothing due to wake them)",
              ["run", "state", "agent", "updated", "why"],
              [(o.run_id, o.state, o.agent, age(o.updated), o.why) for o in shown])
    if len(found) > len(shown):
        print(f"durable: {len(found) - len(shown)} more orphaned runs (--limit)", file=sys.stderr)
    return CHECK_FAILED if found else OK  # for scripts and cron: orphans are a finding


def cmd_cancel(args: argparse.Namespace) -> int:
    c = client()
    before = c.projection(args.run).get("state", "")
    if before in TERMINAL:
        print(f"durable: run {args.run} is already {before}; nothing to cancel",
              file=sys.stderr)
        return CHECK_FAILED
    if args.compensate:
        return _compensate(c, args)
    state = c.cancel(args.run, args.reason, args.scope)
    if args.json:
        json_out({"run_id": args.run, "state": state.state})
    else:
        print(f"{args.run}: {state.state}")
    return OK


def _compensate(c: Client, args: argparse.Namespace) -> int:
    """``cancel --compensate``: the plan as requested; with ``--wait``, as it ended."""
    if args.scope != "run":
        raise UsageError("--compensate cancels the whole run: it takes no --scope call")
    done = c.abort(args.run, args.reason)
    state, compensating, not_undone = done.state, done.compensating, done.not_undone
    if args.wait:
        state = c.wait(args.run, args.wait, waiting=False)
        compensating = state.compensated
        if state.terminal:  # what was not undone and why, as the log tells it now
            not_undone = not_undone_why(read_whole(c.log, args.run))
    out = {"run_id": args.run, "state": state.state,
           "compensated" if args.wait else "compensating": compensating,
           "not_undone": [{"step": s, "why": why} for s, why in not_undone.items()],
           "unresolved": done.unresolved}
    if args.json:
        json_out(out)
        return OK
    print(f"{args.run}: {state.state}")
    steps = ", ".join(str(s) for s in compensating) or "none"
    print(f"  {'compensated' if args.wait else 'compensating (newest first)'}: {steps}")
    if done.unresolved:
        print(f"  outcome unknown, looked up first: {', '.join(map(str, done.unresolved))}")
    for step, why in not_undone.items():
        print(f"  could not be undone: step {step}" + (f" ({why})" if why else ""))
    return OK


def cmd_respond(args: argparse.Namespace) -> int:
    data = json_arg(args.input, "--input")
    c = client()
    c.projection(args.run)
    if args.external:
        state = c.external_event(args.run, data, request=args.request)
    else:
        state = c.respond(args.run, data, request=args.request)
    json_out({"run_id": args.run, "state": state.state})
    return OK


def cmd_approve(args: argparse.Namespace) -> int:
    private_key = read_key_file(args.key)
    load_private_key(private_key)  # a bad key file is a usage error, before anything else
    c = client()
    c.projection(args.run)
    before = c.status(args.run).approvals.get(args.request)
    if before is not None and before.decision is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(before.decided_at / 1000))
        print(f"durable: request {args.request} is already decided: {before.decision} by "
              f"{before.approver} at {when}; nothing written", file=sys.stderr)
        return CHECK_FAILED
    if c.settings.security.approvers:
        print("durable: warning: DURABLE_APPROVERS grants nothing; approvers are registered "
              "keys (durable approvers add)", file=sys.stderr)
    state = c.sign_and_approve(args.run, args.request, args.decision, args.approver,
                               private_key, args.note)
    json_out({"run_id": args.run, "state": state.state})
    return OK


def cmd_settle(args: argparse.Namespace) -> int:
    private_key = read_key_file(args.key)
    load_private_key(private_key)  # a bad key file is a usage error, before anything else
    if args.result is not None and not args.applied:
        raise UsageError("--result goes with --applied")
    result = json_arg(args.result, "--result") if args.result is not None else None
    c = client()
    c.projection(args.run)
    state = c.sign_and_settle(args.run, args.step,
                              "applied" if args.applied else "not_applied", args.signer,
                              private_key, evidence=args.evidence, result=result)
    json_out({"run_id": args.run, "step": args.step, "state": state.state})
    return OK


def cmd_quarantine_release(args: argparse.Namespace) -> int:
    c = client()
    c.projection(args.run)
    state = c.release(args.run, by=args.by)
    print(f"{args.run}: {state}")
    return OK if state != "quarantined" else CHECK_FAILED


def register(add: Add) -> None:
    sp = add("start", cmd_start, "start a run; prints its id")
    sp.add_argument("agent")
    sp.add_argument("--input", default=None, help="the agent's input as JSON")
    sp.add_argument("--run-id", default=None, help="idempotent: an existing id returns that run")
    sp.add_argument("--continue-from", default=None, metavar="RUN",
                    help="continue this completed run's conversation (durable.conversations)")
    sp.add_argument("--session", default=None, metavar="NAME",
                    help="a turn of this named session (of --tenant): continues its latest "
                    "run, refused while that run has not ended (durable.controls.sessions)")
    sp.add_argument("--tenant", default=None, help="who the run is for (limits, fairness)")
    sp.add_argument("--owner", default=None, help="who started it")
    sp.add_argument("--priority", type=int, default=None,
                    help="higher is taken first among ready runs (-100..100, default 0)")
    add("status", cmd_status, "a run's folded state", run=True)
    sp = add("runs", cmd_runs, "list runs, newest first")
    sp.add_argument("--state", default=None)
    sp.add_argument("--limit", type=int, default=100, help="runs per page")
    sp.add_argument("--after", default=None, metavar="RUN",
                    help="the next page: runs listed after this one")
    sp.add_argument("--agent", default=None, help="only this agent's runs")
    sp.add_argument("--tenant", default=None, help="only this tenant's runs (by start time)")
    sp.add_argument("--owner", default=None, help="only runs started by this owner")
    sp.add_argument("--session", default=None, metavar="NAME",
                    help="only this session's runs (of --tenant), the latest turn first")
    sp.add_argument("--stuck", action="store_true",
                    help="only runs whose unknown outcome no lookup can resolve (settle them)")
    sp.add_argument("--cost", action="store_true",
                    help="a column of what each run's model calls cost (durable.costs), and "
                    "the total")
    sp.add_argument("--orphaned", action="store_true",
                    help="only runs not over that nothing will move on: no lease, on no ready "
                    "list, no due entry a reconciler will reach, no answer awaited")
    sp = add("cancel", cmd_cancel, "request cancellation of a run", run=True)
    sp.add_argument("--reason", default="operator request")
    sp.add_argument("--scope", choices=["run", "call"], default="run")
    sp.add_argument("--compensate", action="store_true",
                    help="undo its applied effects first, newest first (each a step of its "
                         "own); lists what could not be undone")
    sp.add_argument("--wait", type=float, default=0, metavar="SECONDS",
                    help="with --compensate: wait for the run to end, and show the result")
    sp = add("abort", cmd_cancel, "cancel a whole run; with --compensate, undo its applied "
             "effects first (as cancel --compensate)", run=True)
    sp.set_defaults(scope="run")
    sp.add_argument("--reason", default="operator request")
    sp.add_argument("--compensate", action="store_true",
                    help="undo its applied effects, newest first; lists what could not be undone")
    sp.add_argument("--wait", type=float, default=0, metavar="SECONDS",
                    help="with --compensate: wait for the run to end, and show the result")
    sp = add("respond", cmd_respond, "answer a run waiting for input (or an external event)",
             run=True)
    sp.add_argument("--input", required=True, help="the response as JSON")
    sp.add_argument("--request", default=None, help="only if the run waits for this request")
    sp.add_argument("--external", action="store_true", help="deliver an external event")
    sp = add("approve", cmd_approve, "approve or reject an action waiting for approval",
             run=True)
    sp.add_argument("--request", required=True)
    sp.add_argument("--decision", required=True, choices=["approve", "reject"])
    sp.add_argument("--approver", required=True, metavar="NAME",
                    help="the registered approver key that signs (durable approvers add)")
    sp.add_argument("--key", required=True, metavar="PRIVATE_KEY_FILE",
                    help="NAME's Ed25519 private key (PEM): the decision is signed locally")
    sp.add_argument("--note", default="")
    sp = add("settle", cmd_settle, "settle a step's unknown outcome by a signed operator "
             "decision; the run goes on", run=True, js=False)
    sp.add_argument("--step", required=True, type=int)
    how = sp.add_mutually_exclusive_group(required=True)
    how.add_argument("--applied", action="store_true", help="the call did apply")
    how.add_argument("--not-applied", action="store_true",
                     help="it did not: the step is sent again with the same key")
    sp.add_argument("--result", default=None, metavar="JSON",
                    help="with --applied: the call's result as JSON (default null)")
    sp.add_argument("--evidence", required=True, metavar="TEXT",
                    help="what shows it (recorded and signed)")
    sp.add_argument("--signer", required=True, metavar="NAME",
                    help="the registered key that signs (durable approvers add NAME --role "
                    "operator)")
    sp.add_argument("--key", required=True, metavar="PRIVATE_KEY_FILE",
                    help="NAME's Ed25519 private key (PEM): the decision is signed locally")
    sp = add("quarantine", cmd_quarantine_release,
             "quarantine release RUN: retry a quarantined run (after an upgrade)", js=False)
    sp.add_argument("verb", choices=["release"])
    sp.add_argument("run")
    sp.add_argument("--by", default="operator")
