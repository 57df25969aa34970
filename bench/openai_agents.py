"""What durability costs an OpenAI Agents SDK agent: the same agent, against the same local
OpenAI-compatible server, run by the SDK's ``Runner.run`` in this process and as a durable
run (``durable.integrations.openai_agents``) driven by one real worker process.

    python -m bench.openai_agents            # 5 runs of each
    python -m bench.openai_agents --runs 20

The agent is ``tests.agents.openai_agents``' counter: 15 tool turns (16 model requests, 15
function tool calls, 31 steps), against a server that answers at once, so the difference is
the integration's and the runtime's overhead per step (log appends, ledger claims, the
function's hand-offs), not the model's latency. Reported: median wall time per run of each,
and the overhead per step.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.common import fresh, settings_for, worker
from durable.backend.embedded import free_port
from durable.client import Client
from durable.testing import Server, wait_for

AGENTS = "examples.agents,tests.agents.basic,tests.agents.openai_agents"
STEPS = 31


def _plain(runs: int) -> list[float]:
    """The SDK alone: one model (one HTTP client) for every run, as the durable worker keeps
    one per agent."""
    from agents import Runner

    from tests.agents import openai_agents as oa

    agent = oa._counter(15).clone(model=oa.LocalProvider().get_model("scripted"))

    async def timed() -> list[float]:
        out = []
        for _ in range(runs + 1):  # the first pays the imports and the connection
            start = time.perf_counter()
            result = await Runner.run(agent, "count", max_turns=100)
            out.append(time.perf_counter() - start)
            assert result.final_output == "counted 15", result.final_output
        return out[1:]

    return asyncio.run(timed())


def _durable(url: str, runs: int) -> list[float]:
    client = Client(settings_for(url, agents=AGENTS))
    proc = worker(url, DURABLE_AGENTS=AGENTS)
    out = []
    try:
        warm = client.start("oai_counter", {"input": "count"}, run_id="warm").run_id
        client.wait(warm, 120)  # the worker's first run pays its imports
        for i in range(runs):
            start = time.perf_counter()
            run = client.start("oai_counter", {"input": "count"}, run_id=f"b{i}").run_id
            state = client.wait(run, 120)
            out.append(time.perf_counter() - start)
            assert state.state == "completed" and state.result == "counted 15", state.state
    finally:
        proc.stop()
    return out


def run(runs: int = 5) -> dict[str, Any]:
    # The model server is a process of its own: in this one, its threads and the SDK's
    # event loop would take turns at the GIL for every request.
    port = free_port()
    openai = subprocess.Popen([sys.executable, "-m", "tests.servers.openai", str(port)])
    os.environ["TEST_OPENAI_URL"] = f"http://127.0.0.1:{port}/v1"
    wait_for(lambda: _listening(port), 30)
    os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
    server = Server(fsync="everysec").start()
    try:
        fresh(server.client())
        plain = _plain(runs)
        durable = _durable(server.url, runs)
    finally:
        server.stop()
        openai.terminate()
        openai.wait(10)
    p, d = statistics.median(plain), statistics.median(durable)
    return {"runs": runs, "steps": STEPS, "plain_s": p, "durable_s": d,
            "overhead_ms_per_step": (d - p) / STEPS * 1000}


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.openai_agents")
    parser.add_argument("--runs", type=int, default=5)
    res = run(parser.parse_args(argv).runs)
    print(f"OpenAI Agents SDK counter agent, {res['steps']} steps, median of {res['runs']}:")
    print(f"  Runner.run in process:  {res['plain_s'] * 1000:8.1f} ms")
    print(f"  durable run, 1 worker:  {res['durable_s'] * 1000:8.1f} ms")
    print(f"  overhead per step:      {res['overhead_ms_per_step']:8.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
