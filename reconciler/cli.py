"""``durable reconciler`` and ``durable reconcile RUN``: added to the CLI through the
``durable.commands`` entry point group. Each command imports the reconciler when it runs:
the parser of every ``durable`` call holds these commands."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from durable.errors import UsageError


def cmd_reconciler(args: argparse.Namespace) -> int:
    import msgspec

    from durable.client import Client
    from durable.security.sealing import require_keys
    from durable.settings import Settings

    from .process import run_reconciler
    from .sweep import Sweeper

    settings = Settings()
    if args.once:
        client = Client(settings)
        require_keys(client.registry.sensitive_names(), settings)
        report = Sweeper(settings, client.redis, client.registry).tick()
        print(msgspec.json.encode({"examined": report.examined, "actions": report.actions})
              .decode())
        return 0
    if args.probe_port is not None and not 0 <= args.probe_port <= 65535:
        raise UsageError("--probe-port must be a port number (0-65535)")
    if args.stale_after_s is not None and args.stale_after_s <= 0:
        raise UsageError("--stale-after-s must be a positive number of seconds")
    probe = (args.probe_host, args.probe_port) if args.probe_port is not None else None
    return run_reconciler(settings, args.interval, probe=probe,
                          stale_after_s=args.stale_after_s or 0.0)


def cmd_reconcile(args: argparse.Namespace) -> int:
    import msgspec

    from durable.client import Client
    from durable.security.sealing import require_keys
    from durable.settings import Settings

    from .sweep import Sweeper

    client = Client(Settings())
    require_keys(client.registry.sensitive_names(), client.settings)
    client.projection(args.run)
    done = Sweeper(client.settings, client.redis, client.registry).reconcile(args.run)
    state = client.status(args.run)
    if args.json:
        print(msgspec.json.encode({"run_id": args.run, "done": done, "state": state.state})
              .decode())
    else:
        print(f"{args.run}: {done}; state {state.state}")
    return 0


def register(add: Callable[..., Any]) -> None:
    sp = add("reconciler", cmd_reconciler, "run the reconciler process", js=False)
    sp.add_argument("--once", action="store_true", help="one pass over what is due, then exit")
    sp.add_argument("--interval", type=float, default=None, help="seconds between passes")
    sp.add_argument("--probe-port", type=int, default=None, metavar="N",
                    help="serve /healthz and /metrics on this port (reconciler.probe)")
    sp.add_argument("--probe-host", default="127.0.0.1", metavar="HOST",
                    help="address of --probe-port (default 127.0.0.1; 0.0.0.0 for all)")
    sp.add_argument("--stale-after-s", type=float, default=None, metavar="S",
                    help="/healthz fails once no sweep pass went round for S seconds "
                    "(default: the larger of 60 s and 20 intervals)")
    add("reconcile", cmd_reconcile, "reconcile one run now", run=True)
