"""Limits shared by every worker: calls in flight, calls per period, model tokens or money
per period.

A tool (``Tool.limits``) or an agent (``Agent.limits``: every call its runs make) declares
``Limit`` s; each is keyed by a template over the call's arguments and the run
(``"{tenant}"``, ``"{args.provider}"``, ``"{agent}:{owner}"``; "" = one key for all), so
one declaration is one limiter per key value. A limiter lives in Redis under one hash tag
(``keys.limiter``): one atomic script per decision (``limit_take.lua``), one per release
(``limit_release.lua``), so any number of workers obey the same count, on a cluster too.

Before a step is dispatched the worker takes a permit of each of its limiters. A call over
a limit is not an error and consumes no retry: its intent is recorded, the run lets go of
its worker slot and waits as a timer in the due-set (``retry_at``, staggered so that the
waiters do not all wake at once); a release of a limit on calls in flight wakes the oldest
waiter at once. A permit carries an expiry (the call's deadline): a SIGKILLed worker's
permits lapse at the next decision, nothing leaks.

Model steps reserve ``Tool.estimate_tokens(args)`` (default: the request's ``max_tokens``
plus a quarter of its size in bytes) and settle with the reply's ``usage.total_tokens``.

A tool whose provider answers 429 raises ``durable.errors.RateLimited(retry_after_s)``: the
step waits that long (not a failure of the tool), and every limiter the call held lowers
its share of the declared rate (halved, at most once per Retry-After, down to
``FLOOR``), regaining ``RECOVER`` of it per period without one: the fleet backs off
together.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from durable.call_identity import given_digest
from durable.errors import UsageError
from durable.log import keys
from durable.log.scripts import Scripts

if TYPE_CHECKING:
    from durable.log.batching import ScriptBatcher
    from durable.log.state import RunState
    from durable.log.store import Spec

#: Share of the declared rate regained per period without a 429 (additive increase).
RECOVER = 0.1
#: Lowest share a run of 429s lowers a limiter's rate to (multiplicative decrease).
FLOOR = 0.05
#: A limiter's keys expire after this long without a decision (ms) past its period.
IDLE_MS = 3_600_000
#: A run's place under its agent's ``run_limits`` lapses this long (ms) after the last job
#: of it began, unless a worker ends the run first (a run ended elsewhere, by a cancel of
#: a run no worker held, frees its place then).
RUN_PERMIT_MS = 600_000
#: How often (s) a process notes a limiter it uses in ``keys.LIMITERS``.
NOTE_EVERY_S = 5.0

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_FIELD = re.compile(r"\{([^{}]*)\}")
_RUN_FIELDS = frozenset({"tenant", "owner", "agent", "tool", "run"})
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:@+-]")


@dataclass(frozen=True)
class Limit:
    """At most ``in_flight`` calls at once, ``rate`` calls and ``tokens`` model tokens per
    ``per_s`` seconds (0: no bound), per value of ``key``. ``margin_s`` is added to the
    period: a grant counts that much longer than the period, so that the network delay
    between the grant and the provider's receipt cannot put R+1 calls in one of its
    windows."""

    name: str
    key: str = ""
    in_flight: int = 0
    rate: int = 0
    tokens: int = 0
    per_s: float = 60.0
    margin_s: float = 0.25
    #: At most this many US dollars of model calls per period (``durable.costs``): a call
    #: is refused while what was spent in the period reaches it; what each call cost is
    #: counted when it returns (so the calls in flight may overshoot it by their cost).
    spend_usd: float = 0.0

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise UsageError(f"invalid limit name {self.name!r}: use 1-64 of A-Z a-z 0-9 _ . -")
        for what in ("in_flight", "rate", "tokens"):
            n = getattr(self, what)
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise UsageError(f"limit {self.name}: {what} must be a whole number >= 0")
        if not (self.in_flight or self.rate or self.tokens or self.spend_usd):
            raise UsageError(f"limit {self.name}: give in_flight, rate, tokens or spend_usd")
        if not self.spend_usd >= 0 or (self.spend_usd and self.tokens):
            raise UsageError(f"limit {self.name}: spend_usd must be >= 0, and a limit bounds "
                             "tokens or spend_usd, not both")
        if self.per_s <= 0 or self.margin_s < 0:
            raise UsageError(f"limit {self.name}: per_s must be > 0 and margin_s >= 0")
        for name in _FIELD.findall(self.key):
            if name not in _RUN_FIELDS and not name.startswith("args."):
                raise UsageError(f"limit {self.name}: key field {{{name}}} is none of "
                                 f"{', '.join(sorted(_RUN_FIELDS))} or args.<field>")
        if self.key.count("{") != self.key.count("}"):
            raise UsageError(f"limit {self.name}: unbalanced braces in key {self.key!r}")

    @property
    def period_ms(self) -> int:
        return int((self.per_s + self.margin_s) * 1000)

    @property
    def counted(self) -> int:
        """What the limiter's script bounds per period: tokens, or millionths of a dollar."""
        return self.tokens or round(self.spend_usd * 1_000_000)


def key_of(limit: Limit, state: RunState, tool: str, args: Any) -> str:
    """The limiter a call counts against: ``limit.key`` filled in from the run and the
    call's arguments (a missing argument is ""), made safe for a hash tag."""

    def value(m: re.Match[str]) -> str:
        name = m.group(1)
        if name.startswith("args."):
            found: Any = args
            for part in name[5:].split("."):
                found = found.get(part) if isinstance(found, Mapping) else None
            return "" if found is None else str(found)
        return {"tenant": state.tenant, "owner": state.owner, "agent": state.agent,
                "tool": tool, "run": state.run_id}[name]

    return _UNSAFE.sub("_", _FIELD.sub(value, limit.key))[:100]


def estimate_tokens(args: Any) -> int:
    """A model request's token estimate: its ``max_tokens`` plus a quarter of its size (the
    size of the full arguments for arguments given by their digest: ``given_digest``)."""
    if not isinstance(args, Mapping):
        return 0
    reply = args.get("max_tokens") or args.get("max_output_tokens") or 0
    size = int(args["_bytes"]) if given_digest(dict(args)) is not None \
        else len(json.dumps(args, default=str, separators=(",", ":")))
    return (int(reply) if isinstance(reply, int | float) else 0) + size // 4


def used_tokens(result: Any) -> int:
    """Tokens a reply used, from its OpenAI-style ``usage`` (-1: not said)."""
    usage = result.get("usage") if isinstance(result, Mapping) else None
    total = usage.get("total_tokens") if isinstance(usage, Mapping) else None
    return int(total) if isinstance(total, int | float) else -1


def _keys(name: str, key: str, *parts: str) -> list[str]:
    return [keys.limiter(name, key, part) for part in parts]


@dataclass
class Wait:
    """A call refused by a limiter: when to ask again, and why (shown as the run's reason)."""

    retry_at: int
    limit: str
    key: str
    why: str

    @property
    def reason(self) -> str:
        return f"waits for limit {self.limit}[{self.key}]: {self.why}"[:500]


@dataclass
class _Held:
    limit: Limit
    key: str
    permit: str


@dataclass
class _Decision:
    """One limiter's decision for one call (``Limiter._plan``)."""

    step: int
    held: _Held
    run_id: str
    estimate: int


@dataclass
class Limiter:
    """Takes and gives back the permits of a worker's calls (``take``/``release``).

    ``wake``: makes a run ready (a waiter woken by a release)."""

    redis: redis.Redis
    wake: Callable[[str], object] = lambda run_id: None
    #: ms since the epoch (tests pass their own).
    clock: Callable[[], int] = lambda: int(time.time() * 1000)
    #: Sends a run coroutine's decisions with its driver's other calls
    #: (``take_all_async``); None: each is a round trip.
    batcher: ScriptBatcher | None = None
    #: The keys of the runs' log (``EventLog.keys``): their reasons and due times.
    layout: keys.KeyLayout = keys.UNSHARDED
    held: dict[tuple[str, int], list[_Held]] = field(default_factory=dict)
    _noted: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.scripts = Scripts(self.redis)

    @staticmethod
    def limits_of(agent: Any, tool: Any) -> tuple[Limit, ...]:
        return tuple(getattr(tool, "limits", ())) + tuple(getattr(agent, "limits", ()))

    @staticmethod
    def unlimited(agent: Any, calls: Sequence[tuple[Any, int, Any]]) -> bool:
        """Whether no limiter counts these calls (most tools, most agents): nothing to take,
        nothing to give back, no lock and no script call."""
        return not getattr(agent, "limits", ()) and \
            not any(getattr(tool, "limits", ()) for tool, _, _ in calls)

    def take(self, state: RunState, agent: Any, tool: Any, step: int, args: Any,
             deadline_ms: int) -> Wait | None:
        """Permits of every limiter of this call, or the first refusal (the permits taken
        before it are given back). ``deadline_ms``: when the permits lapse."""
        return self.take_all(state, agent, [(tool, step, args)], deadline_ms)

    def take_all(self, state: RunState, agent: Any, calls: Sequence[tuple[Any, int, Any]],
                 deadline_ms: int) -> Wait | None:
        """``take`` for several calls (a parallel group): all their permits, or none."""
        if self.unlimited(agent, calls):
            return None
        plan = self._plan(state, agent, calls)
        replies: list[Wait | None] = []
        for d in plan:
            replies.append(self._decide(d, deadline_ms))
            if replies[-1] is not None:
                break
        return self._settle_plan(state.run_id, plan, replies)

    async def take_all_async(self, state: RunState, agent: Any,
                             calls: Sequence[tuple[Any, int, Any]],
                             deadline_ms: int) -> Wait | None:
        """``take_all`` in a run's coroutine: each decision is a script call its driver
        sends with the other runs' calls (``durable.log.batching``), not a round trip of
        its own that would hold a worker's hub."""
        if self.unlimited(agent, calls):
            return None
        plan = self._plan(state, agent, calls)
        if self.batcher is None or not plan:
            return self.take_all(state, agent, calls, deadline_ms)
        replies: list[Wait | None] = []
        for d in plan:
            now = self.clock()
            self._note(self.redis, d.held.limit, d.held.key, now)
            reply = await self.batcher.script_call("limit_take", *self._args(d, deadline_ms,
                                                                             now))
            replies.append(self._answer(d, reply))
            if replies[-1] is not None:
                break
        return self._settle_plan(state.run_id, plan, replies)

    async def take_run(self, state: RunState, agent: Any) -> Wait | None:
        """The run's place under its agent's ``run_limits`` (at most N runs in flight per
        key: ``{owner}``, ``{tenant}``, ``{args.<field of the input>}``), taken when a job
        of it begins; the same run takes its own place again."""
        plan = self._run_plan(state, agent)
        if not plan:
            return None
        deadline = self.clock() + RUN_PERMIT_MS
        replies: list[Wait | None] = []
        for d in plan:
            now = self.clock()
            self._note(self.redis, d.held.limit, d.held.key, now)
            call = self._args(d, deadline, now)
            if self.batcher is not None:
                reply = await self.batcher.script_call("limit_take", *call)
            else:
                reply = self.scripts.limit_take(keys=call[0], args=call[1])
            replies.append(self._answer(d, reply))
            if replies[-1] is not None:
                break
        granted = [d.held for d, r in zip(plan, replies, strict=False) if r is None]
        refused = next((r for r in replies if r is not None), None)
        if refused is not None and granted:
            self._give_back(granted, None)
        return refused

    def release_run(self, state: RunState, agent: Any) -> None:
        """Free the run's places (it ended): the oldest run waiting for one is woken."""
        held = [d.held for d in self._run_plan(state, agent)]
        if held:
            self._give_back(held, None)

    def _run_plan(self, state: RunState, agent: Any) -> list[_Decision]:
        return [_Decision(0, _Held(limit, key_of(limit, state, "", state.input), state.run_id),
                          state.run_id, 0) for limit in getattr(agent, "run_limits", ())]

    def _plan(self, state: RunState, agent: Any,
              calls: Sequence[tuple[Any, int, Any]]) -> list[_Decision]:
        """The decisions a set of calls needs: one per limiter of each call."""
        plan = []
        for tool, step, args in calls:
            limits = self.limits_of(agent, tool)
            if not limits:
                continue
            # A dispatch sent again (after a crash) is another permit; the same dispatch
            # taken again (its commit retried) is the same one.
            act = state.actions.get(step)
            permit = f"{state.run_id}:{step}:{act.attempts if act is not None else 0}"
            estimate = 0
            if any(limit.tokens for limit in limits):
                custom = getattr(tool, "estimate_tokens", None)
                estimate = int(custom(args)) if callable(custom) else estimate_tokens(args)
            for limit in limits:
                # A spend limit reserves a millionth: refused once the period's spend is at it.
                held = _Held(limit, key_of(limit, state, tool.name, args), permit)
                plan.append(_Decision(step, held, state.run_id,
                                      1 if limit.spend_usd else max(estimate, 0)))
        return plan

    def _settle_plan(self, run_id: str, plan: list[_Decision],
                     replies: list[Wait | None]) -> Wait | None:
        """Keep the permits granted, or give them all back at the first refusal."""
        granted = [d for d, r in zip(plan, replies, strict=False) if r is None]
        refused = next((r for r in replies if r is not None), None)
        if refused is not None:
            if granted:
                self._give_back([d.held for d in granted], None)
            return refused
        with self._lock:
            for d in plan:
                self.held.setdefault((run_id, d.step), []).append(d.held)
        return None

    def _args(self, d: _Decision, deadline_ms: int, now: int) -> tuple[list[str], list[Any]]:
        limit = d.held.limit
        return (_keys(limit.name, d.held.key, "inflight", "calls", "tokens", "used", "state",
                      "waiting"),
                [now, d.held.permit, max(deadline_ms, now + 1000), d.run_id, limit.in_flight,
                 limit.rate, limit.counted, limit.period_ms, d.estimate, RECOVER,
                 limit.period_ms + IDLE_MS])

    def _decide(self, d: _Decision, deadline_ms: int) -> Wait | None:
        now = self.clock()
        pipe = self.redis.pipeline(transaction=False)
        script_keys, args = self._args(d, deadline_ms, now)
        self.scripts.limit_take(keys=script_keys, args=args, client=pipe)
        self._note(pipe, d.held.limit, d.held.key, now)
        return self._answer(d, pipe.execute()[0])

    def _answer(self, d: _Decision, reply: Any) -> Wait | None:
        granted, arg, why = reply
        if int(granted):
            if int(arg):  # it had waited: what `durable runs` shows is no longer true
                self.redis.hset(self.layout.run(d.run_id), "reason", "")
            return None
        said = why.decode() if isinstance(why, bytes) else why
        if d.held.limit.spend_usd:
            said = f"${d.held.limit.spend_usd:g} of model calls per {d.held.limit.per_s:g} s spent"
        return Wait(int(arg), d.held.limit.name, d.held.key, said)

    def _note(self, pipe: Any, limit: Limit, key: str, now: int) -> None:
        """Record the limiter in ``keys.LIMITERS`` (every ``NOTE_EVERY_S`` per process)."""
        tag = f"{limit.name}|{key}"
        if time.monotonic() - self._noted.get(tag, -NOTE_EVERY_S) < NOTE_EVERY_S:
            return
        self._noted[tag] = time.monotonic()
        pipe.hset(keys.LIMITERS, tag, json.dumps({
            "at": now, "in_flight": limit.in_flight, "rate": limit.rate,
            "tokens": limit.tokens, "period_ms": limit.period_ms}))

    def release(self, run_id: str, step: int, specs: Iterable[Spec]) -> None:
        """Give back the permits of a call that returned, given what it observed: the
        tokens its reply used, a provider's Retry-After. Wakes a run waiting for one."""
        if not self.held:  # nothing taken (no call held a permit): no lock to take
            return
        with self._lock:
            held = self.held.pop((run_id, step), None)
        if held:
            self._give_back(held, list(specs))

    def _give_back(self, held: list[_Held], specs: list[Spec] | None) -> None:
        now = self.clock()
        spent, retry_after, paid = -1, 0, 0
        for spec in specs or ():
            f = spec.fields
            if spec.cls.__name__ == "ActionSucceeded":
                spent = used_tokens(f.get("result"))
                usd = str(getattr(f.get("cost"), "usd", "") or "")
                paid = round(float(usd) * 1_000_000) if usd else 0
            elif f.get("error_type") == "RateLimited":
                spent, retry_after = 0, max(int(f.get("retry_at", now)) - now, 1)
        if specs is None:
            spent = 0  # never sent
        pipe = self.redis.pipeline(transaction=False)
        for h in held:
            money = bool(h.limit.spend_usd)  # settled with what the call cost, no backoff
            self.scripts.limit_release(
                keys=_keys(h.limit.name, h.key, "inflight", "used", "state", "waiting"),
                args=[h.permit, now, paid if money else spent, 0 if money else retry_after,
                      "1" if h.limit.in_flight else "0", h.limit.period_ms, RECOVER, FLOOR],
                client=pipe)
        for woken in pipe.execute():
            run = woken.decode() if isinstance(woken, bytes) else woken
            if run:
                self.wake(run)

    def park(self, run_id: str, wait: Wait) -> None:
        """The run waits for ``wait``: due at its ``retry_at``, its reason shown."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(self.layout.due_of(run_id), {run_id: wait.retry_at})
        pipe.hset(self.layout.run(run_id), "reason", wait.reason)
        pipe.execute()

