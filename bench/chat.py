"""The long-conversation workload of ``bench/memory.py``: a code agent whose history is a
list of messages, each model call given the whole of it (logged as a digest, as the
model tools of ``durable.integrations`` are), against a model that answers at once with a
reply of ``text_bytes``. Loaded by the worker processes through ``DURABLE_AGENTS``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from durable.agents import Lookup, Tool, ToolContext, register
from durable.code import RunContext, agent


class ChatInput(BaseModel):
    turns: int = 100
    text_bytes: int = 5000


@register
class BenchModel(Tool):
    """A model without network: one reply of ``text_bytes`` per call."""

    name = "bench_model"
    timeout_s = 10.0
    effect_free = True
    model = True
    log_args = "digest"

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        turn = len(args["messages"]) // 2 + 1
        return {"message": {"role": "assistant",
                            "content": f"turn {turn} " + "x" * int(args["text_bytes"])},
                "usage": {"total_tokens": 10}}

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()


@agent(input_model=ChatInput, tools=("bench_model",), budgets={"model_calls": 100_000})
def bench_chat(ctx: RunContext, inp: ChatInput) -> int:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for turn in range(inp.turns):
        messages.append({"role": "user", "content": f"question {turn}"})
        reply = ctx.call("bench_model", {"messages": messages, "text_bytes": inp.text_bytes})
        messages.append(reply["message"])
    return len(messages)


def message_bytes(turns: int, size: int) -> int:
    """The bytes of a finished conversation's messages (content only)."""
    return sum(size + len(f"turn {t + 1} ") + len(f"question {t}") for t in range(turns))
