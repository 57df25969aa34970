"""The examples' commands: ``world``, ``demo``, ``chaos``, added to the CLI by
``python -m examples`` (from a checkout: the examples are not installed).

- ``python -m examples world [--port P] [--no-dedupe]``: the example's external world in the
  foreground, on ``DURABLE_WORLD_URL``'s address by default (``http://127.0.0.1:8765``);
  ``--show`` prints a running world's applications per key, ``--faults JSON`` sets faults.
- ``python -m examples demo``: the scenarios on an embedded Redis, the world and real workers.
- ``python -m examples chaos --runs N [--workers K] [--seed S]``: the chaos suite.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from durable.cli.output import table
from durable.errors import UsageError
from durable.settings import Settings
from examples.settings import world_url


def _show(url: str, as_json: bool) -> int:
    import httpx

    from examples.world import WorldClient

    client = WorldClient(url)
    try:
        apps, faults = client.applications(), client.faults()
    except httpx.HTTPError as exc:
        print(f"durable: no world answers at {url}: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    if as_json:
        print(json.dumps({"applications": apps.__dict__, "faults": faults,
                          "duplicates": apps.duplicates}))
        return 0
    table(f"world {url}: applications per key (deduplication "
           f"{'on' if apps.dedupe else 'OFF'})", ["system", "key", "applications"],
           apps.rows())
    print(f"duplicates: {apps.duplicates or 'none'}; faults injected: {faults['injected']}")
    return 0


def cmd_world(args: argparse.Namespace) -> int:
    settings = Settings()
    base = world_url()
    url = urlsplit(base)
    if args.show or args.faults:
        if args.faults:
            import httpx

            try:
                plan = json.loads(args.faults)
            except ValueError as exc:
                raise UsageError(f"--faults is not valid JSON: {exc}") from None
            resp = httpx.post(f"{base}/control/faults", json=plan)
            if resp.status_code == 400:
                raise UsageError(resp.json().get("error", "bad fault plan"))
            resp.raise_for_status()
            print(json.dumps(resp.json()))
            return 0
        return _show(base, args.json)
    from examples.world.server import serve

    host = args.host or url.hostname or "127.0.0.1"
    port = args.port if args.port is not None else (url.port or 8765)
    data_dir = args.data_dir or settings.server.data_dir / "world"
    try:
        return serve(host, port, data_dir, dedupe=not args.no_dedupe, reset=args.reset,
                     verbose=args.verbose)
    except OSError as exc:
        print(f"durable: cannot listen on {host}:{port}: {exc} (is a world already "
              "running? try `python -m examples world --show`)", file=sys.stderr)
        return 1


def cmd_demo(args: argparse.Namespace) -> int:
    from examples.demo import run_demo
    from examples.scenarios.runner import NAMES

    unknown = [n for n in args.only or [] if n not in NAMES]
    if unknown:
        raise UsageError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(NAMES)}")
    return run_demo(names=args.only or None, as_json=args.json, redis_url=args.redis_url,
                    workdir=args.workdir)


def cmd_chaos(args: argparse.Namespace) -> int:
    from examples.chaos import ChaosConfig, print_report, run_chaos

    if args.runs < 1 or args.workers < 1:
        raise UsageError("--runs and --workers must be at least 1")
    every = args.kill_every
    cfg = ChaosConfig(runs=args.runs, workers=args.workers, seed=args.seed,
                      kill_every=(every * 0.5, every * 1.5), stall_s=args.stall,
                      arrive_every_s=args.arrive_every)
    if args.no_faults:
        cfg.p_fail = cfg.p_drop = cfg.p_slow = cfg.db_lock_s = 0.0
    if args.cluster and args.redis_url:
        raise UsageError("--cluster starts its own cluster: leave out --redis-url")
    report = run_chaos(cfg, redis_url=args.redis_url, cluster=args.cluster,
                       progress=None if args.json else _progress_line)
    if args.json:
        print(json.dumps(report.to_json(), default=str))
    else:
        print_report(report)
    return 0 if report.ok else 1


def _progress_line(kind: str, data: dict[str, Any]) -> None:
    if kind == "started":
        print(f"chaos: starting {data['runs']} runs; recovery by {data['recovery']}",
              file=sys.stderr, flush=True)
    elif sys.stderr.isatty():
        print(f"\r  terminal {data['terminal']}/{data['runs']}, kills {data['kills']}  ",
              end="", file=sys.stderr, flush=True)


def register(add: Callable[..., Any]) -> None:
    sp = add("world", cmd_world, "run the example's external world (API, source, database)")
    sp.add_argument("--host", default=None, help="default: DURABLE_WORLD_URL's host")
    sp.add_argument("--port", type=int, default=None, help="default: DURABLE_WORLD_URL's port")
    sp.add_argument("--no-dedupe", action="store_true",
                    help="never deduplicate by key (API) and no unique key column (database)")
    sp.add_argument("--data-dir", type=Path, default=None,
                    help="default: <DURABLE_DATA_DIR>/world")
    sp.add_argument("--reset", action="store_true", help="delete the world's data first")
    sp.add_argument("--verbose", action="store_true", help="log every request")
    sp.add_argument("--show", action="store_true",
                    help="print the running world's applications per key, then exit")
    sp.add_argument("--faults", default=None, metavar="JSON",
                    help='set faults on the running world, e.g. \'{"fail_next": 2}\'')
    sp = add("demo", cmd_demo, "the example through seven scenarios on real processes")
    sp.add_argument("--only", nargs="+", default=None, metavar="SCENARIO",
                    help="normal, crash, timeout, cancel, replay (default: all)")
    sp.add_argument("--redis-url", default=None, help="default: a fresh embedded Redis")
    sp.add_argument("--workdir", type=Path, default=None,
                    help="keep Redis's data, the world's files and every process log here")
    sp = add("chaos", cmd_chaos, "many runs while workers are killed and the world fails")
    sp.add_argument("--runs", type=int, default=100, help="runs of pipeline to start")
    sp.add_argument("--workers", type=int, default=4, help="worker processes kept alive")
    sp.add_argument("--seed", type=int, default=0, help="seeds kills, faults and inputs")
    sp.add_argument("--kill-every", type=float, default=1.4, metavar="SECONDS",
                    help="mean time between two random SIGKILLs")
    sp.add_argument("--arrive-every", type=float, default=0.0, metavar="SECONDS",
                    help="time between two starts (default: all at once)")
    sp.add_argument("--stall", type=float, default=60.0, metavar="SECONDS",
                    help="exit 1 when no run took a step or ended for this long")
    sp.add_argument("--no-faults", action="store_true", help="kills only, no world faults")
    sp.add_argument("--cluster", action="store_true",
                    help="the log on a local 3-master Redis Cluster, RQ on a plain server")
    sp.add_argument("--redis-url", default=None, help="default: a fresh embedded Redis")
