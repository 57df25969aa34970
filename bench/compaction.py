"""``python -m bench.compaction [--calls N] [--bounds 400,1000]``: what context compaction
(``durable.compaction``) does to a long conversation's requests (not part of ``python -m
bench``; seconds, its own embedded server).

One worker process (embedded Redis, AOF ``everysec``), the tests' local model server
(``tests.servers.model``: a thread of this process, counting every request with its body)
and the tests' ``compacted_looper`` code agent (``tests.agents.compacted``): ``calls`` cycles
of a model call and a tool step, the conversation growing by two messages a cycle. One run
without a bound, then one per bound. For each: the largest and the last request of the
conversation and their sum (tokens estimated as the limiter does: a quarter of the
messages' JSON), the summaries taken and their requests, and the run's wall time.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bench.common import fresh, settings_for
from durable.client import Client
from durable.compaction import SUMMARY_PROMPT
from durable.testing import Server, Worker
from tests.servers.model import ModelServer, Seen

AGENTS = "examples.agents,tests.agents.compacted"
#: A bound no request reaches: the conversation uncompacted.
UNBOUNDED = 10**9


def _tokens(seen: Seen) -> int:
    return len(json.dumps(seen.body["messages"], separators=(",", ":"))) // 4


def run(calls: int = 100, bounds: tuple[int, ...] = (400, 1000)) -> list[dict[str, Any]]:
    model = ModelServer(tokens=5).start()
    srv = Server(fsync="everysec").start()
    proc: Worker | None = None
    out = []
    try:
        fresh(srv.client())
        client = Client(settings_for(srv.url, agents=AGENTS))
        proc = Worker(srv.url, DURABLE_AGENTS=AGENTS, DURABLE_MODEL_BASE_URL=model.url)
        for bound in (UNBOUNDED, *bounds):
            began = time.perf_counter()
            run_id = client.start("compacted_looper", {"calls": calls, "max_tokens": bound},
                                  run_id=f"c{bound}").run_id
            final = client.wait(run_id, 300)
            wall = time.perf_counter() - began
            if final.state != "completed":
                raise RuntimeError(f"bound {bound}: {final.state} {final.reason}")
            seen = [s for s in model.seen if s.key.startswith(f"{run_id}:")]
            summaries = [_tokens(s) for s in seen
                         if s.body["messages"][0]["content"] == SUMMARY_PROMPT]
            talks = [_tokens(s) for s in seen
                     if s.body["messages"][0]["content"] != SUMMARY_PROMPT]
            out.append({"bound": bound, "largest": max(talks), "last": talks[-1],
                        "sum": sum(talks), "summaries": len(summaries),
                        "largest_summary": max(summaries, default=0),
                        "summaries_sum": sum(summaries), "wall_s": wall,
                        "messages": final.result["messages"]})
    finally:
        if proc is not None:
            proc.stop()
        srv.stop()
        model.stop()
    return out


def markdown(rows: list[dict[str, Any]], calls: int) -> str:
    lines = [f"## Context compaction: a {calls}-call conversation\n",
             "| bound (tokens) | largest request | last request | all requests | summaries | "
             "largest summary request | all summary requests | wall (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        bound = "none" if r["bound"] == UNBOUNDED else str(r["bound"])
        lines.append(f"| {bound} | {r['largest']} | {r['last']} | {r['sum']} | "
                     f"{r['summaries']} | {r['largest_summary']} | {r['summaries_sum']} | "
                     f"{r['wall_s']:.2f} |")
    lines.append(f"\nThe log keeps every message: {rows[0]['messages']} in each run.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.compaction", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--bounds", default="400,1000")
    args = p.parse_args(argv)
    bounds = tuple(int(b) for b in args.bounds.split(",") if b.strip())
    print(markdown(run(args.calls, bounds), args.calls))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
