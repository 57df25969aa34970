"""The deploy gate: would new agent code take, on the runs in flight, the steps their logs
record? (``durable deploy check --agents MODULE``)

A changed agent otherwise meets its old runs only when a worker resumes them, and
quarantines them then. This replays every run in flight of the agents a module defines
against the code imported now, sending nothing:

- a ``decide(state)`` agent re-decides every recorded step from the state before it
  (``durable.audit.replay.check_determinism``);
- a code agent's function is executed from the start against the run's log, as a worker
  would on recovery, up to its first step past what the log records (``CodeAgent.dry_run``);
  a function that finishes while the log records more steps diverges too.

Each divergence names the run, the first step that differs and how.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from durable.agents import Agent, Cancel, Fail, Finish, Registry
from durable.audit.replay import check_determinism
from durable.code import CodeAgent
from durable.errors import DecodeError, NondeterminismError, RunNotFound
from durable.log.state import TERMINAL, RunState
from durable.log.store import EventLog

#: Longest a code agent's function may take to reach its next step in a dry run (s).
DRY_RUN_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Verdict:
    run_id: str
    agent: str
    #: "same", "diverges", or "unreadable" (the log cannot be folded: not a code matter).
    outcome: str
    #: The first step that differs (0 when not known).
    step: int = 0
    detail: str = ""


def defined_in(registry: Registry, module: str) -> dict[str, Agent]:
    """The agents ``module`` (or a submodule of it) defines, by name."""
    found = {}
    for name, agent in registry.agents.items():
        where = agent.fn.__module__ if isinstance(agent, CodeAgent) else type(agent).__module__
        if where == module or where.startswith(module + "."):
            found[name] = agent
    return found


def check_run(elog: EventLog, run_id: str, agent: Agent) -> Verdict:
    """Replay one run against ``agent`` as imported now."""
    try:
        state = elog.load(run_id, actor="deploy-check").state
    except (RunNotFound, DecodeError) as exc:
        return Verdict(run_id, agent.name, "unreadable", detail=str(exc))
    try:
        if isinstance(agent, CodeAgent):
            return _dry_run(elog, agent, state)
        check_determinism(elog, run_id, agent)
    except NondeterminismError as exc:
        return Verdict(run_id, agent.name, "diverges", exc.step, str(exc))
    except Exception as exc:  # the new code raises on this run's history
        return Verdict(run_id, agent.name, "diverges", 0,
                       f"agent {agent.name} raised {exc!r} on this run's log")
    return Verdict(run_id, agent.name, "same")


def _dry_run(elog: EventLog, agent: CodeAgent, state: RunState) -> Verdict:
    agent.bind(elog)
    decision, steps = agent.dry_run(state, DRY_RUN_TIMEOUT_S)
    if isinstance(decision, Finish | Fail | Cancel) and steps < state.step:
        return Verdict(state.run_id, agent.name, "diverges", steps + 1,
                       f"the function ends after step {steps}; the log records "
                       f"{state.step} steps")
    return Verdict(state.run_id, agent.name, "same")


def check(elog: EventLog, agents: dict[str, Agent], runs: Iterable[tuple[str, str, str]]
          ) -> list[Verdict]:
    """Verdicts for ``runs`` ((run id, agent, state)) of ``agents`` still in flight."""
    return [check_run(elog, run_id, agents[name]) for run_id, name, state in runs
            if name in agents and state not in TERMINAL]
