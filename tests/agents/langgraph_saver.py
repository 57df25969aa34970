"""LangGraph's checkpointer conformance suite, run in a durable run on a real worker against
the run's own ``LogSaver`` (every entry the suite puts recorded as a ``<name>.checkpoint``
step of the run's log), then read back: a fresh saver loaded from the records the log holds
must answer every thread the suite left as the savers that wrote them do.

The agent ``lg_saver_conformance`` returns ``{"passed", "report", "threads", "differ"}``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.graph import START, StateGraph

from durable.code import AsyncRunContext
from durable.code import agent as code_agent
from durable.integrations.langgraph import DurableGraph, LogSaver
from durable.integrations.langgraph.binding import Binding
from durable.integrations.langgraph.saver import Entries
from tests.agents.langgraph_graphs import Work

# The graph is a vehicle: its DurableGraph owns the record step the suite's savers use.
_graph = StateGraph(Work)
_graph.add_node("noop", lambda state: state)
_graph.add_edge(START, "noop")
owner = DurableGraph(_graph.compile(), name="lg_saver_owner")


def shown(saver: LogSaver, thread: str) -> list[Any]:
    """What a saver answers of a thread: its checkpoints, newest first, in every namespace,
    with their values, metadata, parents and pending writes."""
    out = []
    for t in saver.list({"configurable": {"thread_id": thread}}):
        out.append((t.config["configurable"].get("checkpoint_ns"), t.checkpoint["id"],
                    t.checkpoint["channel_values"], t.checkpoint["channel_versions"],
                    t.metadata, t.parent_config, t.pending_writes))
    return sorted(out, key=str)


@code_agent("lg_saver_conformance", tools=(owner.record_step,))
async def conformance(ctx: AsyncRunContext, inp: Any) -> dict[str, Any]:
    b = Binding(owner, ctx, asyncio.get_running_loop())
    b.load()
    made: list[LogSaver] = []

    @checkpointer_test(name="LogSaver in a durable run")
    async def in_the_log() -> AsyncIterator[LogSaver]:
        saver = LogSaver(b)
        made.append(saver)
        yield saver

    report = await validate(in_the_log)
    await b.idle()  # every entry recorded
    back = LogSaver(Entries())
    for _, act in sorted(ctx.recorded_steps().items()):
        if act.tool == owner.record_step:
            for entry in act.result["entries"]:
                back.load(entry)
    threads = sorted({t for saver in made for t, _ in saver.checkpoints})
    live = {t: shown(s, t) for s in made for t in {k[0] for k in s.checkpoints}}
    differ = [t for t in threads if shown(back, t) != live[t]]
    return {"passed": report.passed_all_base(), "report": report.to_dict(),
            "threads": len(threads), "differ": differ}
