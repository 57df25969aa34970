"""LangGraph behaviours taken from LangGraph's own tests (``libs/langgraph/tests``:
``test_pregel_async.py``'s interrupts, functional API, ``Send``, subgraphs, parent commands,
retries), each a graph that counts how often its nodes' and tasks' code runs. Each is
registered as a durable agent (``lg_<name>``) for the workers, and run by the tests in their
own process under LangGraph's ``InMemorySaver`` too, for the reference: the same answers must
give the same result and the same counts.

A count is a row ``ran:<what>:<thread>`` of the effects database (``tests.servers.effects``):
the thread is the run's id in a durable run, the reference's own otherwise.
"""

from __future__ import annotations

import asyncio
import operator
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.config import get_config, get_stream_writer
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.pregel import Pregel
from langgraph.types import Command, RetryPolicy, Send, interrupt

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


# test_send_sequences (map-reduce): a node per topic through Send, each a model request,
# then a review that interrupts.


class Fan(TypedDict, total=False):
    topics: list[str]
    jokes: Annotated[list[str], operator.add]
    verdict: str


def fan_out(state: Fan) -> list[Send]:
    return [Send("joke", {"topics": [t]}) for t in state["topics"]]


async def joke(state: Fan) -> Fan:
    count("joke")
    return {"jokes": [await echo(state["topics"][0])]}


async def review(state: Fan) -> Fan:
    count("review")
    return {"verdict": str(interrupt({"jokes": sorted(state["jokes"])}))}


behaviour("send_fan_out", StateGraph(Fan).add_node("joke", joke).add_node("review", review)
          .add_conditional_edges(START, fan_out, ["joke"]).add_edge("joke", "review")
          .add_edge("review", END).compile(), {"topics": ["cats", "dogs", "owls"]}, ["fine"])


# test_interrupt_subgraph and test_double_interrupt_subgraph: interrupts inside a
# subgraph, a node of the graph before and after it.


class Nest(TypedDict, total=False):
    said: list[str]


def before(state: Nest) -> Nest:
    count("before")
    return {"said": ["before"]}


async def inner_ask(state: Nest) -> Nest:
    count("inner_ask")
    one = interrupt("inner one?")
    two = interrupt("inner two?")
    return {"said": [*state["said"], f"{one}+{two}"]}


def after(state: Nest) -> Nest:
    count("after")
    return {"said": [*state["said"], "after"]}


_inner = StateGraph(Nest).add_node("inner_ask", inner_ask).add_edge(START, "inner_ask") \
    .compile()
behaviour("subgraph_interrupts", StateGraph(Nest).add_node("before", before)
          .add_node("sub", _inner).add_node("after", after).add_edge(START, "before")
          .add_edge("before", "sub").add_edge("sub", "after").compile(), {"said": []},
          ["x", "y"])


# test_interrupt_multiple (two nodes of one superstep interrupt at once): one wait holds
# both, answered by interrupt id.


class Pair(TypedDict, total=False):
    left: str
    right: str
    joined: str


async def left(state: Pair) -> Pair:
    count("left")
    return {"left": str(interrupt("left?"))}


async def right(state: Pair) -> Pair:
    count("right")
    return {"right": str(interrupt("right?"))}


def join(state: Pair) -> Pair:
    count("join")
    return {"joined": f"{state['left']}|{state['right']}"}


behaviour("parallel_interrupts", StateGraph(Pair).add_node("left", left)
          .add_node("right", right).add_node("join", join).add_edge(START, "left")
          .add_edge(START, "right").add_edge(["left", "right"], "join").add_edge("join", END)
          .compile(), {}, [{"left?": "L", "right?": "R"}])


# test_parent_command: a subgraph's tool returns Command(graph=Command.PARENT, update=...),
# and the parent graph applies the update.


class Named(MessagesState, total=False):
    user: str


@tool
def name_user(name: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
    """Set the user's name in the parent graph."""
    count("name_user")
    return Command(graph=Command.PARENT, update={"user": name, "messages": [
        ToolMessage(f"named {name}", tool_call_id=tool_call_id)]})


def call_tool(state: Named) -> Named:
    count("call_tool")
    return {"messages": [AIMessage("", tool_calls=[
        {"name": "name_user", "args": {"name": "Meow"}, "id": "call_1"}])]}


_namer = StateGraph(Named).add_node("call_tool", call_tool) \
    .add_node("tools", ToolNode([name_user])).add_edge(START, "call_tool") \
    .add_edge("call_tool", "tools").compile()
behaviour("parent_command", StateGraph(Named).add_node("namer", _namer)
          .add_edge(START, "namer").compile(), {"messages": [HumanMessage("hi")]})


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


# Temporal's LangGraph plugin's test_command: nodes that return Command(update=..., goto=...).


class Value(TypedDict, total=False):
    value: str


def goto_b(state: Value) -> Command[Any]:
    count("goto_b")
    return Command(update={"value": state["value"] + "a"}, goto="node_b")


def goto_end(state: Value) -> Command[Any]:
    count("goto_end")
    return Command(update={"value": state["value"] + "b"}, goto=END)


behaviour("command_goto", StateGraph(Value).add_node("node_a", goto_b, destinations=("node_b",))
          .add_node("node_b", goto_end, destinations=(END,)).add_edge(START, "node_a")
          .compile(), {"value": ""})


# test_node_not_cancelled_on_other_node_interrupted: of two nodes of one superstep, one
# interrupts and the other (a model request) finishes; answered, only the first runs again.


async def asks_first(state: Pair) -> Pair:
    count("asks_first")
    return {"left": str(interrupt("first?"))}


async def finishes(state: Pair) -> Pair:
    count("finishes")
    return {"right": await echo("done")}


behaviour("sibling_finishes", StateGraph(Pair).add_node("asks_first", asks_first)
          .add_node("finishes", finishes).add_node("join", join).add_edge(START, "asks_first")
          .add_edge(START, "finishes").add_edge(["asks_first", "finishes"], "join")
          .add_edge("join", END).compile(), {}, ["yes"])


# test_nested_graph_interrupts_parallel: two subgraphs of one superstep, each interrupting.


async def nested_ask(state: Nest) -> Nest:
    count("nested_ask")
    return {"said": [*state.get("said", []), str(interrupt("nested?"))]}


def _nested() -> Any:
    return StateGraph(Nest).add_node("nested_ask", nested_ask) \
        .add_edge(START, "nested_ask").compile()


class Twins(TypedDict, total=False):
    said: Annotated[list[str], operator.add]


behaviour("parallel_subgraphs", StateGraph(Twins).add_node("one", _nested())
          .add_node("two", _nested()).add_edge(START, "one").add_edge(START, "two")
          .compile(), {"said": []}, [{"nested?": "both"}])


# A subgraph invoked from a node's own code (not as a node), interrupting inside.


async def calls_subgraph(state: Nest) -> Nest:
    count("calls_subgraph")
    out = await _inner_called.ainvoke({"said": state["said"]})
    return {"said": [*out["said"], "called"]}


_inner_called = StateGraph(Nest).add_node("inner_ask", inner_ask) \
    .add_edge(START, "inner_ask").compile()
behaviour("subgraph_in_code", StateGraph(Nest).add_node("calls_subgraph", calls_subgraph)
          .add_edge(START, "calls_subgraph").compile(), {"said": []}, ["p", "q"])
