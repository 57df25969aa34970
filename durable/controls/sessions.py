"""Named sessions: the turns of one conversation as a chain of runs, by a name the producer
chooses (a chat, a ticket, a user)::

    client.start("support", {"say": "hi"}, session="support-42")       # the first turn
    client.start("support", {"say": "and then?"}, session="support-42")  # continues it

A start in a session continues the session's latest run by reference: its ``run_started``
records the session (``session``) and the run it continues (``continue_from``), and the
agent reads the conversation that run kept (``durable.conversations``); nothing of it goes
through the input, so the input limit does not cap it. Sessions are per tenant: the same
name under two tenants is two sessions.

**One turn at a time.** A session's latest run must have ended (completed, failed, canceled
or expired) before the next one starts: a start while it has not is refused with
``SessionBusy``, writing nothing (the caller starts the turn again once the run has ended,
e.g. after ``client.wait``). Of two concurrent starts of one session, one wins and the other
is refused: the choice is one script on the session's keys (``session_claim.lua``: compare
the head read, set the new one), so two turns can never both continue the same run. A turn
that did not complete is continued from what it kept: its last ``conversation.save``, else
what it loaded (a run that kept nothing is passed over for the one it continued).

The claim and the run's ``run_started`` are two writes on two slots (the session's keys and
the run's). A start that dies between them leaves a claim without a run: a start of that run
id again takes it up; any other start waits ``ABANDONED_MS`` before it passes over it.

Keys: ``keys.session`` (hash: head, from, at, n) and ``keys.session_runs`` (the session's
runs by turn, for ``durable runs --session``). Both outlive the runs they name; a listing
skips runs that have expired.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import redis

from durable.errors import SessionBusy, UsageError
from durable.log import events as ev
from durable.log import keys
from durable.log.handle import Entry
from durable.log.index import SessionTurn
from durable.log.scripts import Scripts
from durable.log.state import TERMINAL

#: Session names: printable, no braces or "/" (they go into a hash tag).
NAME_RE = re.compile(r"^[A-Za-z0-9_.:@+-]{1,128}$")

#: How long a claim whose run has no log yet counts as a start in progress (ms): after
#: it, the claim is taken as abandoned (its starter died between the two writes).
ABANDONED_MS = 30_000

#: Claims lost to concurrent starts before a start gives up (each loss re-reads the head;
#: the head it then finds has not ended, so the second try is refused in practice).
CLAIM_TRIES = 3


#: The steps that read and keep a run's conversation (``durable.conversations``).
LOAD, SAVE = "conversation.load", "conversation.save"


def kept_outcome(entries: Iterable[Entry]) -> ev.ActionSucceeded | ev.ActionReconciled | None:
    """The outcome holding the conversation a run kept, from its log's ``entries``: its last
    ``conversation.save``, else its last ``conversation.load``; None when it kept none."""
    tools: dict[int, str] = {}
    last: tuple[str, ev.ActionSucceeded | ev.ActionReconciled] | None = None
    for entry in entries:
        e = entry.event
        if isinstance(e, ev.StepDecided):
            tools[e.step] = e.tool
        elif isinstance(e, ev.ActionSucceeded | ev.ActionReconciled) and \
                tools.get(e.step) in (LOAD, SAVE):
            if isinstance(e, ev.ActionReconciled) and e.resolution != "applied":
                continue
            if tools[e.step] == SAVE or last is None or last[0] != SAVE:
                last = (tools[e.step], e)
    return last[1] if last is not None else None


def checked(name: str) -> str:
    """A session name, or ``UsageError``."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise UsageError(f"invalid session {name!r}: use 1-128 of A-Z a-z 0-9 _ . : @ + -")
    return name


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


def claim(r: redis.Redis, projection: Any, tenant: str, name: str, run_id: str,
          now_ms: int) -> str:
    """Make ``run_id`` the latest run of the session ``name`` of ``tenant``; returns the run
    it continues ("" for the session's first). ``projection(run)`` reads a run's projection.
    Raises ``SessionBusy`` while the latest run has not ended."""
    scripts = Scripts(r)
    k, runs = keys.session(tenant, name), keys.session_runs(tenant, name)
    for _ in range(CLAIM_TRIES):
        head = {_text(f): _text(v) for f, v in r.hgetall(k).items()}
        current, drop = head.get("head", ""), ""
        if current == run_id:  # a start retried after its claim: it keeps its turn
            return head.get("from", "")
        continues = current
        if current:
            state = projection(current).get("state")
            if state is None:
                if now_ms - int(head.get("at") or 0) < ABANDONED_MS:
                    raise SessionBusy(name, tenant, current, "being started")
                continues, drop = head.get("from", ""), current
            elif state not in TERMINAL:
                raise SessionBusy(name, tenant, current, state)
        won, got = scripts.session_claim(keys=[k, runs],
                                         args=[current, run_id, continues, now_ms, drop])
        if int(won):
            return _text(got)
    state = projection(_text(got)).get("state", "being started")
    raise SessionBusy(name, tenant, _text(got), state)


def release(r: redis.Redis, tenant: str, name: str, run_id: str, previous: str) -> bool:
    """Give the session back to ``previous`` when ``run_id`` was claimed but not started."""
    return bool(Scripts(r).session_release(
        keys=[keys.session(tenant, name), keys.session_runs(tenant, name)],
        args=[run_id, previous]))


def latest(r: redis.Redis, tenant: str, name: str) -> str:
    """The session's latest run ("" for a session without one)."""
    return _text(r.hget(keys.session(tenant, name), "head"))


def walk(r: redis.Redis, tenant: str, name: str, after: str | None = None,
         batch: int = 100) -> Iterator[tuple[str, float]]:
    """(run id, turn) of the session's runs, the latest first; ``after``: past that run."""
    k = keys.session_runs(tenant, name)
    top = r.zscore(k, after) if after is not None else None
    if after is not None and top is None:
        raise UsageError(f"run {after!r} is not a run of session {name!r}")
    high: Any = f"({top}" if top is not None else "+inf"
    while True:
        page = r.zrevrangebyscore(k, high, "-inf", start=0, num=batch, withscores=True)
        if not page:
            return
        for rid, turn in page:
            yield _text(rid), float(turn)
        high = f"({page[-1][1]}"


def rebuild(r: redis.Redis, turns: Iterable[SessionTurn]) -> list[str]:
    """Restore lost session keys from the turns the run logs record (``durable
    repair-index``); returns the sessions restored ("tenant/name", "/name" without one).

    A session whose hash is gone gets it back: its head is its newest run (turns are taken
    one at a time, so the start times order them), with the run that one continues and its
    turn count. A session whose runs list is gone gets it back with the turns numbered 1, 2,
    ... in that order, and a head kept in place counts at least that many turns. Keys that
    are there are left as they are: a claim in them may be newer than any log (a start in
    progress). A turn whose run has expired is in no log and is not listed again."""
    by_session: dict[tuple[str, str], list[SessionTurn]] = {}
    for turn in turns:
        by_session.setdefault((turn.tenant, turn.session), []).append(turn)
    restored = []
    for (tenant, name), found in sorted(by_session.items()):
        found.sort(key=lambda t: (t.created, t.run_id))
        k, runs = keys.session(tenant, name), keys.session_runs(tenant, name)
        has_head, has_runs = bool(r.exists(k)), bool(r.exists(runs))
        if has_head and has_runs:
            continue
        pipe = r.pipeline(transaction=False)
        if not has_runs:
            pipe.zadd(runs, {t.run_id: n for n, t in enumerate(found, 1)})
        if not has_head:
            newest = found[-1]
            pipe.hset(k, mapping={"head": newest.run_id, "from": newest.continue_from,
                                  "at": newest.created, "n": len(found)})
        elif int(r.hget(k, "n") or 0) < len(found):
            pipe.hset(k, "n", len(found))
        pipe.execute()
        restored.append(f"{tenant}/{name}")
    return restored
