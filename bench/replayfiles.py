"""``python -m bench.replayfiles [--steps N] [--rounds N]``: what replaying a saved run
offline costs (``durable.testing.replay_file``; not part of ``python -m bench``; about
20 s, its own embedded server).

Two runs of ``steps`` steps are recorded by one worker process (embedded Redis, AOF
``everysec``): the tests' ``model_looper`` code agent (``tests.agents.model_steps``: a
``chat`` step against the tests' local model server, then a tool step, the conversation
growing) and the ``count`` ``decide()`` agent (``examples.agents``); and, when pydantic-ai
is installed, a run of the tests' ``pai_long`` agent (``tests.agents.pydantic_ai_long``:
100 model requests of a ``FunctionModel``, 99 tool calls; 199 steps). Each is exported with
``durable export RUN --saved`` (gzip), the server and the model are stopped, and each file
is replayed ``rounds`` times in this process against the agents imported here: the wall and
CPU time of reading the file and replaying it, and of the replay alone, per 100 steps
(median of the rounds; the first round pays the agents' first execution).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import fresh, settings_for
from durable.audit.offline import load, replay_saved
from durable.cli import main as cli
from durable.client import Client
from durable.testing import Server, Worker
from tests.servers.model import ModelServer

AGENTS = "examples.agents,tests.agents.model_steps"
#: The pydantic-ai agent's module, when pydantic-ai is installed.
PYDANTIC_AI = "tests.agents.pydantic_ai_long"


def record(steps: int, folder: Path) -> dict[str, Path]:
    """Record a code agent's run and a ``decide()`` agent's, of ``steps`` steps each; the
    paths of their saved files by agent."""
    model = ModelServer(tokens=20).start()
    srv = Server(fsync="everysec").start()
    proc: Worker | None = None
    agents = AGENTS + ("," + PYDANTIC_AI if importlib.util.find_spec("pydantic_ai") else "")
    try:
        fresh(srv.client())
        os.environ.update(DURABLE_REDIS_URL=srv.url,  # the export command's
                          TEST_DB=str(folder / "world.sqlite"), TEST_DB_DEDUPE="0")
        settings = settings_for(srv.url, agents=agents)
        client = Client(settings)
        proc = Worker(srv.url, DURABLE_AGENTS=agents, DURABLE_MODEL_BASE_URL=model.url)
        runs = {"model_looper": client.start("model_looper", {"calls": steps // 2}).run_id,
                "count": client.start("count", {"steps": steps}).run_id}
        if PYDANTIC_AI in agents:
            runs["pai_long"] = client.start("pai_long", {"prompt": "count"}).run_id
        files = {}
        for agent, run in runs.items():
            final = client.wait(run, 300)
            if final.state != "completed":
                raise RuntimeError(f"{agent}: {final.state} {final.error}")
            files[agent] = folder / f"{agent}.jsonl.gz"
            if cli(["export", run, "--saved", "-o", str(files[agent])]) != 0:
                raise RuntimeError(f"the export of {run} failed")
        return files
    finally:
        if proc is not None:
            proc.stop()
        srv.stop()
        model.stop()


def measure(path: Path, rounds: int) -> dict[str, Any]:
    out = []
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        saved = load(path)
        verdict = replay_saved(saved)
        if not verdict.ok:
            raise RuntimeError(f"{path}: {verdict.detail}")
        out.append({"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
                    "replay_s": verdict.seconds, "steps": verdict.steps})
    return {"rounds": out, "bytes": path.stat().st_size}


def run(steps: int = 100, rounds: int = 5) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="replayfiles-"))
    files = record(steps, folder)
    return {agent: measure(path, rounds) for agent, path in files.items()}


def markdown(res: dict[str, Any]) -> str:
    lines = ["## Saved runs replayed offline (per 100 steps, median of the rounds)\n",
             "| agent | steps | file (bytes, gzip) | read + replay wall (ms) | CPU (ms) | "
             "replay alone (ms) | first round wall (ms) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for agent, r in res.items():
        rounds = r["rounds"]
        steps = rounds[0]["steps"]
        per = 100 / steps * 1000

        def med(field: str, rounds: list[dict[str, Any]] = rounds) -> float:
            return float(statistics.median(x[field] for x in rounds))

        lines.append(f"| {agent} | {steps} | {r['bytes']} | {med('wall_s') * per:.1f} | "
                     f"{med('cpu_s') * per:.1f} | {med('replay_s') * per:.1f} | "
                     f"{rounds[0]['wall_s'] * per:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.replayfiles", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    print(markdown(run(args.steps, args.rounds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
