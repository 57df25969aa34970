"""More of LangGraph's behaviours (``tests.agents.langgraph_behaviours`` holds the rest and
the registry): graphs of other shapes, from LangGraph's tests and Temporal's LangGraph
plugin's: ``Send`` fan-outs, subgraphs (as nodes, in parallel, invoked from a node's code)
interrupting, nodes of one superstep interrupting at once or beside one that finishes, a
subgraph's tool returning ``Command.PARENT``, nodes returning ``Command(goto=...)``.
Registered as ``lg_<name>`` like the others, counted the same way.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, Send, interrupt

from tests.agents.langgraph_behaviours import behaviour, count, echo

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
