"""What one call of a long LangGraph conversation costs, early and late in it, durable and
plain (``python -m bench.langgraph_talk [--rounds N]``; the bench extra and the langgraph
extra installed).

The graph is LangGraph's prebuilt ReAct shape: a model node and a ``ToolNode`` in a loop,
over ``MessagesState``. Its chat model answers at once (a LangChain ``BaseChatModel`` of its
own, no I/O): ``CALLS`` requests, each reply some text and a call of the effect-free tool
``look``, then a last answer; the conversation grows by ~1 KB per call. One worker process
serves it as the durable agent ``lg_talk``; ``rounds`` runs one after the other, after a
warm-up run. Per call (a model request and the tool call it asks for), averaged over calls
1-10 ("early") and 91-100 ("late"), medians over the rounds:

- durable, wall: from one model step's intent to the next one's, from the run's log;
- durable, the worker's CPU: its process time (every thread) at each model step's intent,
  read in the worker by ``bench.conversation``'s step hook (``CpuStamps``);
- plain LangGraph, CPU: the same graph in this process without a checkpointer, and with
  LangGraph's ``InMemorySaver`` (its own durability), the process time at each request,
  the worker's collector setting. The worker's CPU less plain LangGraph's is what
  durability adds per call.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from bench.common import fresh, median, ms_of, settings_for
from durable.client import Client
from durable.integrations.langgraph import DurableGraph, StepOptions
from durable.log import events as ev
from durable.log import keys
from durable.settings import WorkerSettings
from durable.testing import Server, Worker

#: Model requests that each ask for a tool call (a last one answers).
CALLS = 100
ROUNDS = 3
EARLY = (1, 10)
LATE = (91, 100)
ROOT = Path(__file__).resolve().parent.parent
GC_THRESHOLD = WorkerSettings.model_fields["gc_threshold"].default
AGENTS = "bench.langgraph_talk"
_WORDS = "a model reply carries some text beside its tool call, as real ones do. " * 4

#: The process time at each request of the plain graph (``plain_calls``), when stamping.
_stamps: list[float] = []


class TalkingModel(BaseChatModel):
    """A chat model that answers at once: a tool call per request until ``CALLS``."""

    @property
    def _llm_type(self) -> str:
        return "talking"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        _stamps.append(time.process_time())
        done = sum(1 for m in messages if isinstance(m, ToolMessage))
        if done < CALLS:
            reply = AIMessage(_WORDS, tool_calls=[
                {"name": "look", "args": {"n": done + 1}, "id": f"call_{done + 1}"}])
        else:
            reply = AIMessage(f"looked {done} times")
        reply.usage_metadata = {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}
        return ChatResult(generations=[ChatGeneration(message=reply)])

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: Any = None, **kwargs: Any) -> ChatResult:
        return self._generate(messages, stop, run_manager, **kwargs)


@tool
async def look(n: int) -> dict[str, Any]:
    """Look something up (effect-free): a result of ~0.5 KB."""
    return {"n": n, "found": _WORDS[:200] + str(n)}


_model = TalkingModel()


async def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
    return {"messages": [await _model.ainvoke(state["messages"])]}


builder = StateGraph(MessagesState)
builder.add_node("agent", agent)
builder.add_node("tools", ToolNode([look]))
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", tools_condition)
builder.add_edge("tools", "agent")

talk = DurableGraph(builder.compile(), name="lg_talk", stream=False,
                    budgets={"model_calls": CALLS + 5},
                    tools={"look": StepOptions(effect_free=True)})

_INPUT: dict[str, Any] = {"input": {"messages": [{"role": "user", "content": "go"}]}}


def _per_call(times: list[float], first: int, last: int) -> float:
    """Per call over calls ``first``..``last`` (1-based): ``times[k]`` is call k+1's start."""
    return (times[last] - times[first - 1]) / (last - first + 1)


def durable_calls(url: str, rounds: int = ROUNDS) -> dict[str, Any]:
    """``rounds`` conversations on one fresh worker: wall and worker CPU per call, early
    and late (medians), the worker's CPU per conversation and the log's bytes."""
    tmp = Path(tempfile.mkdtemp(prefix="lg-talk-"))
    log, cpu_path = tmp / "worker.log", tmp / "worker.cpu.json"
    client = Client(settings_for(url, agents=AGENTS))
    fresh(client.redis)
    worker = Worker(url, log_path=log, DURABLE_AGENTS=AGENTS, PYTHONPATH=str(ROOT),
                    hooks=[f"bench.conversation:CpuStamps={cpu_path}"])
    wall: dict[str, list[float]] = {"early": [], "late": []}
    cpu: list[float] = []
    runs: list[str] = []
    log_bytes: list[int] = []
    try:
        if not worker.started(60):
            raise RuntimeError(f"the worker did not start: {log.read_text()[-2000:]}")
        proc = psutil.Process(worker.pid)
        if client.wait(client.start("lg_talk", _INPUT, run_id="lgt-warm").run_id,
                       300).state != "completed":
            raise RuntimeError("the warm-up conversation did not complete")
        for k in range(rounds):
            t0 = proc.cpu_times()
            run = client.start("lg_talk", _INPUT, run_id=f"lgt-{k}").run_id
            final = client.wait(run, 600)
            t1 = proc.cpu_times()
            if final.state != "completed" or final.model_calls != CALLS + 1:
                raise RuntimeError(f"conversation {k}: {final.state} {final.error}")
            times = [float(ms_of(e.id)) for e in client.events(run)
                     if isinstance(e.event, ev.StepDecided) and e.event.tool == "lg_talk.model"]
            wall["early"].append(_per_call(times, *EARLY))
            wall["late"].append(_per_call(times, *LATE))
            cpu.append(t1.user + t1.system - t0.user - t0.system)
            runs.append(run)
            log_bytes.append(int(client.redis.memory_usage(keys.UNSHARDED.log(run)) or 0))
    finally:
        worker.stop()
    stamps = json.loads(cpu_path.read_text())
    per: dict[str, list[float]] = {"early": [], "late": []}
    for run in runs:
        models = [1000 * stamps[run][f"i{s}"] for s in sorted(_model_steps(client, run))]
        per["early"].append(_per_call(models, *EARLY))
        per["late"].append(_per_call(models, *LATE))
    return {"early_ms": median(wall["early"]), "late_ms": median(wall["late"]),
            "cpu_early_ms": median(per["early"]), "cpu_late_ms": median(per["late"]),
            "worker_cpu_per_run_s": median(cpu), "log_bytes_per_run": median(log_bytes)}


def _model_steps(client: Client, run: str) -> set[int]:
    return {e.event.step for e in client.events(run)
            if isinstance(e.event, ev.StepDecided) and e.event.tool == "lg_talk.model"}


def plain_calls(rounds: int = ROUNDS, saver: bool = False) -> dict[str, Any]:
    """The same graph in this process (no durability; with ``saver``, LangGraph's
    ``InMemorySaver``): its CPU ms per call early and late (medians of ``rounds``), with
    the worker's collector setting."""
    graph = builder.compile(checkpointer=InMemorySaver() if saver else None)

    async def one(k: int) -> list[float]:
        _stamps.clear()
        config: Any = {"configurable": {"thread_id": f"plain-{k}"},
                       "recursion_limit": 2 * CALLS + 10}
        await graph.ainvoke(_INPUT["input"], config)
        return [1000 * s for s in _stamps]

    kept = gc.get_threshold()
    gc.collect()
    gc.set_threshold(GC_THRESHOLD, kept[1], kept[2])
    try:
        asyncio.run(one(-1))  # warm-up
        runs = [asyncio.run(one(k)) for k in range(rounds)]
    finally:
        gc.set_threshold(*kept)
    return {"early_ms": median([_per_call(s, *EARLY) for s in runs]),
            "late_ms": median([_per_call(s, *LATE) for s in runs])}


def report(d: dict[str, Any], plain: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    rows = [("durable, wall", d["early_ms"], d["late_ms"]),
            (f"durable, worker CPU ({d['worker_cpu_per_run_s']:.2f} s a run)",
             d["cpu_early_ms"], d["cpu_late_ms"]),
            ("plain LangGraph, CPU (no checkpointer)", plain["early_ms"], plain["late_ms"]),
            ("plain LangGraph + InMemorySaver, CPU", saved["early_ms"], saved["late_ms"]),
            ("what durability adds, CPU (worker less plain)",
             d["cpu_early_ms"] - plain["early_ms"], d["cpu_late_ms"] - plain["late_ms"])]
    out = [f"A {CALLS}-call LangGraph conversation (model node + ToolNode loop, the model "
           "answering at once); per call: a model request and its tool call.", "",
           "| per call | calls 1-10 ms | calls 91-100 ms | late / early |",
           "|---|---:|---:|---:|"]
    out += [f"| {name} | {e:.2f} | {late:.2f} | {late / e:.2f} |" for name, e, late in rows]
    out.append(f"\nthe run's log: {d['log_bytes_per_run'] / 1024:.0f} KB (Redis MEMORY USAGE)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    plain, saved = plain_calls(args.rounds), plain_calls(args.rounds, saver=True)
    with Server(fsync="everysec") as srv:
        durable = durable_calls(srv.url, args.rounds)
    print("\n".join(report(durable, plain, saved)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
