"""LangGraph graphs run as durable runs, for the tests (worker processes import this module
through ``DURABLE_AGENTS``). Their chat model is langchain-openai's ``ChatOpenAI`` against
the local OpenAI-compatible server of ``tests.servers.openai`` (``TEST_OPENAI_URL``), which
counts every request by its ``Idempotency-Key``; the server's script answers by the system
message, as it does for the OpenAI Agents SDK's tests.

The tools write their effects into the SQLite table of ``tests.servers.effects`` (one row per
application, keyed by the step's idempotency key, no unique key when ``TEST_DB_DEDUPE=0``):
an effect applied twice shows.
"""

from __future__ import annotations

import os
import time
from functools import cache
from typing import Any, TypedDict

from langchain_core.messages import AnyMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.config import get_config, get_stream_writer
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import RetryPolicy, interrupt

from durable.code import StepFailed
from durable.integrations.langgraph import DurableGraph, StepOptions, step_context
from tests.servers.effects import effects_db
from tests.servers.integration_world import book_lookup, refund_lookup
from tests.servers.integration_world import effect as _effect


@cache
def _llm(url: str) -> ChatOpenAI:
    return ChatOpenAI(model="scripted", base_url=url, api_key="test",  # type: ignore[arg-type]
                      max_retries=0)


def llm() -> ChatOpenAI:
    """The scripted model (made in the process that sends the requests)."""
    return _llm(os.environ["TEST_OPENAI_URL"])


@tool
def book(slot: int) -> dict[str, Any]:
    """Book a slot (an effect in the outside world)."""
    return _effect(f"slot {slot}")


@tool
async def note(text: str) -> str:
    """Leave a note (effect-free, async)."""
    return f"noted {text} ({step_context().key})"


# A tool-calling agent (the prebuilt ReAct shape): the model books slot 1, then slot 2 and
# leaves a note (two tool calls at once), then answers from what the tools returned.

BOOKER = SystemMessage("booker: book the slots asked for.")


async def booker_model(state: MessagesState) -> dict[str, list[AnyMessage]]:
    reply = await llm().bind_tools([book, note]).ainvoke([BOOKER, *state["messages"]])
    return {"messages": [reply]}


_booker = StateGraph(MessagesState)
_booker.add_node("agent", booker_model)
_booker.add_node("tools", ToolNode([book, note]))
_booker.add_edge(START, "agent")
_booker.add_conditional_edges("agent", tools_condition)
_booker.add_edge("tools", "agent")

booker = DurableGraph(_booker.compile(), name="lg_booker", budgets={"model_calls": 10}, tools={
    "book": StepOptions(timeout_s=2.0, lookup=book_lookup),
    "note": StepOptions(effect_free=True),
})


# One node that does everything: a model request, a booking, an interrupt() answered by a
# human, then (when the answer is "yes") a second booking: LangGraph runs the node again
# from its start once the interrupt is answered (its request and first booking come back
# from the log).


class Work(TypedDict, total=False):
    story: str
    booked: list[str]
    answer: Any


async def work(state: Work) -> Work:
    reply = await llm().ainvoke([SystemMessage("storyteller: tell a story."),
                                 HumanMessage("a story")])
    first = await book.ainvoke({"slot": 1})
    answer = interrupt({"question": "book slot 2 too?", "booked": first["done"]})
    done = [first["done"]]
    if answer == "yes":
        done.append((await book.ainvoke({"slot": 2}))["done"])
    return {"story": str(reply.content), "booked": done, "answer": answer}


def wrap_up(state: Work) -> Work:
    return {"booked": [*state.get("booked", []), "wrapped"]}


_worker = StateGraph(Work)
_worker.add_node("work", work)
_worker.add_node("wrap_up", wrap_up)
_worker.add_edge(START, "work")
_worker.add_edge("work", "wrap_up")
_worker.add_edge("wrap_up", END)

asker = DurableGraph(_worker.compile(), name="lg_asker", tools={
    "book": StepOptions(timeout_s=2.0, lookup=book_lookup)})


# The same node without the interrupt: a model request and two bookings in one node, the
# window a SIGKILL mid-node hits.


def ran(node: str, config: RunnableConfig) -> None:
    """Count an execution of a node's own code (not a step: no key of its own)."""
    conn = effects_db()
    try:
        conn.execute("INSERT INTO effects VALUES (?, ?)",
                     (f"ran:{node}:{config['configurable']['thread_id']}", time.time()))
    finally:
        conn.close()


async def two_bookings(state: Work, config: RunnableConfig) -> Work:
    ran("work", config)
    reply = await llm().ainvoke([SystemMessage("storyteller: tell a story."),
                                 HumanMessage("a story")])
    done = [(await book.ainvoke({"slot": n}))["done"] for n in (1, 2)]
    return {"story": str(reply.content), "booked": done}


_busy = StateGraph(Work)
_busy.add_node("work", two_bookings)
_busy.add_node("wrap_up", wrap_up)
_busy.add_edge(START, "work")
_busy.add_edge("work", "wrap_up")
_busy.add_edge("wrap_up", END)

busy = DurableGraph(_busy.compile(), name="lg_busy", tools={
    "book": StepOptions(timeout_s=2.0, lookup=book_lookup)})


# A storyteller whose one reply streams forty words to the run's followers.


async def tell(state: MessagesState) -> dict[str, list[AnyMessage]]:
    get_stream_writer()({"telling": "a story"})  # a custom chunk, for the followers
    reply = await llm().ainvoke([SystemMessage("storyteller: tell a story."),
                                 *state["messages"]])
    return {"messages": [reply]}


_teller = StateGraph(MessagesState)
_teller.add_node("tell", tell)
_teller.add_edge(START, "tell")
_teller.add_edge("tell", END)

storyteller = DurableGraph(_teller.compile(), name="lg_storyteller")


# The functional API: an entrypoint that asks a task for a story (a model request), books a
# slot in a synchronous task (a tool step inside a task), stamps the booking in a task whose
# effect is its own code (LangGraph's way: side effects in tasks), asks a human, then books a
# second slot. Every node's and task's code counts its executions.


def ran_here(what: str) -> None:
    """Count an execution of a task's or entrypoint's code in the current run."""
    ran(what, get_config())


@task
async def tell_story() -> str:
    ran_here("tell_story")
    reply = await llm().ainvoke([SystemMessage("storyteller: tell a story."),
                                 HumanMessage("a story")])
    return str(reply.content)


@task
def book_slot(slot: int) -> str:
    ran_here("book_slot")
    return str(book.invoke({"slot": slot})["done"])


@task
async def stamp(what: str) -> str:
    ran_here("stamp")  # the task's own effect: applied again if the task ran again
    return f"stamped {what}"


@entrypoint()
async def plan(inp: dict[str, Any]) -> dict[str, Any]:
    ran_here("plan")
    story = await tell_story()
    first = await book_slot(1)
    stamped = await stamp(first)
    answer = interrupt({"question": "book slot 2 too?", "booked": first})
    done = [first]
    if answer == "yes":
        done.append(await book_slot(2))
    return {"story": story, "booked": done, "answer": answer, "stamped": stamped}


planner = DurableGraph(plan, name="lg_planner", tools={
    "book": StepOptions(timeout_s=2.0, lookup=book_lookup)})


# A refund agent whose tool needs a signed approval (``StepOptions(requires_approval=True)``,
# the role "finance"); the model reports what happened. Its model node is synchronous
# (``invoke``, on the thread LangGraph runs it on).


@tool
def refund(order: str, cents: int) -> dict[str, Any]:
    """Refund an order (needs a human's approval)."""
    return _effect(f"refund {order} {cents}")


def refunder_model(state: MessagesState) -> dict[str, list[AnyMessage]]:
    reply = llm().bind_tools([refund]).invoke(
        [SystemMessage("refunder: refund what is asked."), *state["messages"]])
    return {"messages": [reply]}


_refunder = StateGraph(MessagesState)
_refunder.add_node("agent", refunder_model)
_refunder.add_node("tools", ToolNode([refund]))
_refunder.add_edge(START, "agent")
_refunder.add_conditional_edges("agent", tools_condition)
_refunder.add_edge("tools", "agent")

refunder = DurableGraph(_refunder.compile(), name="lg_refunder", tools={
    "refund": StepOptions(timeout_s=2.0, lookup=refund_lookup, requires_approval=True,
                          approver_role="finance")})


# Two nodes of one superstep (a fan-out), each asking the model, then a node joining them.


class Pair(TypedDict, total=False):
    left: str
    right: str
    joined: str


async def left(state: Pair) -> Pair:
    reply = await llm().ainvoke([SystemMessage("storyteller: tell a story."),
                                 HumanMessage("left")])
    return {"left": str(reply.content)[:11]}


async def right(state: Pair) -> Pair:
    reply = await llm().ainvoke([SystemMessage("storyteller: tell a story."),
                                 HumanMessage("right")])
    return {"right": str(reply.content)[-6:]}


def join(state: Pair) -> Pair:
    return {"joined": f"{state['left']}|{state['right']}"}


_fan = StateGraph(Pair)
_fan.add_node("left", left)
_fan.add_node("right", right)
_fan.add_node("join", join)
_fan.add_edge(START, "left")
_fan.add_edge(START, "right")
_fan.add_edge(["left", "right"], "join")
_fan.add_edge("join", END)

fan_out = DurableGraph(_fan.compile(), name="lg_fan_out")


# A node that calls a tool the DurableGraph was not told of: refused, naming it.


async def unlisted(state: Work) -> Work:
    return {"story": await note.ainvoke({"text": "hi"})}


_unlisted = StateGraph(Work)
_unlisted.add_node("unlisted", unlisted)
_unlisted.add_edge(START, "unlisted")

undeclared = DurableGraph(_unlisted.compile(), name="lg_undeclared")


# A node that streams its model's reply itself (``astream``): one step, the tokens going to
# the run's followers from the step.


async def stream_story(state: MessagesState) -> dict[str, list[AnyMessage]]:
    reply: Any = None
    async for chunk in llm().astream([SystemMessage("storyteller: tell a story."),
                                      *state["messages"]]):
        reply = chunk if reply is None else reply + chunk
    return {"messages": [reply]}


_streamer = StateGraph(MessagesState)
_streamer.add_node("tell", stream_story)
_streamer.add_edge(START, "tell")

streamer = DurableGraph(_streamer.compile(), name="lg_streamer")


# A counter: one tool turn per count, past LangGraph's default of 25 supersteps (two per
# turn), with plain (not streamed) requests.


@tool
def tick(n: int) -> str:
    """Count one."""
    return f"tick {n}"


async def counter_model(state: MessagesState) -> dict[str, list[AnyMessage]]:
    reply = await llm().bind_tools([tick]).ainvoke([SystemMessage("counter 15"),
                                                    *state["messages"]])
    return {"messages": [reply]}


_counter = StateGraph(MessagesState)
_counter.add_node("agent", counter_model)
_counter.add_node("tools", ToolNode([tick]))
_counter.add_edge(START, "agent")
_counter.add_conditional_edges("agent", tools_condition)
_counter.add_edge("tools", "agent")

counter = DurableGraph(_counter.compile(), name="lg_counter", stream=False,
                       budgets={"model_calls": 20}, tools={"tick": StepOptions(effect_free=True)})


# A node LangGraph retries (its RetryPolicy) after its booking failed: the retry is the
# node's code run again, as LangGraph runs it (its model request and its booking sent again,
# each a step of its own).


@tool
def flaky_book(slot: int) -> dict[str, Any]:
    """Book a slot; the booking service refuses the first try of each run."""
    step = step_context()
    conn = effects_db()
    try:
        tries = conn.execute("SELECT COUNT(*) FROM effects WHERE key LIKE ?",
                             (f"try:{step.run_id}:%",)).fetchone()[0]
        conn.execute("INSERT INTO effects VALUES (?, ?)", (f"try:{step.key}", time.time()))
    finally:
        conn.close()
    if not tries:
        raise ValueError("the booking service is busy")
    return _effect(f"slot {slot}")


async def book_after_story(state: Work) -> Work:
    reply = await llm().ainvoke([SystemMessage("storyteller: tell a story."),
                                 HumanMessage("a story")])
    done = await flaky_book.ainvoke({"slot": 1})
    return {"story": str(reply.content), "booked": [done["done"]]}


_retrying = StateGraph(Work)
_retrying.add_node("work", book_after_story,
                   retry_policy=RetryPolicy(max_attempts=2, initial_interval=0.01,
                                            retry_on=StepFailed))
_retrying.add_edge(START, "work")

retrying = DurableGraph(_retrying.compile(), name="lg_retrying", tools={
    "flaky_book": StepOptions(timeout_s=2.0, lookup=book_lookup)})


# A graph that never stops: LangGraph's recursion limit (here 4 supersteps) ends it.


def again(state: Work) -> Work:
    return {"story": state.get("story", "") + "."}


_looper = StateGraph(Work)
_looper.add_node("again", again)
_looper.add_edge(START, "again")
_looper.add_edge("again", "again")

looper = DurableGraph(_looper.compile(), name="lg_looper", recursion_limit=4)
