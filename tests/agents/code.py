"""Code agents used by the tests: ordinary functions whose steps go through ``ctx``
(registered on import; ``tests.agents.basic`` imports this module)."""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

from pydantic import BaseModel

from durable.agents import Lookup, Tool, ToolContext, register
from durable.code import RunContext, StepFailed, agent


class StepsInput(BaseModel):
    steps: int = 3


@agent(input_model=StepsInput, tools=("sqlwrite",))
def code_writer(ctx: RunContext, inp: StepsInput) -> dict[str, Any]:
    """Writes ``steps`` rows, keeping what it wrote in a local list (its own variables)."""
    rows = []
    for n in range(1, inp.steps + 1):
        rows.append(ctx.call("sqlwrite", {"n": n})["row"])
    return {"rows": rows}


@agent(input_model=StepsInput, tools=("noop",))
def ponderer(ctx: RunContext, inp: StepsInput) -> int:
    """Thinks 20 ms (its own code, on its own thread) before each of its quick steps."""
    for n in range(1, inp.steps + 1):
        time.sleep(0.02)
        ctx.call("noop", {"n": n})
    return inp.steps


@agent(input_model=StepsInput, tools=("noop",))
async def async_counter(ctx: Any, inp: StepsInput) -> int:
    total = 0
    for n in range(1, inp.steps + 1):
        total += (await ctx.call("noop", {"n": n}))["n"]
    return total


@agent(tools=("noop",))
def asks_first(ctx: RunContext, inp: Any) -> str:
    """Waits for a name, then greets with it (the response is its variable after resume)."""
    name = ctx.wait("input", reason="who are you?", timeout_s=60)
    ctx.call("noop", {"n": 1})
    return f"hello {name['name']}"


@agent(tools=("noop",), budgets={"steps": 5})
def loops_forever(ctx: RunContext, inp: Any) -> None:
    """The classic runaway agent: only its budget stops it."""
    n = 0
    while True:
        n += 1
        ctx.call("noop", {"n": n})


class ChatInput(BaseModel):
    turns: int = 10
    text_bytes: int = 2000


@register
class EchoModel(Tool):
    """A model call without network: answers with a fixed-size message and token usage.
    ``effect_free``: resent at once after a crash; its request is logged as a digest.
    ``TEST_MODEL_LOG`` (a SQLite file) counts the requests per idempotency key."""

    name = "echo_model"
    timeout_s = 10.0
    effect_free = True
    model = True
    log_args = "digest"

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        path = os.environ.get("TEST_MODEL_LOG")
        if path:
            conn = sqlite3.connect(path, timeout=10, isolation_level=None)
            conn.execute("CREATE TABLE IF NOT EXISTS requests (key TEXT, at REAL)")
            conn.execute("INSERT INTO requests VALUES (?, ?)", (ctx.key, time.time()))
            conn.close()
        time.sleep(float(os.environ.get("TEST_MODEL_SLOW_S", "0")))
        size = int(args.get("text_bytes", 100))
        turn = len(args["messages"]) // 2 + 1
        return {"message": {"role": "assistant", "content": f"turn {turn} " + "x" * size},
                "usage": {"total_tokens": 10}}

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()


@agent(input_model=ChatInput, tools=("echo_model",), budgets={"model_calls": 1000})
def chatter(ctx: RunContext, inp: ChatInput) -> int:
    """A conversation kept in a local list: each model call gets the whole of it."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for turn in range(inp.turns):
        messages.append({"role": "user", "content": f"question {turn}"})
        reply = ctx.call("echo_model", {"messages": messages, "text_bytes": inp.text_bytes})
        messages.append(reply["message"])
    return len(messages)


@agent(tools=("echo_model",), budgets={"model_calls": 3})
def talkative(ctx: RunContext, inp: Any) -> None:
    messages: list[dict[str, Any]] = []
    while True:
        messages.append({"role": "user", "content": "again"})
        messages.append(ctx.call("echo_model", {"messages": messages})["message"])


@agent(tools=("noop",))
def variant(ctx: RunContext, inp: Any) -> str:
    """Its third step depends on ``CODE_VARIANT``: code changed between two workers."""
    ctx.call("noop", {"n": 1, "sleep_s": float(os.environ.get("VARIANT_SLEEP", "0"))})
    ctx.call("noop", {"n": 2, "sleep_s": float(os.environ.get("VARIANT_SLEEP", "0"))})
    ctx.call("noop", {"n": 3 if os.environ.get("CODE_VARIANT", "a") == "a" else 33})
    return "done"


@agent(tools=("sqlwrite", "noop"))
def handles_failure(ctx: RunContext, inp: Any) -> str:
    try:
        ctx.call("sqlwrite", {"n": 1})
    except StepFailed as exc:
        return f"recovered from {exc.status}"
    return "no failure"


@register
class NeverAnswers(Tool):
    """An effect-free call whose reply always comes after its deadline."""

    name = "never_answers"
    timeout_s = 0.3
    effect_free = True
    max_attempts = 2

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        time.sleep(1.0)
        return "too late"


@agent(tools=("never_answers",))
def stalls(ctx: RunContext, inp: Any) -> str:
    try:
        return str(ctx.call("never_answers", {}))
    except StepFailed as exc:
        return f"gave up: {exc.error_type}"


@agent(input_model=ChatInput, tools=("echo_model",), budgets={"model_calls": 1000})
def dated_chatter(ctx: RunContext, inp: ChatInput) -> dict[str, Any]:
    """Puts the time, a random number and a UUID in its system prompt at every turn, from
    the run's context: recorded, so re-execution sends the same requests."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": ""}]
    for turn in range(inp.turns):
        messages[0]["content"] = f"Now is {ctx.now().isoformat()} ({ctx.random():.6f}, " \
                                 f"request {ctx.uuid()})"
        messages.append({"role": "user", "content": f"question {turn}"})
        messages.append(ctx.call("echo_model", {"messages": messages,
                                                "text_bytes": inp.text_bytes})["message"])
    return {"prompt": messages[0]["content"], "messages": len(messages)}


@agent(input_model=ChatInput, tools=("echo_model",), budgets={"model_calls": 1000})
def clock_chatter(ctx: RunContext, inp: ChatInput) -> int:
    """The trap: ``time.time()`` in the prompt, read outside the context."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": ""}]
    for turn in range(inp.turns):
        messages[0]["content"] = f"Now is {time.time():.6f}"
        messages.append({"role": "user", "content": f"question {turn}"})
        messages.append(ctx.call("echo_model", {"messages": messages,
                                                "text_bytes": inp.text_bytes})["message"])
    return len(messages)


class SleepInput(BaseModel):
    seconds: float = 3.0


@agent(input_model=SleepInput, tools=("noop",))
def sleeper(ctx: RunContext, inp: SleepInput) -> dict[str, float]:
    """Sleeps between two steps on a durable timer; reports when it meant to wake."""
    ctx.call("noop", {"n": 1})
    asleep = ctx.time()
    ctx.sleep(inp.seconds)
    awake = ctx.time()
    ctx.call("noop", {"n": 2})
    return {"asleep": asleep, "awake": awake}


@agent(tools=("noop",))
async def async_sleeper(ctx: Any, inp: Any) -> str:
    await ctx.call("noop", {"n": 1})
    await ctx.sleep_until(ctx.time() + 1.0)
    return "rested"


def _lookup_missing(table: dict[str, Any]) -> Any:
    return table["no_such_key"]


@agent(tools=("noop",))
def buggy(ctx: RunContext, inp: Any) -> Any:
    """A bug after its first step: a KeyError two frames down."""
    ctx.call("noop", {"n": 1})
    return _lookup_missing({})


@agent(tools=("noop",))
def spinner(ctx: RunContext, inp: Any) -> None:
    """Takes a step, then loops in its own code forever (a core busy, no step taken)."""
    ctx.call("noop", {"n": 1})
    n = 0
    while True:
        n += 1
