"""Many counterfactual forks at once: ``durable fork --where agent=support,state=completed,
since=7d --at 1 --set prompt=v2 --hold-effects`` forks every run that matches (each under
the same changes, every new effect held: ``durable.audit.forks``), waits for the forks to
get as far as they go (ended, or held at an effect), and sums up what the change would
have done: how many runs diverged and at which step, what would have been sent (the held
effects, with their arguments), and what was simulated or reused.

``--where`` takes ``agent=``, ``state=`` (default ``completed``), ``since=`` (a duration:
``7d``, ``12h``, ``30m``; runs updated since then), ``tenant=`` and ``limit=`` (default
100). A run that is itself a held fork is never forked again.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from durable.audit.diff import diff
from durable.client import Client
from durable.durations import parse_duration_ms
from durable.errors import UsageError
from durable.log.store import now_ms

#: What ``--where`` may name.
WHERE = ("agent", "state", "since", "tenant", "limit")


@dataclass
class Outcome:
    run_id: str
    fork: str
    state: str = ""
    #: The first step that differs from the run (0: none).
    first: int = 0
    #: The effects held: ``{"step", "tool", "args"}`` each.
    held: list[dict[str, Any]] = field(default_factory=list)
    simulated: int = 0
    reused: int = 0
    sent: int = 0


@dataclass
class Summary:
    outcomes: list[Outcome]

    def as_dict(self) -> dict[str, Any]:
        at: dict[int, int] = {}
        for o in self.outcomes:
            if o.first:
                at[o.first] = at.get(o.first, 0) + 1
        return {"runs": len(self.outcomes),
                "diverged": sum(1 for o in self.outcomes if o.first),
                "first_divergence": {str(k): v for k, v in sorted(at.items())},
                "held": sum(len(o.held) for o in self.outcomes),
                "simulated": sum(o.simulated for o in self.outcomes),
                "reused": sum(o.reused for o in self.outcomes),
                "effects_sent": sum(o.sent for o in self.outcomes)}


def parse_where(text: str) -> dict[str, str]:
    """``agent=support,state=completed,since=7d`` as a dict; an unknown name or a malformed
    part is a ``UsageError`` naming it."""
    found: dict[str, str] = {}
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        name, sep, value = part.partition("=")
        if not sep or not value or name not in WHERE:
            raise UsageError(f"--where {part!r}: expected NAME=VALUE, NAME one of "
                             f"{', '.join(WHERE)}")
        found[name] = value
    if "since" in found:
        parse_duration_ms(found["since"])  # refused now, by name, when malformed
    if "limit" in found and not found["limit"].isdigit():
        raise UsageError(f"--where limit={found['limit']!r}: expected a number of runs")
    return found


def matching(client: Client, where: dict[str, str]) -> list[str]:
    """The runs ``where`` names, newest first; held forks left out."""
    since = now_ms() - parse_duration_ms(where["since"]) if "since" in where else None
    found = client.runs(where.get("state", "completed"), int(where.get("limit", 100)),
                        agent=where.get("agent"), since=since, tenant=where.get("tenant"))
    return [r.run_id for r in found if not client.status(r.run_id).hold_effects]


def fork_all(client: Client, runs: list[str], at: str, overrides: dict[str, str],
             reuse_replies: bool) -> list[tuple[str, str]]:
    """A held fork of each run (``<run>-whatif-<hex>``), made ready: (run, fork) pairs."""
    tag = uuid.uuid4().hex[:6]
    pairs = []
    for run in runs:
        fork = client.fork(run, at, f"{run[:100]}-whatif-{tag}", overrides=overrides,
                           hold_effects=True, reuse_replies=reuse_replies)
        pairs.append((run, fork.run_id))
    return pairs


def settle(client: Client, pairs: list[tuple[str, str]], timeout_s: float) -> Summary:
    """Wait (up to ``timeout_s`` in all) for each fork to end or wait, then compare each
    with its run."""
    deadline = time.monotonic() + timeout_s
    outcomes = []
    for run, fork in pairs:
        state = client.wait(fork, max(0.1, deadline - time.monotonic())).state
        found = diff(client.log, run, fork)
        totals = found.b.totals()
        held = [{"step": step, "tool": side.tool, "args": client.status(fork).actions[step].args}
                for step, side in sorted(found.b.steps.items()) if side.held]
        outcomes.append(Outcome(run, fork, state, found.first, held, totals["simulated"],
                                totals["reused"], totals["effects_sent"]))
    return Summary(outcomes)
