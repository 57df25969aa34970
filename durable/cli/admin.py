"""The server, the indexes and the metrics: ``durable redis``, ``durable repair-index`` and
``durable metrics``."""

from __future__ import annotations

import argparse

from durable.cli.output import CHECK_FAILED, OK, Add, client
from durable.embedded import run_foreground, stop
from durable.errors import UsageError
from durable.log.index import repair
from durable.metrics import serve
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


def cmd_metrics(args: argparse.Namespace) -> int:
    conn = client().redis
    try:
        serve(conn, args.host, args.port)
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: "
                         f"{exc.strerror or exc}") from None
    finally:
        conn.close()
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
    sp = add("metrics", cmd_metrics, "serve the system's Prometheus metrics at /metrics",
             js=False)
    sp.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (default 127.0.0.1; 0.0.0.0 for every one)")
    sp.add_argument("--port", type=int, default=9464, help="port (default 9464)")
