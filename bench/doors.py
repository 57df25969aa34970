"""``python -m bench.doors [--quick] [--runs N]``: start-to-first-event latency through
``durable mcp`` and through the server-sent events of ``GET /runs/{id}/events`` beside the
native client's (not part of ``python -m bench``; about a minute, its own embedded server,
one worker, one ``durable mcp --dev`` and one ``durable a2a --dev`` process).

Each sample starts a short run of ``count`` (3 steps of 0.3 s) both ways, interleaved, so
load from elsewhere falls on both alike:

- **native**: ``Client.start``, then the run's log followed (``Client.follow``) until its
  first entry (``run_started``) and its first ``step_decided``;
- **MCP**: the official ``mcp`` SDK's client over Streamable HTTP (one session for every
  sample, as an MCP host keeps one): a task-augmented ``tools/call`` until its answer (the
  task, status ``working``), then ``tasks/result`` sent at once until its first progress
  notification (the first step);
- **SSE**: ``Client.start``, then the run's events read over HTTP (``GET /runs/{id}/events``
  of ``durable a2a``, with httpx) until the first ``entry`` frame and the first
  ``step_decided`` one.

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
def door(url: str, command: str = "mcp") -> Iterator[str]:
    """A ``durable mcp --dev`` (or ``a2a``) process on ``url``; its endpoint (``a2a``: its
    base URL)."""
    port = free_port()
    proc = Process(url, [command, "--dev", "--port", str(port)], DURABLE_AGENTS="")
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            probe = "/healthz" if command == "mcp" else "/agents"
            return httpx.get(base + probe, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        if not wait_for(up, 60, interval=0.1):
            raise RuntimeError(f"durable {command} did not start")
        yield f"{base}/mcp" if command == "mcp" else base
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


def through_sse(client: Client, http: httpx.Client, base: str) -> tuple[float, float]:
    """ms from ``Client.start`` to the first ``entry`` frame read over HTTP, and to the
    first ``step_decided`` one."""
    t0 = time.perf_counter()
    started = client.start("count", ARGS)
    first: float | None = None
    with http.stream("GET", f"{base}/runs/{started.run_id}/events") as response:
        response.raise_for_status()
        event = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line[len("event: "):]
            elif line.startswith("data: ") and event == "entry":
                first = (time.perf_counter() - t0) * 1000 if first is None else first
                if '"type": "step_decided"' in line:
                    return first, (time.perf_counter() - t0) * 1000
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


async def sample(endpoint: str, events: str, client: Client, n: int) \
        -> list[tuple[float, ...]]:
    out: list[tuple[float, ...]] = []
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=300)) as http:
        async with McpClient(streamable_http_client(endpoint, http_client=http),
                             mode="legacy") as mcp:
            with httpx.Client(timeout=httpx.Timeout(30, read=300)) as sse:
                await through_mcp(mcp.session)  # warm: the first call loads what calls need
                await asyncio.to_thread(native, client)
                await asyncio.to_thread(through_sse, client, sse, events)
                for _ in range(n):
                    got = await through_mcp(mcp.session)
                    nat = await asyncio.to_thread(native, client)
                    out.append((*nat, *got,
                                *await asyncio.to_thread(through_sse, client, sse, events)))
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
        with door(srv.url) as endpoint, door(srv.url, "a2a") as events:
            rows = asyncio.run(sample(endpoint, events, client, n))
        client.close()
    finally:
        if w is not None:
            w.stop()
        srv.stop()
    names = ("native_first_entry", "native_first_step", "mcp_task", "mcp_first_step",
             "sse_first_entry", "sse_first_step")
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
    for ratio, door_name, nat in (("sse_ratio_first_event", "sse_first_entry",
                                   "native_first_entry"),
                                  ("sse_ratio_first_step", "sse_first_step",
                                   "native_first_step")):
        res[ratio] = round(res[door_name]["median_ms"] / res[nat]["median_ms"], 2)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.doors", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="10 samples instead of 40")
    p.add_argument("--runs", type=int, default=None, help="samples")
    res = run(quick=p.parse_args(argv).quick, runs=p.parse_args(argv).runs)
    left = f", {res['left_out']} left out" if res["left_out"] else ""
    print(f"start-to-first-event, {res['samples']} samples{left} (median / p90 ms)\n")
    print("| | native client | durable mcp | ratio | SSE | ratio |\n|---|---|---|---|---|---|")
    for label, nat, mcp, ratio, sse, sse_ratio in (
            ("first event (native: first log entry; MCP: the task; SSE: first entry)",
             "native_first_entry", "mcp_task", "ratio_first_event", "sse_first_entry",
             "sse_ratio_first_event"),
            ("first step (native and SSE: step_decided read; MCP: progress)",
             "native_first_step", "mcp_first_step", "ratio_first_step", "sse_first_step",
             "sse_ratio_first_step")):
        print(f"| {label} | {res[nat]['median_ms']} / {res[nat]['p90_ms']} | "
              f"{res[mcp]['median_ms']} / {res[mcp]['p90_ms']} | x{res[ratio]} | "
              f"{res[sse]['median_ms']} / {res[sse]['p90_ms']} | x{res[sse_ratio]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
