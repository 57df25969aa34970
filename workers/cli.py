"""``durable worker``: added to the CLI through the ``durable.commands`` entry point group."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from durable.errors import UsageError
from durable.settings import Settings
from workers.runtime import run_worker


def cmd_worker(args: argparse.Namespace) -> int:
    if args.concurrency is not None and args.concurrency < 1:
        raise UsageError("--concurrency must be at least 1")
    return run_worker(Settings(), burst=args.burst, queue_name=args.queue, hooks=args.hook,
                      concurrency=args.concurrency)


def register(add: Callable[..., Any]) -> None:
    sp = add("worker", cmd_worker, "run a worker (RQ) process", js=False)
    sp.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    sp.add_argument("--queue", default=None)
    sp.add_argument("--concurrency", type=int, default=None, metavar="N",
                    help="runs driven at once (default: DURABLE_CONCURRENCY, 64)")
    sp.add_argument("--hook", action="append", default=[], metavar="MODULE:ATTR[=ARG]",
                    help="a step hook (repeatable), e.g. durable.testing.faults:KillAt="
                         "after_effect:2")
