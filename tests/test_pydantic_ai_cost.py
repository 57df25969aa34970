"""What a durable pydantic-ai run's model step costs as its conversation grows: each request's
identity is digested one new message at a time (``durable.integrations.pydantic_ai.identity``),
never the whole conversation again, and the digest is the one the whole arguments have, so
logs recorded before replay unchanged.

Counted, not timed: the bytes each request encodes and hashes (``RequestDigest.encoded``), on
the real step path (``AgentEnvironment``: the worker's step protocol on a real Redis server,
in this process), beside the digest the arguments encoded whole have.
"""

from __future__ import annotations

import asyncio
import copy
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.usage import UsageLimits

from durable.call_identity import digest_placeholder
from durable.integrations.base import stable
from durable.integrations.pydantic_ai.identity import (
    RequestDigest,
    identity,
    parameters_identity,
)
from durable.log import events as ev
from durable.testing import AgentEnvironment
from tests.agents.pydantic_ai_long import CHAT_CALLS, chatty_model

AGENTS = "examples.agents,tests.agents.pydantic_ai_long"


def whole(messages: list[ModelMessage], settings: Any,
          parameters: ModelRequestParameters) -> tuple[str, int]:
    """The digest and size of a request's arguments encoded whole, as every request's were
    before (and as the logs of those runs keep them)."""
    args = {"messages": identity(messages), "settings": stable(settings),
            "parameters": parameters_identity(parameters)}
    got = digest_placeholder(args)
    return got["_digest"], got["_bytes"]


def test_a_late_request_digests_only_its_new_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 100-request conversation run durably: the last requests encode and hash about as
    many bytes as the early ones (their new messages, parameters and settings), though the
    conversation they carry is many times larger; every digest is the whole arguments', and
    the log holds exactly those."""
    seen: list[dict[str, Any]] = []
    real = RequestDigest.of

    def counted(self: RequestDigest, messages: list[ModelMessage], settings: Any,
                parameters: ModelRequestParameters) -> tuple[str, int]:
        digest, size = real(self, messages, settings, parameters)
        seen.append({"encoded": self.encoded, "size": size, "digest": digest,
                     "whole": whole(messages, settings, parameters)})
        return digest, size

    monkeypatch.setattr(RequestDigest, "of", counted)
    with AgentEnvironment(AGENTS) as env:
        final = env.execute("pai_chat", {"prompt": "look things up"}, run_id="chat")
        assert final.state == "completed", (final.state, final.error)
        assert final.model_calls == CHAT_CALLS
        log = [entry.event for entry in env.client.events("chat")]
    assert len(seen) == CHAT_CALLS
    assert all((s["digest"], s["size"]) == s["whole"] for s in seen)
    recorded = [e.args["_digest"] for e in log if isinstance(e, ev.StepDecided)
                and e.tool == "pai_chat.model"]
    assert recorded == [s["digest"] for s in seen]
    early = max(s["encoded"] for s in seen[1:10])
    late = seen[-10:]
    assert max(s["encoded"] for s in late) <= early * 1.2, [s["encoded"] for s in seen]
    assert min(s["size"] for s in late) > 10 * early, (early, late[0]["size"])


def test_a_message_changed_in_place_is_digested_whole_after_a_reset() -> None:
    """The digest knows a message it digested by identity: one changed in place afterwards
    keeps its first digest (the same on every execution of the function, which meets the
    messages in the same order) until ``reset``, after which the request is digested whole,
    as a log recorded before has it."""
    asked: list[list[ModelMessage]] = []

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked.append(list(messages))
        return await chatty_model(messages, info)

    agent = Agent(FunctionModel(model))

    @agent.tool_plain
    async def look_up(n: int) -> dict[str, Any]:
        return {"n": n}

    asyncio.run(agent.run("go", usage_limits=UsageLimits(request_limit=None)))
    parameters, settings = ModelRequestParameters(), {"temperature": 0.0}
    digest = RequestDigest()
    for messages in asked[:5]:
        assert digest.of(messages, settings, parameters) == whole(messages, settings,
                                                                   parameters)
    messages = asked[5]
    first = messages[0]
    first.metadata = {"changed": "in place"}
    assert digest.of(messages, settings, parameters) != whole(messages, settings, parameters)
    digest.reset()
    assert digest.of(messages, settings, parameters) == whole(messages, settings, parameters)
    assert digest.encoded > 0.9 * whole(messages, settings, parameters)[1]
    copies = [copy.copy(m) for m in asked[6]]  # the same content, other objects
    before = digest.of(asked[6], settings, parameters)
    assert digest.of(copies, settings, parameters) == before


def test_settings_and_parameters_are_digested_again_when_their_json_changes() -> None:
    """A run's requests mostly carry the same settings and parameters, whose encoding the
    digest keeps; it is taken again when they change as JSON: to an equal value of another
    type (``1`` and ``1.0``), or in place (a tool added to the same parameters). A message
    replaced in the middle of the conversation is digested again too. Every digest is the
    whole arguments'."""
    messages: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("hi")]),
                                    ModelResponse(parts=[TextPart("hello")]),
                                    ModelRequest(parts=[UserPromptPart("more")])]
    look = ToolDefinition(name="look", parameters_json_schema={
        "type": "object", "properties": {"n": {"type": "integer"}}})
    parameters = ModelRequestParameters(function_tools=[look])
    digest = RequestDigest()
    steps: list[tuple[Any, Callable[[], None]]] = [
        ({"temperature": 1}, lambda: None),
        ({"temperature": 1.0}, lambda: None),
        ({"temperature": 1.0}, lambda: None),
        ({"temperature": True}, lambda: None),
        ({"temperature": True}, lambda: parameters.function_tools.append(
            ToolDefinition(name="book", description="Book it."))),
        ({"temperature": True}, lambda: messages.__setitem__(
            1, ModelResponse(parts=[TextPart("hello again")]))),
    ]
    seen = set()
    for settings, change in steps:
        change()
        got = digest.of(messages, settings, parameters)
        assert got == whole(messages, settings, parameters), settings
        seen.add(got)
    assert len(seen) == 5  # each change made another digest; the repeat none


def test_a_requests_parameters_digest_the_same_in_every_process() -> None:
    """A request's parameters hold sets (the tools a search revealed...), which Python
    iterates in an order its string hashing draws anew in each process: the parameters'
    identity lists them in one order, so a run recovered by another worker digests its
    requests as the first one did."""
    code = ("from pydantic_ai.models import ModelRequestParameters\n"
            "from durable.integrations.pydantic_ai.identity import RequestDigest\n"
            "p = ModelRequestParameters(revealed_tool_names={'alpha', 'beta', 'gamma', "
            "'delta', 'epsilon'}, deferred_capability_ids={'<thinking:3f9a1c>', 'search'})\n"
            "print(RequestDigest().of([], None, p)[0])\n")
    digests = {subprocess.run([sys.executable, "-c", code], check=True, text=True,
                              capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed}
                              ).stdout.strip() for seed in ("1", "2", "3", "4")}
    assert len(digests) == 1, digests
