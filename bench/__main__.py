"""``python -m bench``: every benchmark in one process, against embedded servers it starts.

    python -m bench                      # the full run (about 4-5 minutes on 2 cores)
    python -m bench --quick              # a fast smoke run
    python -m bench --only throughput,cancel

Items: codec, throughput, profile, cancel, recovery, takeover, memory, whatif, iobound,
styles, cluster, startup. Outputs go to ``bench/results/``: ``results.md`` (also printed),
``results.json`` and ``chart.png``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil

ITEMS = ("codec", "throughput", "profile", "cancel", "recovery", "takeover", "memory", "whatif",
         "iobound", "styles", "cluster", "startup")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _busy_cpu() -> float:
    t = psutil.cpu_times()
    return t.user + t.system + getattr(t, "nice", 0) + getattr(t, "irq", 0) + getattr(
        t, "softirq", 0)


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _git() -> str:
    """The commit measured, and whether the work tree differs from it (read-only git)."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "durable", "workers"],
                               cwd=root, capture_output=True, text=True,
                               check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}" + (f" + {len(dirty)} uncommitted core file(s)" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(ITEMS),
                   help=f"comma-separated subset of: {', '.join(ITEMS)}")
    p.add_argument("--quick", action="store_true", help="small sizes, one round")
    p.add_argument("--rounds", type=int, default=None, help="throughput rounds (default 3)")
    p.add_argument("--runs", type=int, default=None,
                   help="four-step runs per throughput batch (default 300)")
    p.add_argument("--cancels", type=int, default=None, help="cancels per server (default 200)")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                   help="first wait up to SECONDS for the machine's CPU use to drop below "
                        "25%% (other processes skew every number here)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args(argv)
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = set(only) - set(ITEMS)
    if unknown:
        p.error(f"unknown item(s): {', '.join(sorted(unknown))}")

    if args.wait_quiet > 0:
        end = time.time() + args.wait_quiet
        while time.time() < end:
            busy = psutil.cpu_percent(interval=3)
            if busy < 25:
                break
            _log(f"[bench] machine busy ({busy:.0f}% CPU); waiting")
    os.environ.pop("DURABLE_REDIS_URL", None)  # each item points at its own servers
    from bench import report
    from bench.common import servers

    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    busy0, own0 = _busy_cpu(), _own_cpu()
    load0 = [round(x, 2) for x in os.getloadavg()]
    res: dict[str, Any] = {}
    with servers() as srv:
        info = srv.client("everysec").info("server")
        for item in ITEMS:
            if item not in only:
                continue
            t0 = time.time()
            _log(f"[bench] {item} ...")
            if item == "codec":
                from bench import codec

                res[item] = codec.run(srv, quick=args.quick)
            elif item == "throughput":
                from bench import throughput

                res[item] = throughput.run(srv, quick=args.quick, rounds=args.rounds,
                                           runs=args.runs, log=_log)
            elif item == "profile":
                from bench import profile

                res[item] = profile.run(srv, quick=args.quick, out_dir=args.out, log=_log)
            elif item == "cancel":
                from bench import cancel

                res[item] = cancel.run(srv, quick=args.quick, n=args.cancels, log=_log)
            elif item == "recovery":
                from bench import recovery

                res[item] = recovery.run(srv, quick=args.quick, log=_log)
            elif item == "takeover":
                from bench import takeover

                res[item] = takeover.run(srv, quick=args.quick, log=_log)
            elif item == "memory":
                from bench import memory

                res[item] = memory.run(srv, quick=args.quick, log=_log)
            elif item == "whatif":
                from bench import whatif

                res[item] = whatif.run(srv, quick=args.quick, log=_log)
            elif item == "iobound":
                from bench import iobound

                res[item] = iobound.run(srv, quick=args.quick, out_dir=args.out, log=_log)
            elif item == "styles":
                from bench import styles

                res[item] = styles.run(srv, quick=args.quick, out_dir=args.out, log=_log)
            elif item == "cluster":
                from bench import cluster

                res[item] = cluster.run(srv, quick=args.quick, rounds=args.rounds,
                                        runs=args.runs, log=_log)
            elif item == "startup":
                from bench import startup

                res[item] = startup.run(quick=args.quick, log=_log)
            _log(f"[bench] {item} done in {time.time() - t0:.1f}s")
    elapsed = time.time() - started
    busy = _busy_cpu() - busy0
    own = _own_cpu() - own0
    cpus = psutil.cpu_count() or 1
    res["meta"] = {
        "command": "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "started": datetime.datetime.fromtimestamp(started).isoformat(timespec="seconds"),
        "elapsed_s": elapsed, "cpus": cpus,
        "loadavg_before": load0, "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "redis_version": info.get("redis_version"),
        "git": _git(),
        "python": sys.version.split()[0],
        "cpu_s_this_benchmark": round(own, 1),
        "cpu_s_other_processes": round(max(0.0, busy - own), 1),
        "cpu_s_available": round(elapsed * cpus, 1),
    }
    other = res["meta"]["cpu_s_other_processes"]
    if other > 0.05 * elapsed * cpus:
        res["meta"]["other_busy"] = (f"{other:.0f} CPU-seconds used by other processes of "
                                     f"{elapsed * cpus:.0f} available")
    md = report.write(res, args.out)
    print(md)
    chart = ", chart.png" if (Path(args.out) / "chart.png").exists() else ""
    _log(f"[bench] wrote {args.out}/results.md, results.json{chart} in {elapsed:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
