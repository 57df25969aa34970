"""``python -m bench.doors [--quick] [--runs N]``: start-to-first-event latency through
``durable mcp`` beside the native client's (not part of ``python -m bench``; about 30 s, its
own embedded server, one worker, one ``durable mcp --dev`` process).

Each sample starts a short run of ``count`` (3 steps of 0.3 s) both ways, interleaved, so
load from elsewhere falls on both alike:

- **native**: ``Client.start``, then the run's log followed (``Client.follow``) until its
  first entry (``run_started``) and its first ``step_decided``;
- **MCP**: the official ``mcp`` SDK's client over Streamable HTTP (one session for every
  sample, as an MCP host keeps one): a task-augmented ``tools/call`` until its answer (the
  task, status ``working``), then ``tasks/result`` sent at once until its first progress
  notification (the first step).

Reported: the medians and 90th percentiles (ms), and each MCP median over its native one.
A sample whose run ended before ``tasks/result`` joined it (no progress left to send: a
machine far too busy) is left out and counted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import time
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2
from mcp import Client as McpClient
from mcp import types
from mcp.client.streamable_http import streamable_http_client

from bench.common import median, percentile, settings_for, worker
from durable.backend.embedded import free_port
from durable.client import Client
from durable.log import events as ev
from durable.log import keys
from durable.testing import Server, wait_for
from durable.testing.processes import Process

ARGS = {"steps": 3, "sleep_s": 0.3}


@contextlib.contextmanager
def door(url: str) -> Iterator[str]:
    """A ``durable mcp --dev`` process on ``url``; its endpoint."""
    port = free_port()
    proc = Process(url, ["mcp", "--dev", "--port", str(port)], DURABLE_AGENTS="")
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        if not wait_for(up, 60, interval=0.1):
            raise RuntimeError("durable mcp did not start")
        yield f"{base}/mcp"
    finally:
        proc.stop()


def native(client: Client) -> tuple[float, float]:
    """ms from ``Client.start`` to the first log entry read, and to the first step."""
    t0 = time.perf_counter()
    started = client.start("count", ARGS)
    follower = client.follow(started.run_id, partial=False)
    first: float | None = None
    try:
        for item in follower:
            first = (time.perf_counter() - t0) * 1000 if first is None else first
            if isinstance(getattr(item, "event", None), ev.StepDecided):
                return first, (time.perf_counter() - t0) * 1000
    finally:
        follower.close()
    raise RuntimeError("the run ended without a step")


async def through_mcp(session: Any) -> tuple[float, float]:
    """ms from a task-augmented call to its answer, and to the first step's progress."""
    seen: list[float] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        if message and message.startswith("step 1:"):
            seen.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    created = await session.send_request(types.CallToolRequest(
        params=types.CallToolRequestParams(name="count", arguments=ARGS,
                                           task=types.TaskMetadata(ttl=60_000))),
        types.CreateTaskResult)
    answered = (time.perf_counter() - t0) * 1000
    await session.send_request(types.GetTaskPayloadRequest(
        params=types.GetTaskPayloadRequestParams(task_id=created.task.task_id)),
        types.CallToolResult, progress_callback=progress)
    return answered, seen[0] if seen else float("nan")


async def sample(endpoint: str, client: Client, n: int) -> list[tuple[float, ...]]:
    out: list[tuple[float, ...]] = []
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=300)) as http:
        async with McpClient(streamable_http_client(endpoint, http_client=http),
                             mode="legacy") as mcp:
            await through_mcp(mcp.session)  # warm: the first call loads what calls need
            await asyncio.to_thread(native, client)
            for _ in range(n):
                got = await through_mcp(mcp.session)
                out.append((*await asyncio.to_thread(native, client), *got))
    return out


def run(*, quick: bool = False, runs: int | None = None) -> dict[str, Any]:
    n = runs or (10 if quick else 40)
    srv = Server().start()
    w = None
    try:
        settings = settings_for(srv.url)
        client = Client(settings)
        w = worker(srv.url)
        if not wait_for(lambda: client.redis.hexists(keys.AGENTS, "count"), 60):
            raise RuntimeError("no worker published the agents")
        with door(srv.url) as endpoint:
            rows = asyncio.run(sample(endpoint, client, n))
        client.close()
    finally:
        if w is not None:
            w.stop()
        srv.stop()
    names = ("native_first_entry", "native_first_step", "mcp_task", "mcp_first_step")
    missed = [r for r in rows if math.isnan(r[3])]
    rows = [r for r in rows if not math.isnan(r[3])]
    if not rows:
        raise RuntimeError("every run ended before tasks/result joined it")
    res: dict[str, Any] = {"samples": len(rows), "left_out": len(missed)}
    for i, name in enumerate(names):
        xs = [r[i] for r in rows]
        res[name] = {"median_ms": round(median(xs), 1), "p90_ms": round(percentile(xs, 90), 1)}
    res["ratio_first_event"] = round(res["mcp_task"]["median_ms"] /
                                     res["native_first_entry"]["median_ms"], 2)
    res["ratio_first_step"] = round(res["mcp_first_step"]["median_ms"] /
                                    res["native_first_step"]["median_ms"], 2)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.doors", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="10 samples instead of 40")
    p.add_argument("--runs", type=int, default=None, help="samples")
    res = run(quick=p.parse_args(argv).quick, runs=p.parse_args(argv).runs)
    left = f", {res['left_out']} left out" if res["left_out"] else ""
    print(f"start-to-first-event, {res['samples']} samples{left} (median / p90 ms)\n")
    print("| | native client | durable mcp | ratio |\n|---|---|---|---|")
    for label, nat, mcp, ratio in (
            ("first event (native: first log entry; MCP: the task)", "native_first_entry",
             "mcp_task", "ratio_first_event"),
            ("first step (native: step_decided read; MCP: progress)", "native_first_step",
             "mcp_first_step", "ratio_first_step")):
        print(f"| {label} | {res[nat]['median_ms']} / {res[nat]['p90_ms']} | "
              f"{res[mcp]['median_ms']} / {res[mcp]['p90_ms']} | x{res[ratio]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
