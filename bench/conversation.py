"""Part of ``bench.styles``: what one call of a long conversation costs, early and late in it,
for each framework integration.

One worker process serves ``bench.framework_agents``' ``pai_talk`` (an unchanged pydantic-ai
``Agent`` made durable) or ``bench.openai_talk``'s ``oai_talk`` (the same conversation as an
OpenAI Agents SDK ``Agent``), whose model answers at once (``TALK_CALLS`` requests, each
reply some text and a call of the effect-free ``look`` tool, ~1 KB of conversation a call).
``ROUNDS`` runs one after the other, after a warm-up run. Per call (a model request and the
tool call it asks for), averaged over calls 1-10 ("early") and 91-100 ("late"), medians over
the rounds, and the ratio late / early:

- wall: from one model step's intent to the next one's (the last call's to the run's last
  entry), from the run's log, on the server's clock;
- the worker's CPU: its process time (every thread) at each step's intent and outcome, read
  in the worker by a step hook (``CpuStamps``).

Beside them, the same agent run plainly in this process (``asyncio``, the worker's collector
setting): the framework's own CPU per call early and late, which grows with the conversation
too (each framework looks through the whole history at each request); the worker's CPU less
it is what durability adds per call.

    python -m bench.conversation      # both frameworks, printed as the styles report has them
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import redis
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from bench import framework_agents
from bench.common import fresh, median, ms_of, settings_for
from durable.client import Client
from durable.log import events as ev
from durable.log import keys
from durable.testing import Worker

ROUNDS = 5
EARLY = (1, 10)
LATE = (91, 100)
ROOT = Path(__file__).resolve().parent.parent
#: The conversation's agent of each framework, and the worker's agent modules for it.
TALKERS = {"pydantic-ai": ("pai_talk", "bench.framework_agents"),
           "OpenAI Agents SDK": ("oai_talk", "bench.openai_talk")}


class CpuStamps:
    """A worker hook (``durable worker --hook bench.conversation:CpuStamps=PATH``): the
    process's CPU seconds at each step's intent and outcome, ``{run: {"i<step>": s,
    "o<step>": s}}``, written to ``PATH`` every 50 ms from a thread and at exit."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.stamps: dict[str, dict[str, float]] = {}
        threading.Thread(target=self._loop, name="bench-cpu", daemon=True).start()
        atexit.register(self._write)

    def after_intent(self, run_id: str, step: int) -> None:
        self.stamps.setdefault(run_id, {})[f"i{step}"] = time.process_time()

    def after_outcome(self, run_id: str, step: int) -> None:
        self.stamps.setdefault(run_id, {})[f"o{step}"] = time.process_time()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({run: dict(s) for run, s in list(self.stamps.items())}))
        os.replace(tmp, self.path)

    def _loop(self) -> None:
        while True:
            time.sleep(0.05)
            with contextlib.suppress(OSError, RuntimeError):
                self._write()


def _cpu_per_call(stamps: dict[str, float], model_steps: list[int], first: int,
                  last: int) -> float:
    """The worker's CPU ms per call over calls ``first``..``last``: call k begins at its
    model step's intent (``model_steps[k - 1]``) and ends with the outcome of the step
    before the next call's model step (the run's last step, for the conversation's last)."""
    begin = stamps[f"i{model_steps[first - 1]}"]
    end_step = model_steps[last] - 1 if last < len(model_steps) else max(
        int(k[1:]) for k in stamps if k.startswith("o"))
    end = stamps.get(f"o{end_step}")
    if end is None:
        raise RuntimeError(f"no CPU stamp for call {last}")
    return 1000 * (end - begin) / (last - first + 1)


def _per_call(times: list[float], first: int, last: int) -> float:
    """ms per call over calls ``first``..``last`` (1-based): ``times[k]`` is call k+1's
    start, and one more entry ends the last call."""
    return (times[last] - times[first - 1]) / (last - first + 1)


def durable_calls(url: str, r: redis.Redis, agents: str, rounds: int = ROUNDS,
                  log_dir: Path | None = None, agent: str = "pai_talk") -> dict[str, Any]:
    """``rounds`` conversations of ``agent`` on one fresh worker: per-call ms early and late
    (medians) and the worker's CPU per conversation."""
    log = (log_dir or Path(tempfile.mkdtemp(prefix="talk-"))) / f"{agent}-worker.log"
    cpu_path = log.with_suffix(".cpu.json")
    for p in (log, cpu_path):
        p.unlink(missing_ok=True)
    fresh(r)
    srv_client = Client(settings_for(url, agents=agents), r)
    worker = Worker(url, log_path=log, DURABLE_AGENTS=agents, PYTHONPATH=str(ROOT),
                    hooks=[f"bench.conversation:CpuStamps={cpu_path}"])
    early: list[float] = []
    late: list[float] = []
    cpu: list[float] = []
    runs: list[str] = []
    model_steps: dict[str, list[int]] = {}
    start = {"pai_talk": {"prompt": "go"}, "oai_talk": {"input": "go"}}[agent]
    try:
        if not worker.started(60):
            raise RuntimeError(f"the worker did not start: {log.read_text()[-2000:]}")
        proc = psutil.Process(worker.pid)
        if srv_client.wait(srv_client.start(agent, start, run_id="talk-warm").run_id,
                           120).state != "completed":
            raise RuntimeError("the warm-up conversation did not complete")
        for k in range(rounds):
            t0 = proc.cpu_times()
            run = srv_client.start(agent, start, run_id=f"talk-{k}").run_id
            final = srv_client.wait(run, 300)
            t1 = proc.cpu_times()
            if final.state != "completed" or final.model_calls != framework_agents.TALK_CALLS:
                raise RuntimeError(f"conversation {k}: {final.state} {final.error}")
            decided = [(e.id, e.event) for e in srv_client.events(run)
                       if isinstance(e.event, ev.StepDecided) and e.event.tool == f"{agent}.model"]
            model_steps[run] = [event.step for _, event in decided]
            times: list[float] = [ms_of(entry) for entry, _ in decided]
            times.append(ms_of(r.hget(keys.UNSHARDED.run(run), "last") or b"0-0"))
            early.append(_per_call(times, *EARLY))
            late.append(_per_call(times, *LATE))
            cpu.append(t1.user + t1.system - t0.user - t0.system)
            runs.append(run)
    finally:
        worker.stop()
    stamps = json.loads(cpu_path.read_text())
    cpu_early = [_cpu_per_call(stamps[run], model_steps[run], *EARLY) for run in runs]
    cpu_late = [_cpu_per_call(stamps[run], model_steps[run], *LATE) for run in runs]
    return {"early_ms": median(early), "late_ms": median(late),
            "late_over_early": median(late) / median(early), "rounds_early_ms": early,
            "rounds_late_ms": late, "worker_cpu_per_run_s": median(cpu),
            "cpu_early_ms": median(cpu_early), "cpu_late_ms": median(cpu_late),
            "cpu_late_over_early": median(cpu_late) / median(cpu_early)}


def plain_calls(rounds: int = ROUNDS, gc_threshold: int = 0) -> dict[str, Any]:
    """The same conversation run plainly in this process: pydantic-ai's CPU ms per call
    early and late (medians of ``rounds``), with the worker's collector setting."""
    stamps: list[float] = []

    async def stamped(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        stamps.append(time.process_time())
        return await framework_agents.talking_model(messages, info)

    async def one() -> list[float]:
        stamps.clear()
        await framework_agents.talker.run("go", model=FunctionModel(stamped),
                                          usage_limits=UsageLimits(request_limit=None))
        stamps.append(time.process_time())
        return [1000 * s for s in stamps]

    kept = gc.get_threshold()
    if gc_threshold:
        gc.collect()
        gc.set_threshold(gc_threshold, kept[1], kept[2])
    try:
        asyncio.run(one())  # warm-up
        runs = [asyncio.run(one()) for _ in range(rounds)]
    finally:
        gc.set_threshold(*kept)
    early = [_per_call(s, *EARLY) for s in runs]
    late = [_per_call(s, *LATE) for s in runs]
    return {"early_ms": median(early), "late_ms": median(late),
            "late_over_early": median(late) / median(early)}


def plain_openai_calls(rounds: int = ROUNDS, gc_threshold: int = 0) -> dict[str, Any]:
    """``plain_calls`` for the OpenAI Agents SDK's conversation (``bench.openai_talk``)."""
    from bench import openai_talk

    stamps: list[float] = []

    class Stamped(openai_talk.TalkingModel):
        async def get_response(self, *args: Any, **kwargs: Any) -> Any:
            stamps.append(time.process_time())
            return await super().get_response(*args, **kwargs)

    async def one() -> list[float]:
        stamps.clear()
        await openai_talk.plain_run(Stamped())
        stamps.append(time.process_time())
        return [1000 * s for s in stamps]

    kept = gc.get_threshold()
    if gc_threshold:
        gc.collect()
        gc.set_threshold(gc_threshold, kept[1], kept[2])
    try:
        asyncio.run(one())  # warm-up
        runs = [asyncio.run(one()) for _ in range(rounds)]
    finally:
        gc.set_threshold(*kept)
    early = [_per_call(s, *EARLY) for s in runs]
    late = [_per_call(s, *LATE) for s in runs]
    return {"early_ms": median(early), "late_ms": median(late),
            "late_over_early": median(late) / median(early)}


def added(res: dict[str, Any]) -> dict[str, float]:
    """What durability adds per call, early and late: the worker's CPU less pydantic-ai's."""
    d, p = res["durable"], res["plain"]
    early, late = d["cpu_early_ms"] - p["early_ms"], d["cpu_late_ms"] - p["late_ms"]
    return {"early_ms": early, "late_ms": late, "late_over_early": late / early}


def report(res: dict[str, Any], framework: str = "pydantic-ai") -> list[str]:
    d, p, a = res["durable"], res["plain"], added(res)
    return [f"\n**A {framework_agents.TALK_CALLS}-call {framework} conversation** (one "
            "worker, the model answering at once; per call: a model request and its tool "
            "call):\n",
            "| per call | calls 1-10 ms | calls 91-100 ms | late / early |",
            "|---|---:|---:|---:|",
            f"| durable, wall | {d['early_ms']:.1f} | {d['late_ms']:.1f} | "
            f"{d['late_over_early']:.2f} |",
            f"| durable, worker CPU ({d['worker_cpu_per_run_s']:.2f} s a run) | "
            f"{d['cpu_early_ms']:.2f} | {d['cpu_late_ms']:.2f} | "
            f"{d['cpu_late_over_early']:.2f} |",
            f"| plain {framework}, CPU (one process) | {p['early_ms']:.2f} | "
            f"{p['late_ms']:.2f} | {p['late_over_early']:.2f} |",
            f"| what durability adds, CPU (worker less plain) | {a['early_ms']:.2f} | "
            f"{a['late_ms']:.2f} | {a['late_over_early']:.2f} |", ""]


def both(url: str, r: redis.Redis, gc_threshold: int = 0,
         log_dir: Path | None = None) -> dict[str, dict[str, Any]]:
    """The conversation of each framework (``TALKERS``): durable on a worker, and plain."""
    out: dict[str, dict[str, Any]] = {}
    for framework, (agent, module) in TALKERS.items():
        plain = plain_calls if agent == "pai_talk" else plain_openai_calls
        out[framework] = {
            "durable": durable_calls(url, r, f"examples.agents,{module}", log_dir=log_dir,
                                     agent=agent),
            "plain": plain(gc_threshold=gc_threshold)}
    return out


def main() -> int:
    from durable.testing import Server

    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    server = Server(fsync="everysec").start()
    try:
        res = both(server.url, server.client())
    finally:
        server.stop()
    for framework, one in res.items():
        print("\n".join(report(one, framework)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
