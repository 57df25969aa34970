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

Each divergence names the run, the first step that differs and how. Apart from the code,
each run's pinned configuration (``durable.agents.configuration``) is compared with the one the new
code declares: the fields that would differ on resume, and what the agent's
``on_configuration_change`` would then do (``drift``, ``on_resume``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from durable.agents import Agent, Cancel, Fail, Finish, Registry, registry
from durable.agents import configuration as config_
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
    #: The pinned configuration's fields the new code changes: ``{field: [pinned, new]}``.
    drift: dict[str, list[str]] = field(default_factory=dict)
    #: What a resume would do about ``drift`` (the strictest policy; "" without drift).
    on_resume: str = ""


def drift_of(state: RunState, agent: Agent, tools: Registry) -> Verdict:
    """The run's pin against ``agent``'s configuration (no pin: nothing to compare)."""
    changed = config_.changes(state.config, agent.configuration(tools)) if state.config \
        else {}
    policy = config_.strictest(config_.actions(agent.on_configuration_change, changed)) \
        if changed else ""
    return Verdict(state.run_id, agent.name, "same", drift=changed, on_resume=policy)


def defined_in(registry: Registry, module: str) -> dict[str, Agent]:
    """The agents ``module`` (or a submodule of it) defines, by name."""
    found = {}
    for name, agent in registry.agents.items():
        where = agent.fn.__module__ if isinstance(agent, CodeAgent) else type(agent).__module__
        if where == module or where.startswith(module + "."):
            found[name] = agent
    return found


def check_run(elog: EventLog, run_id: str, agent: Agent, tools: Registry = registry
              ) -> Verdict:
    """Replay one run against ``agent`` as imported now, and compare its pin."""
    try:
        state = elog.load(run_id, actor="deploy-check").state
    except (RunNotFound, DecodeError) as exc:
        return Verdict(run_id, agent.name, "unreadable", detail=str(exc))
    drift = drift_of(state, agent, tools)
    verdict = _replayed(elog, run_id, agent, state)
    return replace(verdict, drift=drift.drift, on_resume=drift.on_resume)


def _replayed(elog: EventLog, run_id: str, agent: Agent, state: RunState) -> Verdict:
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


def check(elog: EventLog, agents: dict[str, Agent], runs: Iterable[tuple[str, str, str]],
          tools: Registry = registry) -> list[Verdict]:
    """Verdicts for ``runs`` ((run id, agent, state)) of ``agents`` still in flight."""
    return [check_run(elog, run_id, agents[name], tools) for run_id, name, state in runs
            if name in agents and state not in TERMINAL]
