"""The server and the indexes: ``durable redis`` and ``durable repair-index``."""

from __future__ import annotations

import argparse
from pathlib import Path

from durable.cli.output import CHECK_FAILED, OK, Add, client, json_out
from durable.durations import parse_duration_ms
from durable.embedded import run_foreground, stop
from durable.log.archive import archive
from durable.log.index import repair
from durable.log.store import now_ms
from durable.settings import Settings


def cmd_redis(args: argparse.Namespace) -> int:
    settings = Settings()
    if args.stop:
        stopped = stop(settings.data_dir)
        print(f"stopped the server of {settings.data_dir}" if stopped
              else f"no server runs for {settings.data_dir}")
        return OK if stopped else CHECK_FAILED
    return run_foreground(settings, args.port, args.linger)


def cmd_repair_index(args: argparse.Namespace) -> int:
    print(f"reindexed {repair(client())} runs")
    return OK


def cmd_archive(args: argparse.Namespace) -> int:
    cutoff = now_ms() - parse_duration_ms(args.older_than)
    report = archive(client().log, Path(args.to), cutoff, limit=args.limit)
    if args.json:
        json_out({"archived": report.written, "skipped": report.skipped, "to": args.to})
    else:
        print(f"archived {len(report.written)} runs to {args.to}")
        for run_id, why in report.skipped.items():
            print(f"  kept {run_id}: {why}")
    return OK


def register(add: Add) -> None:
    sp = add("redis", cmd_redis, "run the embedded Redis server in the foreground", js=False)
    sp.add_argument("--port", type=int, default=0)
    sp.add_argument("--stop", action="store_true", help="stop the server of the data dir")
    sp.add_argument("--linger", type=float, default=4.0, metavar="S",
                    help="on a signal, wait up to S seconds for the other processes to "
                         "disconnect before shutting down (Redis stops last)")
    add("repair-index", cmd_repair_index, "rebuild the global indexes from the run logs",
        js=False)
    sp = add("archive", cmd_archive, "write terminal runs' evidence to DIR/<run>.jsonl.gz, "
             "then delete their keys")
    sp.add_argument("--older-than", required=True, metavar="AGE",
                    help="terminal runs last updated longer ago than AGE (30d, 12h, 90m)")
    sp.add_argument("--to", default="durable-archive", metavar="DIR",
                    help="directory of the archive files (default ./durable-archive)")
    sp.add_argument("--limit", type=int, default=1000, help="at most this many runs")
