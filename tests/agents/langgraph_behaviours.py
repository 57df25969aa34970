"""LangGraph behaviours taken from LangGraph's own tests (``libs/langgraph/tests``:
``test_pregel_async.py``'s interrupts, functional API, retries, stream writer; the graphs
of other shapes are in ``tests.agents.langgraph_topologies``), each a graph that counts how
often its nodes' and tasks' code runs, registered in ``BEHAVIOURS``. Each is
registered as a durable agent (``lg_<name>``) for the workers, and run by the tests in their
own process under LangGraph's ``InMemorySaver`` too, for the reference: the same answers must
give the same result and the same counts.

A count is a row ``ran:<what>:<thread>`` of the effects database (``tests.servers.effects``):
the thread is the run's id in a durable run, the reference's own otherwise.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, TypedDict

from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.config import get_config, get_stream_writer
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph
from langgraph.pregel import Pregel
from langgraph.types import RetryPolicy, interrupt

from durable.integrations.langgraph import DurableGraph
from tests.agents.langgraph_graphs import llm
from tests.servers.effects import effects_db


def count(what: str) -> None:
    """Count one execution of ``what`` in the current thread (run)."""
    thread = get_config()["configurable"]["thread_id"]
    conn = effects_db()
    try:
        conn.execute("INSERT INTO effects VALUES (?, ?)", (f"ran:{what}:{thread}", time.time()))
    finally:
        conn.close()


async def echo(word: str) -> str:
    """A model request (a step in a durable run): the model says ``word`` back."""
    reply = await llm().ainvoke([SystemMessage("echo"), HumanMessage(word)])
    return str(reply.content)


@dataclass(frozen=True)
class Behaviour:
    """A graph, the input it is given and the answers its interrupts get, in order."""

    graph: Pregel[Any, Any, Any, Any]
    input: Any
    answers: list[Any] = field(default_factory=list)


BEHAVIOURS: dict[str, Behaviour] = {}


def behaviour(name: str, graph: Pregel[Any, Any, Any, Any], input: Any,
              answers: list[Any] | None = None, **options: Any) -> None:
    BEHAVIOURS[name] = Behaviour(graph, input, list(answers or []))
    DurableGraph(graph, name=f"lg_{name}", **options)


# test_interrupt_loop: a node asks until the answer is valid (it runs once per answer, and
# once more first).


class Age(TypedDict, total=False):
    age: int
    other: str


async def ask_age(state: Age) -> Age:
    count("ask_age")
    question, value = "How old are you?", None
    for _ in range(10):
        value = interrupt(question)
        if not str(value).isdigit() or int(value) < 18:
            question, value = "invalid response", None
        else:
            break
    return {"age": int(str(value))}


behaviour("interrupt_loop", StateGraph(Age).add_node("node", ask_age)
          .add_edge(START, "node").compile(), {"other": ""}, ["13", "15", "19"])


# test_node_before_multiple_interrupt_cycles_graph_api, with a @task in the interrupting
# node and a model request before the interrupts: the task and the request each happen once.


class Cycles(TypedDict, total=False):
    count: int
    data: str


@task
async def add_ten(n: int) -> int:
    count("add_ten")
    return n + 10


def prepare(state: Cycles) -> Cycles:
    count("prepare")
    return {"count": state["count"] + 1}


async def multi_interrupt(state: Cycles) -> Cycles:
    count("multi_interrupt")
    base = await add_ten(state["count"])
    said = await echo("before")
    first = interrupt("First question?")
    second = interrupt("Second question?")
    return {"count": base, "data": f"{said}:{first},{second}"}


behaviour("interrupt_cycles", StateGraph(Cycles).add_node("prepare", prepare)
          .add_node("multi_interrupt", multi_interrupt).add_edge(START, "prepare")
          .add_edge("prepare", "multi_interrupt").add_edge("multi_interrupt", END).compile(),
          {"count": 0, "data": ""}, ["first", "second"])


# test_interrupt_functional and test_interrupt_task_functional: tasks around an interrupt
# in the entrypoint, and an interrupt inside a task.


@task
async def foo(state: dict[str, Any]) -> dict[str, Any]:
    count("foo")
    return {"a": state["a"] + "foo"}


@task
async def bar(state: dict[str, Any]) -> dict[str, Any]:
    count("bar")
    return {"a": state["a"] + "bar", "b": state["b"]}


@entrypoint()
async def interrupt_functional(inputs: dict[str, Any]) -> dict[str, Any]:
    count("entrypoint")
    foo_result = await foo(inputs)
    value = interrupt("Provide value for bar:")
    done: dict[str, Any] = await bar({**foo_result, "b": value})
    return done


behaviour("interrupt_functional", interrupt_functional, {"a": ""}, ["bar"])


@task
async def asks(state: dict[str, Any]) -> dict[str, Any]:
    count("asks")
    value = interrupt("Provide value for bar:")
    return {"a": state["a"] + value}


@entrypoint()
async def interrupt_in_task(inputs: dict[str, Any]) -> dict[str, Any]:
    count("entrypoint")
    done: dict[str, Any] = await asks(await foo(inputs))
    return done


behaviour("interrupt_in_task", interrupt_in_task, {"a": ""}, ["bar"])


# test_task_before_interrupt_resume: a task, then an interrupting task per topic.


@task
async def setup(n: int) -> int:
    count("setup")
    return n


@task
async def ask(question: str) -> str:
    count("ask")
    return str(interrupt(question))


@entrypoint()
async def topics(number_of_topics: int) -> dict[str, Any]:
    count("entrypoint")
    n = await setup(number_of_topics)
    answers = [await ask(f"Whats the answer for topic {i + 1}?") for i in range(n)]
    return {"answers": answers}


behaviour("task_before_interrupt", topics, 2, ["answer1", "answer2"])


# Concurrent tasks (asyncio.gather), each a model request, around an interrupt; and the
# same with synchronous tasks run at once (their futures).


@task
async def shout(word: str) -> str:
    count("shout")
    return await echo(word)


@entrypoint()
async def chorus(words: list[str]) -> dict[str, Any]:
    count("entrypoint")
    first = await asyncio.gather(*(shout(w) for w in words))
    answer = interrupt({"heard": first})
    second = await asyncio.gather(*(shout(f"{w}-{answer}") for w in words))
    return {"first": first, "second": second}


behaviour("gathered_tasks", chorus, ["a", "b", "c", "d"], ["again"])


@task
def shout_sync(word: str) -> str:
    count("shout_sync")
    return str(llm().invoke([SystemMessage("echo"), HumanMessage(word)]).content)


@entrypoint()
def chorus_sync(words: list[str]) -> dict[str, Any]:
    count("entrypoint")
    first = [f.result() for f in [shout_sync(w) for w in words]]
    answer = interrupt({"heard": first})
    second = [f.result() for f in [shout_sync(f"{w}-{answer}") for w in words]]
    return {"first": first, "second": second}


behaviour("gathered_sync_tasks", chorus_sync, ["a", "b", "c"], ["again"])


# test_retry (RetryPolicy): a node that fails twice then succeeds; one that never does.


class Tries(TypedDict, total=False):
    done: str


def flaky(state: Tries) -> Tries:
    count("flaky")
    conn = effects_db()
    thread = get_config()["configurable"]["thread_id"]
    try:
        tries = conn.execute("SELECT COUNT(*) FROM effects WHERE key = ?",
                             (f"ran:flaky:{thread}",)).fetchone()[0]
    finally:
        conn.close()
    if tries < 3:
        raise ValueError(f"try {tries} failed")
    return {"done": f"after {tries} tries"}


def hopeless(state: Tries) -> Tries:
    count("hopeless")
    raise ValueError("the service is gone")


_policy = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False,
                      retry_on=ValueError)
behaviour("retried", StateGraph(Tries).add_node("flaky", flaky, retry_policy=_policy)
          .add_edge(START, "flaky").compile(), {})
behaviour("retries_spent", StateGraph(Tries).add_node("hopeless", hopeless, retry_policy=_policy)
          .add_edge(START, "hopeless").compile(), {})


# get_stream_writer(): custom chunks, for the run's followers.


async def progress(state: Tries) -> Tries:
    count("progress")
    writer = get_stream_writer()
    for i in range(3):
        writer({"progress": i})
    return {"done": "reported"}


behaviour("stream_writer", StateGraph(Tries).add_node("progress", progress)
          .add_edge(START, "progress").compile(), {})
