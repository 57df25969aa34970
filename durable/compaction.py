"""Context compaction that replays exactly: a code agent's conversation whose requests stay
under a bound while the log keeps every message.

``Conversation(ctx, ContextPolicy(max_context_tokens=4000, keep_last=6))`` holds the whole
conversation (``messages``: every message, as the agent built it) and sends the model a
window of it (``window``): the leading system messages, a summary of the older messages, and
the messages after them. When a request would be over ``max_context_tokens`` (estimated as
the limiter does, ``durable.flow.limits.estimate_tokens``), the messages before the last
``keep_last`` (and the summary so far) are summarized first, **as a recorded step**:

- by default a ``chat`` step of its own (the summarizer's request: ``prompt``, then the
  messages being summarized), counted by the run's budgets like any model call;
- or ``summarize=fn``, a function of those messages to the summary's text, whose result is
  recorded as a value of the run (``RunContext.value``) with the next step.

A summary is taken once: executed again (recovery, a replay, a saved run's test), the
function meets the summarizer's recorded step and gets its recorded reply, so nothing is
sent again and the windows are the same. The log keeps every message: each reply and each
tool result is a step's outcome (model context, under ``DURABLE_CONTEXT_RETENTION``), and
the summarizer's request is recorded by its digest: the older messages stay evidence by
reference. A window never opens on a tool result (the call it answers goes with it).

Sessions (a conversation continued from run to run, ``durable.conversations``):
``Conversation.resume(ctx, policy)`` loads the conversation the run continues, with its
summary so far, and ``save()`` keeps it for the next run: every message, and the summary
and where it ends as a marker message in front (``SUMMARY_MARK``; taken out again on load),
so a later turn goes on from the summary instead of summarizing the whole history again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from durable.code import RunContext
from durable.conversations import load, save
from durable.flow.limits import estimate_tokens
from durable.models import ChatReply, chat

#: What the summarizer is asked, by default.
SUMMARY_PROMPT = ("Summarize the conversation below for yourself: the facts, decisions and "
                  "open questions a continuation needs. Answer with the summary alone.")
#: How the summary is given to the model in the window.
SUMMARY_HEAD = "Summary of the conversation so far:\n"
#: The key of the marker message a saved conversation opens with (its summary so far).
SUMMARY_MARK = "durable_compaction"


@dataclass(frozen=True)
class ContextPolicy:
    """When and how a conversation is compacted (see the module doc)."""

    max_context_tokens: int
    keep_last: int = 6
    summarize: Callable[[list[dict[str, Any]]], str] | None = None
    prompt: str = SUMMARY_PROMPT
    #: Options of the summarizer's ``chat`` step (model, max_tokens...).
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_context_tokens < 1 or self.keep_last < 1:
            raise ValueError("max_context_tokens and keep_last must be at least 1")


class Conversation:
    """A code agent's conversation under a ``ContextPolicy``."""

    def __init__(self, ctx: RunContext, policy: ContextPolicy,
                 messages: Sequence[Mapping[str, Any]] = ()) -> None:
        self.ctx, self.policy = ctx, policy
        #: Every message, in order.
        self.messages: list[dict[str, Any]] = [dict(m) for m in messages]
        #: The summary of ``messages[head:start]`` ("" for none), and where the window's
        #: messages after the system ones begin.
        self.summary = ""
        self.start = self._head()
        #: The summaries taken.
        self.summaries = 0

    @classmethod
    def resume(cls, ctx: RunContext, policy: ContextPolicy) -> Conversation:
        """The conversation of the run this one continues (a session's previous turn), its
        summary restored (a ``conversation.load`` step; declare ``conversations.TOOLS``)."""
        loaded = load(ctx)
        mark = loaded[0].get(SUMMARY_MARK) if loaded else None
        conv = cls(ctx, policy, loaded[1:] if isinstance(mark, dict) else loaded)
        if isinstance(mark, dict):
            conv.summary, conv.start = str(mark.get("summary", "")), int(mark.get("start", 0))
        return conv

    def save(self) -> int:
        """Keep every message and the summary for the run that continues this one (a
        ``conversation.save`` step); returns its size in bytes."""
        mark = {"role": "system", "content": "",
                SUMMARY_MARK: {"summary": self.summary, "start": self.start}}
        return save(self.ctx, [mark, *self.messages])

    def append(self, *messages: Mapping[str, Any]) -> None:
        self.messages.extend(dict(m) for m in messages)

    def window(self) -> list[dict[str, Any]]:
        """What the next request sends: the system messages, the summary, the rest."""
        head = self._head()
        summary = [{"role": "system", "content": SUMMARY_HEAD + self.summary}] \
            if self.summary else []
        return [*self.messages[:head], *summary, *self.messages[max(self.start, head):]]

    def chat(self, tools: Sequence[Mapping[str, Any]] | None = None,
             **options: Any) -> ChatReply:
        """Compact when the request would be over the bound, then take the ``chat`` step
        with the window; its reply is appended to the conversation."""
        if self._over(tools, options):
            self.compact()
        reply = chat(self.ctx, self.window(), tools, **options)
        self.messages.append(reply.message)
        return reply

    def compact(self) -> None:
        """Summarize the messages before the last ``keep_last`` (and the summary so far)
        into a new summary: one recorded step (or value)."""
        cut = self._cut()
        older = self.messages[max(self.start, self._head()):cut]
        if not older:
            return
        if self.summary:
            older = [{"role": "system", "content": SUMMARY_HEAD + self.summary}, *older]
        if self.policy.summarize is not None:
            fn = self.policy.summarize
            text = str(self.ctx.value("summary", lambda: fn(older)))
        else:
            asked = [{"role": "system", "content": self.policy.prompt},
                     {"role": "user", "content": _transcript(older)}]
            text = chat(self.ctx, asked, **dict(self.policy.options)).content or ""
        self.summary, self.start = text, cut
        self.summaries += 1

    def _head(self) -> int:
        """The leading system messages, kept in every window."""
        n = 0
        while n < len(self.messages) and self.messages[n].get("role") == "system":
            n += 1
        return n

    def _cut(self) -> int:
        """Where the kept messages begin: ``keep_last`` from the end, moved back so that a
        tool result keeps the call it answers."""
        cut = max(self._head(), len(self.messages) - self.policy.keep_last)
        while cut > self._head() and self.messages[cut].get("role") == "tool":
            cut -= 1
        return cut

    def _over(self, tools: Sequence[Mapping[str, Any]] | None, options: Mapping[str, Any]
              ) -> bool:
        args = {"messages": self.window(), **({"tools": list(tools)} if tools else {}),
                **options}
        return estimate_tokens(args) > self.policy.max_context_tokens


def _transcript(messages: list[dict[str, Any]]) -> str:
    """The messages being summarized, as one text for the summarizer's request."""
    lines = []
    for m in messages:
        content = m.get("content")
        text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
        calls = m.get("tool_calls")
        if calls:
            text = f"{text or ''} [calls {json.dumps(calls, sort_keys=True)}]"
        lines.append(f"{m.get('role', '?')}: {text}")
    return "\n".join(lines)
