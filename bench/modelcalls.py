"""``python -m bench.modelcalls [--quick] [--calls N] [--rounds N]``: what the built-in
``chat`` step costs a worker per model call (not part of ``python -m bench``; about 30 s,
its own embedded server).

One worker process (embedded Redis, AOF ``everysec``), the tests' local model server
(``tests.servers.model``: a thread of this process, plain HTTP/1.1 on a loopback port,
answering at once) and the tests' ``model_looper`` code agent (``tests.agents.model_steps``):
``calls`` cycles of a ``chat`` step and a tool step (``noop``), the conversation growing.
One run per round, after a warm-up run (the worker's imports, its first connection).
Measured per round, on the worker process: the CPU seconds it used (user + system) from
the run's start to its end, the run's wall time, and the TCP connections the model server
opened. On a shared machine the wall time moves with the neighbours' load; the CPU time
is the worker's own. After the rounds, the worker's CPU while it holds no run (its beats and
polls), for scale.

Beside them, in this process: the CPU of making (and closing) one ``httpx.AsyncClient``, the
SSL context it builds whatever the URL's scheme included: what the step paid per call while
it made a client for each.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.common import fresh, settings_for
from durable.client import Client
from durable.testing import Server, Worker
from tests.servers.model import ModelServer

AGENTS = "examples.agents,tests.agents.model_steps"
AGENT = "model_looper"
#: How long the worker's idle CPU is read (s).
IDLE_S = 3.0


def client_cost_ms(n: int = 20) -> float:
    """CPU ms to make and close one ``httpx.AsyncClient`` with its defaults (median of ``n``)."""
    import httpx

    async def one() -> float:
        start = time.process_time()
        http = httpx.AsyncClient()
        await http.aclose()
        return (time.process_time() - start) * 1000

    async def many() -> list[float]:
        return [await one() for _ in range(n)]

    return statistics.median(asyncio.run(many()))


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def run(calls: int = 100, rounds: int = 5) -> dict[str, Any]:
    model = ModelServer(tokens=20).start()
    srv = Server(fsync="everysec").start()
    log = Path(tempfile.mkdtemp(prefix="modelcalls-")) / "worker.log"
    proc: Worker | None = None
    try:
        fresh(srv.client())
        client = Client(settings_for(srv.url, agents=AGENTS))
        proc = Worker(srv.url, log_path=log, DURABLE_AGENTS=AGENTS,
                      DURABLE_MODEL_BASE_URL=model.url)
        if not proc.started(60):
            raise RuntimeError(f"the worker did not start: {log.read_text()[-2000:]}")
        worker = psutil.Process(proc.pid)
        warm = client.start(AGENT, {"calls": 5}, run_id="warm").run_id
        if client.wait(warm, 120).state != "completed":
            raise RuntimeError("the warm-up run did not complete")
        out: list[dict[str, float]] = []
        for k in range(rounds):
            connections = model.connections
            cpu, wall = _cpu_s(worker), time.perf_counter()
            run_id = client.start(AGENT, {"calls": calls}, run_id=f"r{k}").run_id
            final = client.wait(run_id, 300)
            wall, cpu = time.perf_counter() - wall, _cpu_s(worker) - cpu
            if final.state != "completed" or final.model_calls != calls:
                raise RuntimeError(f"round {k}: {final.state} {final.error}")
            out.append({"cpu_s": cpu, "wall_s": wall,
                        "connections": model.connections - connections})
        cpu = _cpu_s(worker)
        time.sleep(IDLE_S)
        idle_ms_per_s = (_cpu_s(worker) - cpu) / IDLE_S * 1000
    finally:
        if proc is not None:
            proc.stop()
        srv.stop()
        model.stop()
    return {"calls": calls, "rounds": out, "idle_ms_per_s": idle_ms_per_s,
            "client_ms": client_cost_ms()}


def markdown(res: dict[str, Any]) -> str:
    calls, rounds = res["calls"], res["rounds"]
    lines = [f"## Model calls: {calls} cycles (a `chat` step, then a tool step) per run, "
             f"one worker\n",
             "| round | worker CPU (s) | CPU per cycle (ms) | wall per cycle (ms) | "
             "connections opened |", "|---|---:|---:|---:|---:|"]

    def row(name: str, cpu: float, wall: float, conns: float) -> str:
        return (f"| {name} | {cpu:.2f} | {cpu / calls * 1000:.1f} | "
                f"{wall / calls * 1000:.1f} | {conns:g} |")

    for k, r in enumerate(rounds):
        lines.append(row(str(k + 1), r["cpu_s"], r["wall_s"], r["connections"]))
    lines.append(row("median", *(statistics.median(r[f] for r in rounds)
                                 for f in ("cpu_s", "wall_s", "connections"))))
    lines.append(f"\nThe worker holding no run: {res['idle_ms_per_s']:.1f} ms of CPU per second. "
                 f"One `httpx.AsyncClient` made and closed (its SSL context): "
                 f"{res['client_ms']:.1f} ms of CPU (median of 20, this process).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.modelcalls", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="20 calls, 2 rounds")
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    calls, rounds = (20, 2) if args.quick else (args.calls, args.rounds)
    print(markdown(run(calls, rounds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
