"""The deploy gate: ``durable deploy check --agents MODULE``.

Imports MODULE (the new agent code), replays every run in flight of the agents it defines
against it without sending anything (``durable.audit.deploycheck``), and lists the runs that
would diverge with their first differing step. Exit 1 when any would: usable in CI before
a rollout. It also lists the runs whose pinned configuration (model, prompt, tools, policy)
the new code changes, and what each would do on resume (its agent's
``on_configuration_change``); that alone does not fail the check. It opens sealed fields
like a worker does, so it needs the workers' keys.

``durable replay-test FILES... [--agents MODULE]`` is the same gate on saved runs (``durable
export RUN --saved``) with no Redis at all: each file replays against the code imported now
(``durable.audit.offline``); exit 1 when any diverges, naming its first differing step.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from durable.agents import registry
from durable.agents.configuration import describe
from durable.audit.deploycheck import check, defined_in
from durable.audit.offline import load, replay_saved
from durable.cli.output import CHECK_FAILED, OK, Add, client, json_out, table
from durable.errors import UsageError
from durable.log.state import ACTIVE, WAITING
from durable.log.store import EventLog
from durable.settings import Settings


def cmd_check(args: argparse.Namespace) -> int:
    c = client()
    registry.load(args.agents)
    agents = defined_in(registry, args.agents)
    if not agents:
        raise UsageError(f"{args.agents} defines no agent")
    elog = EventLog.from_settings(c.redis, c.settings, open_sealed=True,
                                  sealed_names=registry.sensitive_names(),
                                  lean_agents=registry.rebuilt_agents())
    runs = [(r.run_id, r.agent, r.state) for state in sorted(ACTIVE | WAITING)
            for name in sorted(agents)
            for r in c.runs(state, args.limit, agent=name)]
    verdicts = check(elog, agents, runs)
    diverging = [v for v in verdicts if v.outcome != "same"]
    if args.json:
        for v in verdicts:
            json_out({"run_id": v.run_id, "agent": v.agent, "outcome": v.outcome,
                      "step": v.step, "detail": v.detail, "drift": v.drift,
                      "on_resume": v.on_resume})
    else:
        if diverging:
            table("runs that would diverge", ["run", "agent", "step", "why"],
                  [(v.run_id, v.agent, v.step or "", v.detail) for v in diverging])
        drifting = [v for v in verdicts if v.drift]
        if drifting:
            table("runs whose pinned configuration the new code changes",
                  ["run", "agent", "changed", "on resume"],
                  [(v.run_id, v.agent, describe(v.drift), v.on_resume) for v in drifting])
        print(f"{len(drifting)} run(s) pinned to another configuration")
        print(f"{len(verdicts)} run(s) in flight of {', '.join(sorted(agents))} checked: "
              f"{len(verdicts) - len(diverging)} replay the same, {len(diverging)} would "
              "diverge")
    return CHECK_FAILED if diverging else OK


def cmd_replay_test(args: argparse.Namespace) -> int:
    registry.load(args.agents or Settings().worker.agents)
    verdicts = [replay_saved(load(Path(name))) for name in args.files]
    failed = [v for v in verdicts if not v.ok]
    if args.json:
        for v in verdicts:
            json_out({"file": v.path, "run_id": v.run_id, "agent": v.agent,
                      "outcome": v.outcome, "steps": v.steps, "step": v.step,
                      "detail": v.detail, "seconds": round(v.seconds, 4)})
    else:
        table("saved runs replayed", ["file", "agent", "steps", "outcome", "step", "why"],
              [(v.path, v.agent, v.steps, v.outcome, v.step or "", v.detail)
               for v in verdicts])
        print(f"{len(verdicts)} saved run(s): {len(verdicts) - len(failed)} replay the "
              f"same, {len(failed)} diverge")
    return CHECK_FAILED if failed else OK


def register(add: Add) -> None:
    sp = add("replay-test", cmd_replay_test, "replay saved runs (`durable export RUN "
             "--saved`) against the agent code imported now, offline: no model, tool or "
             "Redis (exit 1 when any diverges)")
    sp.add_argument("files", nargs="+", metavar="FILE", help="saved runs (.jsonl, .jsonl.gz)")
    sp.add_argument("--agents", default="", metavar="MODULE",
                    help="the modules that define the agents (default DURABLE_AGENTS)")
    sp = add("deploy", None, "checks before a rollout: deploy check --agents MODULE", js=False)
    verbs = sp.add_subparsers(dest="verb", required=True, parser_class=type(sp))
    p = verbs.add_parser("check", help="replay the runs in flight against new agent code",
                         description="replay every run in flight of MODULE's agents against "
                                     "the code imported now (nothing is sent); exit 1 when "
                                     "any would diverge")
    p.set_defaults(fn=cmd_check)
    p.add_argument("--agents", required=True, metavar="MODULE",
                   help="the module that defines the new agents")
    p.add_argument("--limit", type=int, default=10_000,
                   help="runs per state and agent to check (default 10000)")
    p.add_argument("--json", action="store_true", help="one JSON line per run checked")
