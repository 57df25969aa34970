"""``durable region``: which region may advance runs (``status``), and the failover that
moves them to this one (``takeover``; ``durable.regions``).

``durable region takeover --region B [--from-url redis://old-primary]`` is run against
region B's server (``DURABLE_REDIS_URL``, a replica of the failed primary). It exits 1
having written nothing while the old primary still answers; else it prints what it did:
runs taken, verified, claimed keys looked up and what the lookups said, its duration.
"""

from __future__ import annotations

import argparse

from durable import regions
from durable.agents import registry
from durable.backend.connection import connect
from durable.cli.output import OK, Add, json_out, table
from durable.log.keys import KeyLayout
from durable.settings import Settings


def cmd_status(args: argparse.Namespace) -> int:
    settings = Settings()
    client = connect(settings, check=False)
    try:
        found = regions.status(client, KeyLayout.of(settings))
    finally:
        client.close()
    if args.json:
        for o in found:
            json_out({"shard": o.shard, "owner": o.owner, "epoch": o.epoch, "state": o.state})
        return OK
    table(f"regions (this process: {settings.cluster.region or 'regions off'})",
          ["shard", "owner", "epoch", "state"],
          [("-" if o.shard is None else o.shard, o.owner or "unclaimed", o.epoch,
            o.state or "-") for o in found])
    return OK


def cmd_takeover(args: argparse.Namespace) -> int:
    settings = Settings()
    registry.load(settings.worker.agents)  # the tools whose lookups settle unknown keys
    client = connect(settings, check=False)
    try:
        done = regions.takeover(client, settings, registry, args.region,
                                from_url=args.from_url)
    finally:
        client.close()
    if args.json:
        json_out(done.to_json())
        return OK
    print(f"region {done.region} owns the runs at epoch {done.epoch} "
          f"({'promoted this server, ' if done.promoted else ''}{done.duration_ms} ms)")
    print(f"runs {done.runs}, verified {done.verified}, unverified (quarantined) "
          f"{len(done.unverified)}, enqueued {done.enqueued}")
    print(f"claimed keys without an outcome looked up {done.looked_up}: applied "
          f"{done.found_applied}, re-sent {done.resent}, still unknown {done.still_unknown}, "
          f"lookup failed {len(done.lookup_failed)}; waited {done.waited_ms} ms for deadlines")
    for run_id, failed in done.unverified.items():
        print(f"  {run_id}: did not verify ({', '.join(failed)})")
    return OK


def register(add: Add) -> None:
    sp = add("region", None, "which region may advance runs, and the takeover that moves "
             "them here", js=False)
    sub = sp.add_subparsers(dest="region_command", required=True, parser_class=type(sp))
    st = sub.add_parser("status", help="each shard's owning region, epoch and state")
    st.set_defaults(fn=cmd_status)
    st.add_argument("--json", action="store_true", help="machine-readable output")
    tk = sub.add_parser("takeover", help="promote this server, verify every live run and "
                        "look up its unknown outcomes, then let REGION acquire work")
    tk.set_defaults(fn=cmd_takeover)
    tk.add_argument("--region", required=True, help="the region that takes over")
    tk.add_argument("--from-url", default=None,
                    help="the old primary: refused while it still answers")
    tk.add_argument("--json", action="store_true", help="machine-readable output")
