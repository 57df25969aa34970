"""The server, the indexes and the metrics: ``durable redis``, ``durable repair-index`` and
``durable metrics``.

Each command imports what it runs when it runs: the parser holds every command, and a call
of one should not load the embedded server, the cluster and the metrics of the others.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from durable.cli.output import CHECK_FAILED, OK, Add, client, json_out
from durable.errors import UsageError
from durable.settings import Settings


def cmd_redis(args: argparse.Namespace) -> int:
    from durable.backend.embedded import run_foreground, stop

    settings = Settings()
    if args.rewrite_aof:
        return _rewrite_aof(args.rewrite_aof)
    if args.stop:
        stopped = stop(settings.server.data_dir)
        print(f"stopped the server of {settings.server.data_dir}" if stopped
              else f"no server runs for {settings.server.data_dir}")
        return OK if stopped else CHECK_FAILED
    return run_foreground(settings, args.port, args.linger)


def _rewrite_aof(timeout_s: float) -> int:
    """``durable redis --rewrite-aof``: have the server in use (each master of a cluster)
    rewrite its append-only file, and wait until it has. Removing a key removes it from
    memory at once but from the AOF on disk only at its next rewrite: model context a
    retention removed (``DURABLE_CONTEXT_RETENTION``) stays readable in the file until then."""
    import time

    conn = client().redis
    nodes = [conn.get_redis_connection(n) for n in conn.get_primaries()] \
        if hasattr(conn, "get_primaries") else [conn]
    began = time.monotonic()
    for node in nodes:
        if not node.info("persistence").get("aof_enabled"):
            raise UsageError("the server keeps no append-only file (appendonly no): "
                             "nothing to rewrite")
        node.bgrewriteaof()  # started (in progress) or scheduled when it returns
        while True:
            info = node.info("persistence")
            if not int(info.get("aof_rewrite_in_progress", 0)) and not int(
                    info.get("aof_rewrite_scheduled", 0)):
                break
            if time.monotonic() - began > timeout_s:
                print(f"durable: the rewrite did not end within {timeout_s:g} s; it goes on "
                      "in the server (INFO persistence tells when it ends)")
                return CHECK_FAILED
            time.sleep(0.05)
        if info.get("aof_last_bgrewrite_status") not in ("ok", b"ok"):
            print(f"durable: the server says its rewrite failed: "
                  f"{info.get('aof_last_bgrewrite_status')}")
            return CHECK_FAILED
    print(f"rewrote the append-only file of {len(nodes)} server(s) in "
          f"{time.monotonic() - began:.1f} s: what was removed is no longer on disk")
    return OK


def cmd_repair_index(args: argparse.Namespace) -> int:
    from durable.controls import sessions
    from durable.log.index import repair

    c = client()
    report = repair(c)
    restored = sessions.rebuild(c.redis, report.turns)
    print(f"reindexed {report.runs} runs")
    if restored:
        print(f"restored the keys of {len(restored)} sessions: {', '.join(restored)}")
    for run_id, why in sorted(report.unreadable.items()):
        print(f"  not indexed: {run_id}: its log cannot be read ({why})")
    return CHECK_FAILED if report.unreadable else OK


def cmd_cluster(args: argparse.Namespace) -> int:
    from durable.backend.cluster import STATE_FILE, LocalCluster

    where = Path(args.dir) if args.dir else Settings().server.data_dir / "cluster"
    found = LocalCluster.recorded(where)
    if args.action == "stop":
        if found is None or not found.nodes:
            print(f"no cluster runs for {where}")
            return CHECK_FAILED
        found.stop()
        (where / STATE_FILE).unlink(missing_ok=True)
        print(f"stopped the cluster of {where} ({len(found.nodes)} nodes)")
        return OK
    if found is not None and found.nodes:
        raise UsageError(f"a cluster runs for {where} already ({found.url}): "
                         "`durable cluster stop` first")
    cluster = LocalCluster(args.masters, args.replicas, data_dir=where,
                           node_timeout_ms=args.node_timeout_ms).start()
    print(f"started a cluster of {args.masters} masters and {args.replicas} replicas each "
          f"under {where}:\n  export DURABLE_REDIS_CLUSTER=1 DURABLE_REDIS_URL={cluster.url}"
          "\n  (and DURABLE_QUEUE_URL: a plain server for RQ, e.g. `durable redis`'s)")
    return OK


def cmd_metrics(args: argparse.Namespace) -> int:
    from durable.telemetry import orphans
    from durable.telemetry.metrics import serve

    c = client()
    conn = c.redis
    try:
        serve(conn, c.log.keys, args.host, args.port, c.queue,
              orphans.grace_ms(c.settings))
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: "
                         f"{exc.strerror or exc}") from None
    finally:
        conn.close()
    return OK


def cmd_archive(args: argparse.Namespace) -> int:
    from durable.durations import parse_duration_ms
    from durable.log.archive import archive
    from durable.log.store import now_ms

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
    sp.add_argument("--rewrite-aof", type=float, nargs="?", const=300.0, default=0,
                    metavar="S", help="have the server in use rewrite its append-only file "
                    "(what was removed, removed context included, leaves the disk then) and "
                    "wait up to S seconds (300) for it to end")
    sp = add("cluster", cmd_cluster, "start or stop a local Redis Cluster on loopback (for "
             "development and tests)", js=False)
    sp.add_argument("action", choices=["start", "stop"])
    sp.add_argument("--masters", type=int, default=3)
    sp.add_argument("--replicas", type=int, default=0, help="replicas per master")
    sp.add_argument("--node-timeout-ms", type=int, default=2000,
                    help="how long a silent master has before its replica takes over")
    sp.add_argument("--dir", default="", help="data directory (default: <data dir>/cluster)")
    add("repair-index", cmd_repair_index, "rebuild the global indexes from the run logs",
        js=False)
    sp = add("metrics", cmd_metrics, "serve the system's Prometheus metrics at /metrics",
             js=False)
    sp.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (default 127.0.0.1; 0.0.0.0 for every one)")
    sp.add_argument("--port", type=int, default=9464, help="port (default 9464)")
    sp = add("archive", cmd_archive, "write terminal runs' evidence to DIR/<run>.jsonl.gz, "
             "then delete their keys")
    sp.add_argument("--older-than", required=True, metavar="AGE",
                    help="terminal runs last updated longer ago than AGE (30d, 12h, 90m)")
    sp.add_argument("--to", default="durable-archive", metavar="DIR",
                    help="directory of the archive files (default ./durable-archive)")
    sp.add_argument("--limit", type=int, default=1000, help="at most this many runs")
