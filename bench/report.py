"""Markdown, JSON and the chart (``bench.chart``) from the items' results."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from bench import chart, cluster, startup


def _f(x: Any, nd: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float | int):
        if abs(x) >= 10_000:
            return f"{x:,.0f}"
        return f"{x:,.{nd}f}"
    return str(x)


def _ok(value: float, target: float, higher: bool = True) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return "yes" if (value >= target if higher else value <= target) else "**no**"


def targets(res: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    tp = res.get("throughput")
    if tp:
        for fsync, tgt in (("everysec", 0.75), ("always", 0.60)):
            row = tp["by_fsync"].get(fsync)
            if row:
                v = row["ratios"]["durable_1w / floor"]
                one = row["durable, 1 worker"]["steps_per_s"]
                fl = row["floor"]["steps_per_s"]
                rows.append((f"steps/s per worker process / the Lua floor, {fsync} "
                             f"({_f(one)} / {_f(fl)} steps/s, 1 worker)", f"{v:.1%}",
                             f"≥ {tgt:.0%}", _ok(v, tgt)))
        for fsync, row in tp["by_fsync"].items():
            v = row["ratios"]["durable_1w steps/s / plain RQ jobs/s"]
            rows.append((f"this system steps/s / plain RQ jobs/s per worker, {fsync}",
                         f"{v:.2f}x", "≥ 10x", _ok(v, 10)))
        for fsync, row in tp["by_fsync"].items():
            v = row["ratios"]["durable_2w / durable_1w"]
            rows.append((f"2 workers / 1 worker, {fsync}", f"{v:.2f}x", "≥ 1.6x", _ok(v, 1.6)))
    cn = res.get("cancel")
    if cn:
        for fsync in ("everysec", "always"):
            if fsync not in cn:
                continue
            for name in ("event latency_ms", "client wall ms"):
                s = cn[fsync][name]
                rows.append((f"cancel p50 ({name}), {fsync}", f"{s['p50']:.1f} ms", "≤ 20 ms",
                             _ok(s["p50"], 20, higher=False)))
                rows.append((f"cancel p99 ({name}), {fsync}", f"{s['p99']:.1f} ms", "≤ 100 ms",
                             _ok(s["p99"], 100, higher=False)))
    rc = res.get("recovery")
    if rc:
        big = rc["rows"][rc["sizes"][-1]]
        rows.append((f"recovery load, {rc['sizes'][-1]} events / {rc['sizes'][0]} events",
                     f"{big['load_vs_smallest']:.2f}x", "≤ 2x",
                     _ok(big["load_vs_smallest"], 2, higher=False)))
    tk = res.get("takeover")
    if tk:
        rows.append((f"dead worker's {tk['runs']} runs resumed, p50", f"{tk['p50_s']:.2f} s",
                     "≤ 1 s", _ok(tk["p50_s"], 1, higher=False)))
    mm = res.get("memory")
    if mm:
        for label in ("4-step", "1000-step"):
            if label in mm:
                v = mm[label]["bytes_per_step"]
                rows.append((f"Redis bytes/step, {label} runs", f"{v:.0f} B", "≤ 400 B",
                             _ok(v, 400, higher=False)))
        for label, conv in mm.get("conversations", {}).items():
            rows.append((f"Redis bytes / message bytes, conversation of {label}",
                         f"{conv['ratio']:.2f}x", "≤ 1.2x", _ok(conv["ratio"], 1.2, higher=False)))
    io = res.get("iobound")
    if io:
        cf = io["configs"]
        main, one = cf.get("durable, 2 workers x 500"), cf.get("durable, 1 worker x 1000")
        if main:
            rows.append((f"I/O-bound, {io['runs']:,} runs x {io['steps']} x {io['sleep_s']} s, "
                         f"2 workers x 500: wall / ideal {io['ideal_s']} s",
                         f"{main['wall_s']:.2f} s: {main['ratio_to_ideal']:.2f}x", "≤ 1.5x",
                         _ok(main["ratio_to_ideal"], 1.5, higher=False)))
            v = main.get("rss_peak_mb_max", max(main["rss_peak_mb"]))
            rows.append((f"I/O-bound: peak RSS per worker holding {io['runs'] // 2:,} runs "
                         "(highest of the rounds)",
                         f"{v:.0f} MB", "≤ 150 MB", _ok(v, 150, higher=False)))
        if one:
            v = one.get("rss_peak_mb_max", max(one["rss_peak_mb"]))
            rows.append((f"I/O-bound: peak RSS of one worker holding {io['runs']:,} runs "
                         "(highest of the rounds)",
                         f"{v:.0f} MB", "≤ 150 MB", _ok(v, 150, higher=False)))
    return rows


def _iobound(io: dict[str, Any]) -> list[str]:
    out = [f"## Many I/O-bound runs at once ({io['runs']:,} runs x {io['steps']} steps, each "
           f"tool call sleeping {io['sleep_s']} s: ideal {io['ideal_s']} s; median of "
           f"{io['rounds']} interleaved rounds, DBOS one)\n",
           "Wall: from the first start to the last run's last write (the workers are "
           "started and ready before the clock starts; `backlog`: the runs are started while "
           "the workers are stopped, the clock starts when they continue). Starts: the "
           "runs started by one client in the benchmark process, in one `start_many` call "
           "(or one `start` call each, where the row says so). Round trips are counted "
           "inside the workers (RQ and heartbeats included; a pipeline is one); server "
           "commands also count those run inside scripts and the client's starts.\n",
           "| configuration | wall s | x ideal | starts s | run latency p50 / p99 / max ms | "
           "queue wait p50 / max ms | peak RSS per process MB | threads | round trips / "
           "step | server cmds / step | log problems | CPU-s workers / redis / other "
           "processes |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, c in io["configs"].items():
        if "unavailable" in c:
            out.append(f"| {name} | not available: {c['unavailable']} |" + " |" * 10)
            continue
        if "latency_ms" in c:
            lat, wt = c["latency_ms"], c["wait_ms"]
            bad = f" ({c['incomplete']})" if c.get("incomplete") else ""
            out.append(
                f"| {name}{bad} | {c['wall_s']:.2f} | {c['ratio_to_ideal']:.2f} | "
                f"{c['start_s']:.2f} | {lat['p50']:.0f} / {lat['p99']:.0f} / {lat['max']:.0f} "
                f"| {wt['p50']:.0f} / {wt['max']:.0f} | "
                f"{' / '.join(f'{x:.0f}' for x in c['rss_peak_mb'])} | "
                f"{' / '.join(str(x) for x in c['threads_peak'])} | "
                f"{c['worker_round_trips_per_step']:.2f} | "
                f"{c['server_commands_per_step']:.1f} | {c['log_problems']['count']} | "
                f"{sum(c['cpu_s']['workers']):.1f} / {c['cpu_s']['redis']:.1f} / "
                f"{c['cpu_s']['other processes']:.1f} |")
        elif "rss_peak_mb" in c:  # DBOS
            pgc = c.get("pg_commits_per_step")
            out.append(f"| {name} | {c['wall_s']:.2f} | {c['ratio_to_ideal']:.2f} | "
                       f"{c['start_s']:.2f} | - | - | {c['rss_peak_mb']:.0f} | "
                       f"{_f(c.get('threads_peak'))} | "
                       f"{'-' if pgc is None else f'{pgc:.2f} PG commits'} | - | - | "
                       f"{c['cpu_s']:.1f} (DBOS) / - / - |")
        else:
            out.append(f"| {name} | {c['wall_s']:.2f} | {c['ratio_to_ideal']:.2f} |"
                       + " - |" * 9)
    cf = io["configs"]
    main = cf.get("durable, 2 workers x 500")
    if main:
        cmp = []
        g = cf.get("asyncio.gather (ceiling)")
        if g:
            cmp.append(f"{main['wall_s'] / g['wall_s']:.2f}x the wall time of asyncio.gather")
        dbos = [(n, c) for n, c in cf.items() if n.startswith("DBOS")]
        cmp += [f"{c['wall_s'] / main['wall_s']:.1f}x faster than {n}" for n, c in dbos
                if "wall_s" in c]
        if dbos and all("unavailable" in c for _n, c in dbos):
            cmp.append(f"DBOS not available: {dbos[0][1]['unavailable']}")
        out.append(f"\n2 workers x 500: {'; '.join(cmp)}.")
        cpu = main.get("cpu_s")
        if cpu:
            out.append(f"CPU seconds during its wall (median round): workers "
                       f"{' + '.join(f'{x:.1f}' for x in cpu['workers'])}, redis "
                       f"{cpu['redis']:.1f}, benchmark process (the starts) "
                       f"{cpu['bench process']:.1f}, other processes on the machine "
                       f"{cpu.get('other processes', float('nan')):.1f}; whole machine "
                       f"{cpu['machine']:.1f} of {cpu['available']:.1f} available. "
                       "Runs taken per worker: "
                       f"{main['runs_per_worker']}. RSS idle before the runs "
                       f"{' / '.join(f'{x:.0f}' for x in main['rss_idle_mb'])} MB.")
    for name, c in cf.items():
        if name.startswith("DBOS") and "cpu_s" in c:
            out.append(f"{name}: its process used {c['cpu_s']:.1f} CPU-s during the wall "
                       f"time; the machine {c.get('machine_cpu_s', float('nan')):.1f} CPU-s "
                       "over the whole process (launch and PostgreSQL included).")
    for name, c in cf.items():
        lp = c.get("log_problems")
        if lp and lp["count"]:
            out.append(f"\nWorker log problems, {name} ({lp['count']} lines; "
                       f"{c.get('stats_delta') or 'no dx:stats change'}):\n")
            out += [f"- {n} x `{k}`" for k, n in lp["kinds"].items()]
    logs = [c["logs"][0] for c in cf.values() if c.get("logs")]
    if logs:
        out.append(f"\nWorker logs (the median round of each): `{Path(logs[0]).parent}/`.")
    out.append("")
    return out


def markdown(res: dict[str, Any]) -> str:
    out: list[str] = []
    meta = res["meta"]
    out.append("# Benchmark results\n")
    out.append(f"Command: `{meta['command']}`, started {meta['started']}, "
               f"{meta['elapsed_s']:.0f} s total, {meta['cpus']} CPUs, load average "
               f"before/after {meta['loadavg_before']} / {meta['loadavg_after']}. Code: "
               f"{meta.get('git', '?')}. Medians of interleaved repeats unless marked. "
               f"Embedded redis-server {meta.get('redis_version', '?')} with AOF on, one "
               "server per appendfsync policy, data in a temp dir on the local disk.\n")
    if meta.get("other_busy"):
        out.append(f"Other busy processes seen on the machine during the run (they compete "
                   f"for the 2 CPUs): {meta['other_busy']}\n")
    t = targets(res)
    if t:
        out.append("## Targets\n")
        out.append("| metric | measured | target | met |\n|---|---:|---:|:---:|")
        out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in t]
        out.append("")
    if res.get("cluster"):
        out += cluster.report(res["cluster"])
    tp = res.get("throughput")
    if tp:
        fs = list(tp["by_fsync"])
        out.append(f"## Throughput (steps/s; {tp['runs_per_batch']} four-step runs per batch, "
                   f"{tp['rounds']} interleaved rounds)\n")
        out.append("| configuration | " + " | ".join(f"{f}" for f in fs) + " |")
        out.append("|---|" + "---:|" * len(fs))
        for cfg in tp["by_fsync"][fs[0]]:
            if cfg == "ratios":
                continue
            cells = []
            for f in fs:
                c = tp["by_fsync"][f][cfg]
                cell = _f(c["steps_per_s"])
                if "wall_steps_per_s" in c:
                    cell += f" (wall incl. start-up: {_f(c['wall_steps_per_s'])})"
                cells.append(cell)
            out.append(f"| {cfg} | " + " | ".join(cells) + " |")
        for ratio in tp["by_fsync"][fs[0]]["ratios"]:
            out.append(f"| ratio: {ratio} | " + " | ".join(
                f"{tp['by_fsync'][f]['ratios'][ratio]:.3g}" for f in fs) + " |")
        cpu_rows = [(cfg, f) for cfg in tp["by_fsync"][fs[0]] if cfg != "ratios"
                    for f in fs if "cpu_us_per_step" in tp["by_fsync"][f][cfg]]
        if cpu_rows:
            out.append("\nCPU per step, µs (inside the measured window; the floor's "
                       "client is this process):\n")
            out.append("| configuration | appendfsync | client or worker(s) | Redis |")
            out.append("|---|---|---:|---:|")
            for cfg, f in cpu_rows:
                c = tp["by_fsync"][f][cfg]["cpu_us_per_step"]
                mine = c.get("worker", c.get("client", 0.0))
                out.append(f"| {cfg} | {f} | {mine:,.0f} | {c['redis']:,.0f} |")
        for bad in tp.get("incomplete_batches", []):
            out.append(f"\n**Incomplete batch**: {bad}")
        out.append("\n`plain RQ` is jobs/s (one job = one no-op call). Per-round samples are in "
                   "results.json.\n")
    pf = res.get("profile")
    if pf:
        for fsync in [k for k in pf if k != "cprofile"]:
            p = pf[fsync]
            out.append(f"## Where a worker's time goes ({fsync}; in-process DurableWorker, "
                       f"{p['runs']} four-step runs, {p['total_ms_per_run']:.2f} ms per run "
                       "including instrumentation)\n")
            rt = p["round_trips_per_run"]
            out.append(f"Redis round trips per run: driver {rt.get('driver', 0):.1f}, "
                       f"RQ {rt.get('RQ', 0):.1f}.\n")
            out.append("| part (exclusive wall time) | µs per run | µs per step | share |")
            out.append("|---|---:|---:|---:|")
            tot = sum(p["us_per_run"].values())
            for k, v in p["us_per_run"].items():
                out.append(f"| {k} | {v:,.0f} | {v / p['steps_per_run']:,.0f} | "
                           f"{v / tot:.1%} |")
            out.append("")
        if "cprofile" in pf:
            out.append(f"cProfile of `StepLoop.advance`: `bench/results/{pf['cprofile']['file']}`."
                       "\n")
    cn = res.get("cancel")
    if cn:
        out.append(f"## Cancellation latency ({cn['cancels_per_fsync']} cancels per server, "
                   "runs blocked in `noop`, held by a worker process)\n")
        out.append("| fsync | measure | p50 ms | p99 ms | max ms |\n|---|---|---:|---:|---:|")
        for fsync in [k for k in cn if k != "cancels_per_fsync"]:
            for name, s in cn[fsync].items():
                out.append(f"| {fsync} | {name} (n={s['n']}) | {s['p50']:.1f} | "
                           f"{s['p99']:.1f} | {s['max']:.1f} |")
        out.append("")
    tk = res.get("takeover")
    if tk:
        out.append(f"## A dead worker's runs resumed ({tk['runs']} runs held by a SIGKILLed "
                   f"worker, {tk['rounds']} rounds, default liveness TTL and lease TTL)\n")
        out.append("| measure | p50 s | p95 s | max s |\n|---|---:|---:|---:|")
        out.append(f"| kill -> lease taken by the other worker (n={tk['resumed']}) | "
                   f"{tk['p50_s']:.3f} | {tk['p95_s']:.3f} | {tk['max_s']:.3f} |")
        out.append("")
    rc = res.get("recovery")
    if rc:
        out.append(f"## Recovery time against log length (median of {rc['repeats']} loads; "
                   f"checkpoint_every={rc['checkpoint_every']})\n")
        out.append("| log events | events read on load | EventLog.load ms | x smallest | "
                   "full refold (read + fold) ms |\n|---:|---:|---:|---:|---:|")
        for size in rc["sizes"]:
            row = rc["rows"][size]
            out.append(f"| {row['events']:,} | {row['folded_on_load']} | {row['load_ms']:.2f} | "
                       f"{row['load_vs_smallest']:.2f} | {row['refold_ms']:.1f} |")
        out.append("")
    mm = res.get("memory")
    if mm:
        out.append("## Redis memory per step and worker RSS\n")
        out.append("| runs | log B | run B | fx B | (fence B) | log entries | B/entry (log) | "
                   "B/step (log+run+fx) |\n|---|---:|---:|---:|---:|---:|---:|---:|")
        for label in ("4-step", "1000-step"):
            if label in mm:
                m = mm[label]
                b = m["bytes"]
                out.append(f"| {label} (median of {m['runs']}) | {b['log']:,.0f} | "
                           f"{b['run']:,.0f} | {b['fx']:,.0f} | {b['fence']:,.0f} | "
                           f"{m['log_entries']:.0f} | "
                           f"{m['log_bytes_per_entry']:.0f} | **{m['bytes_per_step']:.0f}** |")
        g = mm.get("global bytes per run", {})
        if g:
            out.append("\nGlobal keys, bytes per run: " + ", ".join(
                f"`{k}` {v:.0f}" for k, v in g.items()) + ".")
        cp = mm.get("checkpoints (1000-step run)")
        if cp:
            out.append(f"Checkpoints in a 1000-step run driven by a worker: {cp['checkpoints']} "
                       f"in {cp['events']} events; at most {cp['max_events_between']} events "
                       "between two.")
        convs = mm.get("conversations", {})
        if convs:
            out.append("\nCode-agent conversations (`bench/chat.py`), Redis bytes (log + run + "
                       "fx) against the bytes of their messages:\n")
            out.append("| conversation | messages B | log B | run B | fx B | log entries | "
                       "ratio |\n|---|---:|---:|---:|---:|---:|---:|")
            for label, conv in convs.items():
                b = conv["bytes"]
                out.append(f"| {label} | {conv['message_bytes']:,} | {b['log']:,} | "
                           f"{b['run']:,} | {b['fx']:,} | {conv['log_entries']:,} | "
                           f"**{conv['ratio']:.2f}x** |")
            out.append("")
        out.append("Worker RSS: " + ", ".join(
            f"{x['rss_mb']:.1f} MB after {x['after_runs']} runs" for x in mm["worker_rss"])
            + f" (growth {mm['worker_rss_growth_mb']:+.1f} MB).\n")
    if res.get("startup"):
        out += startup.markdown(res["startup"])
    wi = res.get("whatif")
    if wi:
        out.append("## What-if: suggested core changes, simulated in the benchmark process\n")
        out.append("`StepLoop.advance` in-process on four-step no-op runs, blocks of 8 runs "
                   "timed once per variant in rotated order (medians):\n")
        fs = list(wi["driver"])
        out.append("| variant | " + " | ".join(f"{f} us/step | {f} vs baseline" for f in fs)
                   + " |")
        out.append("|---|" + "---:|---:|" * len(fs))
        for name in wi["driver"][fs[0]]:
            out.append(f"| {name} | " + " | ".join(
                f"{wi['driver'][f][name]['us_per_step']:,.0f} | "
                f"{wi['driver'][f][name]['vs_baseline']:.2f}x" for f in fs) + " |")
        mo = wi.get("models")
        if mo:
            out.append("\nThe worker's two drivers on the same `StepLoop` code, in this "
                       "process (everysec, four-step no-op runs, 64 at once; interleaved "
                       "rounds, medians):\n")
            out.append("| model | steps/s | CPU per step (µs) | vs run threads |")
            out.append("|---|---:|---:|---:|")
            for name, row in mo.items():
                out.append(f"| {name} | {row['steps_per_s']:,.0f} | "
                           f"{row['cpu_us_per_step']:.0f} | {row['vs_threads']:.2f}x |")
        out.append("\nRecovery read path (ms, medians, interleaved):\n")
        sizes = list(wi["load"])
        cols = list(wi["load"][sizes[0]])
        out.append("| log events | " + " | ".join(cols) + " |")
        out.append("|---:|" + "---:|" * len(cols))
        for size in sizes:
            out.append(f"| {int(size):,} | " + " | ".join(
                f"{wi['load'][size][c]:.2f}" for c in cols) + " |")
        mv = wi["memory"]
        out.append("\nRedis bytes per step (log+run+fx) by `stream-node-max-bytes` "
                   "(in-process driver):\n")
        rows = mv["stream-node-max-bytes"]
        cols = list(next(iter(rows.values())))
        out.append("| stream-node-max-bytes | " + " | ".join(cols) + " |")
        out.append("|---:|" + "---:|" * len(cols))
        for nb, row in rows.items():
            out.append(f"| {nb} | " + " | ".join(f"{row[c]:.0f}" for c in cols) + " |")
        out.append("\nMsgpack bytes of one step's events: " + ", ".join(
            f"{k}: {v}" for k, v in mv["step triplet bytes"].items()) + ".\n")
    io = res.get("iobound")
    if io:
        out += _iobound(io)
    if res.get("styles"):
        from bench import styles

        out += styles.report(res["styles"])
    cd = res.get("codec")
    if cd:
        out.append("## Codec: msgpack vs JSON (msgspec typed encoders/decoders over AnyEvent)\n")
        wire = "wire" in cd["per_type"]
        out.append("| event | msgpack enc ns | json enc ns | msgpack dec ns | json dec ns | "
                   "msgpack B | json B |" + (" wire (v4) enc ns | dec ns | B |" if wire else "")
                   + "\n|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|---:|" if wire else ""))
        for t in cd["shown"]:
            m, j = cd["per_type"]["msgpack"][t], cd["per_type"]["json"][t]
            row = (f"| {t} | {m['enc_ns']:.0f} | {j['enc_ns']:.0f} | {m['dec_ns']:.0f} | "
                   f"{j['dec_ns']:.0f} | {m['bytes']:.0f} | {j['bytes']:.0f} |")
            if wire:
                w = cd["per_type"]["wire"][t]
                row += f" {w['enc_ns']:.0f} | {w['dec_ns']:.0f} | {w['bytes']:.0f} |"
            out.append(row)
        out.append(f"\n`events.decode` (with version check) on the step mix: "
                   f"{cd['events_decode_step_mix_ns']:.0f} ns per event.")
        if "redis" in cd:
            out.append("\n| real run (in-process driver) | log entries | Redis B/entry msgpack | "
                       "Redis B/entry if JSON |\n|---|---:|---:|---:|")
            for label, x in cd["redis"].items():
                out.append(f"| {label} | {x['entries']} | {x['msgpack_bytes_per_entry']:.0f} | "
                           f"{x['json_bytes_per_entry']:.0f} |")
        out.append("")
    return "\n".join(out) + "\n"


def write(res: dict[str, Any], out_dir: Path) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    md = markdown(res)
    (out_dir / "results.md").write_text(md)
    (out_dir / "results.json").write_text(json.dumps(res, indent=1, default=str))
    (out_dir / "chart.png").unlink(missing_ok=True)  # never a chart of an earlier run
    try:
        chart.draw(res, out_dir / "chart.png")
    except ModuleNotFoundError as exc:  # the chart needs the bench extra; the figures do not
        print(f"[bench] no chart: {exc.name} is not installed (pip install -e '.[bench]')",
              file=sys.stderr)
    return md
