"""The pydantic-ai agent of ``bench.styles``: the styles' run (``steps`` waits of ``sleep_s``)
as an unchanged pydantic-ai ``Agent`` made durable (``durable.integrations.pydantic_ai``).

Its model is a pydantic-ai ``FunctionModel`` that takes ``SLEEP_S`` to answer, as a provider
would, and asks for the ``note`` tool (an ``async def`` pydantic-ai tool that answers at once)
until ``STEPS`` requests were made: each run is ``STEPS`` model requests of ``SLEEP_S`` with a
tool call between two of them, all steps of the run's log, so the ideal wall time is that of
the other styles. No network: the provider's latency is the model's sleep, and what the rows
measure is the integration and the worker.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from durable.integrations.pydantic_ai import DurableAgent, RunInput, StepOptions

#: Model requests per run, and how long each takes (``bench.iobound``'s steps and wait).
STEPS = 3
SLEEP_S = 0.5


class CountRun(RunInput):
    """The input every style's run is started with (``{"steps", "sleep_s"}``), read by the
    model as the module's constants: a prompt of its own."""

    prompt: str | list[object] | None = "count"
    steps: int = STEPS
    sleep_s: float = SLEEP_S


async def counting_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    await asyncio.sleep(SLEEP_S)
    done = sum(1 for m in messages if isinstance(m, ModelRequest) for p in m.parts
               if isinstance(p, ToolReturnPart))
    usage = RequestUsage(input_tokens=5, output_tokens=2)
    if done < STEPS - 1:
        return ModelResponse(parts=[ToolCallPart("note", {"n": done + 1})], usage=usage)
    return ModelResponse(parts=[TextPart(f"counted {done}")], usage=usage)


counter = Agent(FunctionModel(counting_model), name="pai_count")


@counter.tool_plain
async def note(n: int) -> int:
    """Note a number (effect-free)."""
    return n


durable_counter = DurableAgent(counter, tools={"note": StepOptions(effect_free=True)},
                               input_model=CountRun)


def plain(runs: int, gc_threshold: int = 0) -> dict[str, Any]:
    """The same agent run ``runs`` times at once with ``asyncio.gather`` in this process,
    without durability: what pydantic-ai itself costs (its CPU per run, on one core). With
    ``gc_threshold``, Python's collector is set as a worker sets it
    (``DURABLE_GC_THRESHOLD``) for the time of the runs: the fair comparison."""

    async def all_runs() -> None:
        await asyncio.gather(*(counter.run("count") for _ in range(runs)))

    kept = gc.get_threshold()
    if gc_threshold:
        gc.collect()
        gc.set_threshold(gc_threshold, kept[1], kept[2])
    try:
        cpu0, t0 = time.process_time(), time.perf_counter()
        asyncio.run(all_runs())
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        gc.set_threshold(*kept)
    return {"runs": runs, "wall_s": wall, "ratio_to_ideal": wall / (STEPS * SLEEP_S),
            "cpu_per_run_us": 1e6 * cpu / runs}


# A long conversation: ``TALK_CALLS`` model requests, each reply a tool call until the last,
# the model answering at once (what is measured is the step, not the provider).

#: Model requests of a conversation run (``bench.conversation``).
TALK_CALLS = 100
#: A reply's text and a tool result's size: the conversation grows by ~1 KB per call.
WORDS = "a model reply carries some text beside its tool call, as real ones do. " * 4


async def talking_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    done = sum(1 for m in messages if isinstance(m, ModelRequest) for p in m.parts
               if isinstance(p, ToolReturnPart))
    usage = RequestUsage(input_tokens=5, output_tokens=2)
    if done < TALK_CALLS - 1:
        return ModelResponse(parts=[TextPart(WORDS), ToolCallPart("look", {"n": done + 1})],
                             usage=usage)
    return ModelResponse(parts=[TextPart(f"looked {done} times")], usage=usage)


talker = Agent(FunctionModel(talking_model), name="pai_talk")


@talker.tool_plain
async def look(n: int) -> dict[str, Any]:
    """Look something up (effect-free): a result of ~0.5 KB."""
    return {"n": n, "found": WORDS[:200] + str(n)}


durable_talker = DurableAgent(talker, tools={"look": StepOptions(effect_free=True)})
