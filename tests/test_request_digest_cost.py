"""What the built-in ``chat`` step and a durable OpenAI Agents SDK run's model step cost as
their conversation grows: each request's identity is digested one new message at a time
(``durable.request_digest``), never the whole conversation again, and the digest is the one
the whole arguments have, so logs recorded before replay unchanged.

Counted, not timed: the bytes each request's digest encodes and hashes
(``ListDigest.encoded``), on the real step path (``AgentEnvironment``: the worker's step
protocol on a real Redis server, in this process), beside the digest and size the arguments
encoded whole have (what every request encoded, and hashed, before).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest

from durable.call_identity import digest_placeholder
from durable.log import events as ev
from durable.request_digest import ListDigest, around, canonical
from durable.testing import AgentEnvironment
from tests.servers.model import ModelServer


class Counted:
    """Each digest ``ListDigest.of`` takes: bytes encoded, size, digest, and the whole
    encoding's digest and size."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[dict[str, Any]] = []
        real = ListDigest.of

        def counted(digest: ListDigest, head: bytes, items: Any, tail: bytes) -> tuple[str, int]:
            got, size = real(digest, head, items, tail)
            whole = head + b",".join(digest.encode(i) for i in items) + tail
            self.seen.append({"encoded": digest.encoded, "size": size, "digest": got,
                              "whole": (hashlib.sha256(whole).hexdigest(), len(whole))})
            return got, size

        monkeypatch.setattr(ListDigest, "of", counted)

    def check(self, calls: int, recorded: list[str]) -> tuple[int, int, int, int]:
        """Every digest is the whole arguments', the log holds them, and a late request
        encodes about what an early one does though it carries over 10 times more; returns
        the bytes encoded by an early and a late request, and an early and a late request's
        size (what each encoded and hashed before)."""
        seen = self.seen
        assert len(seen) >= calls - 1, len(seen)
        assert all((s["digest"], s["size"]) == s["whole"] for s in seen)
        assert recorded[-len(seen):] == [s["digest"] for s in seen]
        early = max(s["encoded"] for s in seen[1:10])
        late = seen[-10:]
        assert max(s["encoded"] for s in late) <= early * 1.2, [s["encoded"] for s in seen]
        assert min(s["size"] for s in late) > 10 * early, (early, late[0]["size"])
        return early, max(s["encoded"] for s in late), seen[1]["size"], late[-1]["size"]


def _recorded(env: AgentEnvironment, run_id: str, tool: str) -> list[str]:
    return [e.event.args["_digest"] for e in env.client.events(run_id)
            if isinstance(e.event, ev.StepDecided) and e.event.tool == tool]


def test_the_whole_encoding_is_head_items_and_tail() -> None:
    """``around`` splits the canonical encoding where ``digest_placeholder`` takes it whole,
    whatever keys sort before and after the list."""
    fields = {"agent": "a", "zeta": [1, {"b": 2, "a": 1}], "input_x": None, "in": "é\\\""}
    items: list[dict[str, Any]] = [{"role": "user", "content": "hi"}, {"z": 1, "a": [True, 1.5]}]
    head, tail = around(fields, "input")
    whole = digest_placeholder({**fields, "input": items})
    digest = ListDigest()
    assert digest.of(head, items, tail) == (whole["_digest"], whole["_bytes"])
    assert head + b",".join(canonical(i) for i in items) + tail == canonical(
        {**fields, "input": items})
    items[0]["content"] = "changed in place"  # a dict's value replaced: seen
    assert digest.of(head, items, tail)[0] == digest_placeholder(
        {**fields, "input": items})["_digest"]


@pytest.fixture()
def model(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModelServer]:
    srv = ModelServer(tokens=20).start()
    monkeypatch.setenv("DURABLE_MODEL_BASE_URL", srv.url)
    yield srv
    srv.stop()


def test_a_late_chat_request_digests_only_its_new_messages(
        monkeypatch: pytest.MonkeyPatch, model: ModelServer) -> None:
    """A code agent's 100 ``chat`` steps, each followed by a tool step, against a local
    OpenAI-compatible server: the last requests' digests encode about as many bytes as the
    early ones', though the conversation they carry is many times larger; every digest is
    the whole arguments', and the log holds exactly those."""
    counted = Counted(monkeypatch)
    with AgentEnvironment("examples.agents,tests.agents.model_steps") as env:
        final = env.execute("model_looper", {"calls": 100}, run_id="loop")
        assert final.state == "completed", (final.state, final.error)
        recorded = _recorded(env, "loop", "chat")
    assert len(recorded) == 100
    print("chat: encoded early, late; size early, late", counted.check(100, recorded))


def test_a_late_openai_agents_request_digests_only_its_new_items(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A durable OpenAI Agents SDK run of 100 model requests: the last requests' digests
    encode about as many bytes as the early ones', though the input they carry is many
    times larger; every digest is the whole arguments', and the log holds exactly those."""
    pytest.importorskip("agents")
    from tests.agents.openai_agents_long import CHAT_CALLS

    counted = Counted(monkeypatch)
    with AgentEnvironment("examples.agents,tests.agents.openai_agents_long") as env:
        final = env.execute("oai_chat", {"input": "look things up"}, run_id="oai")
        assert final.state == "completed", (final.state, final.error)
        assert final.model_calls == CHAT_CALLS
        recorded = _recorded(env, "oai", "oai_chat.model")
    assert len(recorded) == CHAT_CALLS
    print("openai agents: encoded early, late; size early, late",
          counted.check(CHAT_CALLS, recorded))
