"""Agents whose tool returns results larger than the inline limit (``tests/test_large_values.py``).

``big_page`` returns a deterministic page of ``bytes`` characters (so a test knows its
digest), and a large sensitive ``token`` when asked. Both agents fetch the pages of their
input one step each, then record what they saw (each page's digest and size, or the
step's failure) with a ``note`` step, and finish with the same: a page that reached the
agent altered or cut would show in the note (recorded live) and in the result (computed
again after a crash), and a re-executed agent that saw another page would be quarantined
by the note's recorded arguments.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from durable.agents import Agent, Call, Decision, Finish, Tool, ToolContext, register
from durable.code import RunContext, StepFailed, agent
from durable.log.state import RunState
from tests.pages import page, sha


class PagesInput(BaseModel):
    pages: list[int]
    secret: bool = False


@register
class BigPage(Tool):
    """A read of a large page: nothing changes outside, so it is sent again after a crash."""

    name = "big_page"
    effect_free = True
    timeout_s = 30.0
    sensitive = ("token",)

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        out: dict[str, Any] = {"url": f"https://example.test/{args['n']}",
                               "body": page(args["bytes"], f"page-{args['n']}")}
        if args.get("secret"):
            out["token"] = page(args["bytes"], "token")
        return out


@register
class Note(Tool):
    name = "note"
    effect_free = True

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return {"noted": len(args.get("seen", []))}


def seen_of(result: Any) -> dict[str, Any]:
    body = result["body"]
    seen = {"sha256": sha(body), "bytes": len(body)}
    if "token" in result:
        seen["token_sha256"] = sha(result["token"])
    return seen


def failure_of(status: str, error_type: str | None, error: str | None) -> dict[str, Any]:
    return {"status": status, "error_type": error_type, "error": error}


@agent(name="page_reader", input_model=PagesInput, tools=("big_page", "note"))
def page_reader(ctx: RunContext, inp: PagesInput) -> dict[str, Any]:
    seen = []
    for n, size in enumerate(inp.pages, start=1):
        try:
            got = ctx.call("big_page", {"n": n, "bytes": size, "secret": inp.secret})
        except StepFailed as exc:  # what the agent is told when a result cannot be kept
            seen.append(failure_of(exc.status, exc.error_type, exc.error))
            continue
        seen.append(seen_of(got))
    ctx.call("note", {"seen": seen})
    return {"seen": seen}


@register
class PageDecider(Agent):
    """The same steps, as a ``decide(state)`` agent."""

    name = "page_decider"
    input_model = PagesInput
    tools = ("big_page", "note")

    def decide(self, state: RunState) -> Decision:
        inp = PagesInput.model_validate(state.input)
        pages = len(inp.pages)
        if state.step < pages:
            n = state.step + 1
            return Call("big_page", {"n": n, "bytes": inp.pages[n - 1], "secret": inp.secret})
        seen = []
        for n in range(1, pages + 1):
            act = state.actions[n]
            seen.append(seen_of(act.result) if act.status == "succeeded" else
                        failure_of(act.status, act.error_type, act.error))
        if state.step == pages:
            return Call("note", {"seen": seen})
        return Finish({"seen": seen})


@agent(name="page_returner", input_model=PagesInput, tools=("big_page",))
def page_returner(ctx: RunContext, inp: PagesInput) -> dict[str, Any]:
    """Fetches its pages and ends with them whole: a result as large as their sum."""
    return {"pages": [ctx.call("big_page", {"n": n, "bytes": size})["body"]
                      for n, size in enumerate(inp.pages, start=1)]}
