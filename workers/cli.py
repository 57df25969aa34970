"""``durable worker``: added to the CLI through the ``durable.commands`` entry point group."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from durable.errors import UsageError
from durable.settings import Settings, WorkerSettings


def cmd_worker(args: argparse.Namespace) -> int:
    from .runtime import run_worker  # the worker itself, for this command only

    if args.concurrency is not None and args.concurrency < 1:
        raise UsageError("--concurrency must be at least 1")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise UsageError("--metrics-port must be a port number (0-65535)")
    return run_worker(Settings(), burst=args.burst, queue_name=args.queue, hooks=args.hook,
                      concurrency=args.concurrency, metrics_port=args.metrics_port,
                      metrics_host=args.metrics_host)


def register(add: Callable[..., Any]) -> None:
    sp = add("worker", cmd_worker, "run a worker (RQ) process", js=False)
    sp.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    sp.add_argument("--queue", default=None)
    slots = WorkerSettings.model_fields["concurrency"].default
    sp.add_argument("--concurrency", type=int, default=None, metavar="N",
                    help=f"runs driven at once (default: DURABLE_CONCURRENCY, {slots})")
    sp.add_argument("--hook", action="append", default=[], metavar="MODULE:ATTR[=ARG]",
                    help="a step hook (repeatable), e.g. durable.testing.faults:KillAt="
                         "after_effect:2")
    sp.add_argument("--metrics-port", type=int, default=None, metavar="N",
                    help="serve this process's Prometheus metrics on port N (/metrics)")
    sp.add_argument("--metrics-host", default="127.0.0.1", metavar="H",
                    help="address of --metrics-port (default 127.0.0.1; 0.0.0.0 for all)")
