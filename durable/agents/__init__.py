"""What an agent author writes: a deterministic agent and its tools, and the registry.

An agent is ``decide(state) -> Call | Finish | Fail | Wait``: a pure function of the
folded state (no clock, no randomness, no I/O). A tool is an effect with a name, a timeout,
whether it honours cancellation, the errors that may be retried (named explicitly: nothing
is retried by default) and a ``lookup(key)`` that asks the authoritative system whether the
effect with that key happened.

Agents and tools are registered in code (``@register``) and found by importing the modules
listed in ``DURABLE_AGENTS`` or the ``durable.agents`` entry point group; a queue payload
only ever carries a run id.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable
from importlib.metadata import entry_points
from typing import Any, ClassVar, Literal

from pydantic import BaseModel

from durable.agents import configuration as config_
from durable.agents import evidence as evidence_
from durable.agents.evidence import EvidenceChecker
from durable.agents.evidence import Stale as Stale  # first defined here: still importable from here
from durable.agents.steps import Call as Call
from durable.agents.steps import Cancel as Cancel
from durable.agents.steps import Decision as Decision
from durable.agents.steps import Fail as Fail
from durable.agents.steps import Finish as Finish
from durable.agents.steps import Lookup as Lookup
from durable.agents.steps import OutcomeUnknown as OutcomeUnknown
from durable.agents.steps import Parallel as Parallel
from durable.agents.steps import ToolContext as ToolContext
from durable.agents.steps import Wait as Wait
from durable.agents.steps import resolve_awaitable as resolve_awaitable

# A call's identity was first defined here; its names stay importable from here.
from durable.call_identity import args_digest as args_digest
from durable.call_identity import call_difference as call_difference
from durable.call_identity import call_signature as call_signature
from durable.call_identity import digest_placeholder as digest_placeholder
from durable.call_identity import is_placeholder as is_placeholder
from durable.errors import UnknownAgent, UnknownTool, UsageError
from durable.flow.limits import Limit, estimate_tokens
from durable.log.state import RunState
from durable.security.sealing import secret_fields


class Tool:
    """Subclass and set the class attributes; implement ``run`` and ``lookup``."""

    name: ClassVar[str]
    timeout_s: ClassVar[float] = 10.0
    cancellable: ClassVar[bool] = False
    #: Exceptions that may be retried; nothing else ever is.
    retryable: ClassVar[tuple[type[BaseException], ...]] = ()
    #: Retries within the step before the run waits (``waiting_retry``).
    max_quick_retries: ClassVar[int] = 2
    #: Backoff (s) of the ``waiting_retry`` timer after the quick retries are spent.
    retry_backoff_s: ClassVar[float] = 2.0
    max_attempts: ClassVar[int] = 6
    #: True when ``lookup`` returning ``not_applied`` is proof (after the deadline).
    lookup_authoritative: ClassVar[bool] = True
    #: Calls wait for a human decision before they are dispatched.
    requires_approval: ClassVar[bool] = False
    approver_role: ClassVar[str] = "approver"
    approval_ttl_s: ClassVar[float] = 86400.0
    #: The call changes nothing outside (a model call, a read): after a crash it is sent
    #: again at once, with no deadline wait and no ``lookup``.
    effect_free: ClassVar[bool] = False
    #: A model call: counted against the run's "model_calls" budget, its result's
    #: ``usage.total_tokens`` against "tokens".
    model: ClassVar[bool] = False
    #: ``digest``: the log records the arguments' digest and size, not the arguments (a
    #: model request carries the whole conversation). Only for agents that can give the
    #: arguments again on recovery: code agents, which are re-executed.
    log_args: ClassVar[Literal["full", "digest"]] = "full"
    #: The result is model context, not evidence (a conversation, a prompt, a reply): with
    #: ``DURABLE_CONTEXT_RETENTION`` it is kept beside the run by reference and removed
    #: that long after the run ends, its digest staying in the log. A ``model`` step's
    #: result always is.
    context: ClassVar[bool] = False
    #: Names of argument and result fields (at any depth) that are sealed at rest with
    #: AES-GCM (``durable.security.sealing``): the tool gets them in clear, the log, the AOF and
    #: ``durable log``/``export`` do not.
    sensitive: ClassVar[tuple[str, ...]] = ()
    #: The model of the arguments (pydantic), when the tool declares one: model steps
    #: derive the tool's schema from it (``durable.models.tool_schemas``).
    args_model: ClassVar[type[BaseModel] | None] = None

    #: In a counterfactual fork that holds effects (``durable.audit.forks``): the tool's
    #: ``simulate(args)`` answers a held call in place of its effect, and the fork goes on;
    #: a tool without it stops the fork at the call until an operator releases it.
    simulates: ClassVar[bool] = False

    def simulate(self, args: Any) -> Any:
        """What the call would answer, without its effect (when ``simulates``)."""
        raise NotImplementedError(f"{self.name} does not simulate")

    def timeout_for(self, args: Any) -> float:
        """The deadline (s from dispatch) of a call with ``args``; ``timeout_s`` unless
        the tool reads it from the call or its settings (the ``chat`` step does)."""
        return self.timeout_s

    def attempts_for(self, args: Any) -> int:
        """Most dispatches of one call (each recorded); ``max_attempts`` by default."""
        return self.max_attempts

    def retry_delay_s(self, error: BaseException, attempts: int) -> float:
        """How long a run waits (``waiting_retry``) before it sends a call again that raised
        one of ``retryable`` after ``attempts`` dispatches: exponential from
        ``retry_backoff_s`` unless the error says when (a model's ``Retry-After``)."""
        return float(self.retry_backoff_s * 2 ** (attempts - 1))

    #: Limits shared by every worker that this tool's calls count against
    #: (``durable.flow.limits``): in flight, per period, model tokens per period.
    limits: ClassVar[tuple[Limit, ...]] = ()

    def estimate_tokens(self, args: dict[str, Any]) -> int:
        """Tokens a model call reserves against a token limit before it is sent (settled
        from its reply's ``usage``): by default its ``max_tokens`` and a quarter of its
        size."""
        return estimate_tokens(args)

    def approval_facts(self, args: dict[str, Any]) -> dict[str, Any]:
        """Facts, read now, that the approver's decision depends on (digested with the
        arguments, and read again before the approved call runs)."""
        return {}

    def evidence(self, args: dict[str, Any]) -> list[str]:
        """References an approver should look at (URLs, record ids)."""
        return []

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        """The effect; a plain method or ``async def`` (awaited on the tool's own thread)."""
        raise NotImplementedError

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup | Awaitable[Lookup]:
        """Ask the authoritative system whether the effect keyed ``key`` happened; a plain
        method or ``async def``."""
        return Lookup.unknown()

    def compensate(self, args: dict[str, Any], outcome: Any, ctx: ToolContext) -> Any:
        """Undo the applied effect of a call with ``args`` whose result was ``outcome``: a
        new authorized action (a refund, a closed ticket), sent as a step of its own with
        ``ctx.key`` (the call's key + ``:undo``), a deadline, the tool's approval and
        ``lookup_compensation``. A tool that does not define it cannot be undone: a
        cancel with compensation reports its calls (``durable.controls.compensation``)."""
        raise NotImplementedError

    def lookup_compensation(self, key: str, args: dict[str, Any]
                            ) -> Lookup | Awaitable[Lookup]:
        """As ``lookup``, for the compensation keyed ``key``."""
        return Lookup.unknown()

    @property
    def compensable(self) -> bool:
        """Whether the tool defines ``compensate``."""
        return type(self).compensate is not Tool.compensate


class Agent:
    name: ClassVar[str]
    version: ClassVar[str] = "1"
    input_model: ClassVar[type[BaseModel]]
    tools: ClassVar[tuple[str, ...]] = ()
    #: Limits every tool call of this agent's runs counts against (``durable.flow.limits``).
    limits: ClassVar[tuple[Limit, ...]] = ()
    #: Limits on its runs themselves: at most ``in_flight`` runs in flight (started, not
    #: ended) per key; ``in_flight=1`` is one run per key at a time (``durable.flow.limits``).
    run_limits: ClassVar[tuple[Limit, ...]] = ()
    #: What happens to a run started under another version of this agent: ``continue``,
    #: ``reapprove`` (an approver with ``upgrade_role`` must accept it) or ``quarantine``.
    on_version_change: ClassVar[Literal["continue", "reapprove", "quarantine"]] = "continue"
    #: Versions whose runs continue under this one without asking.
    compatible_versions: ClassVar[tuple[str, ...]] = ()
    upgrade_role: ClassVar[str] = "operator"
    #: What a resume does when a field of the run's pinned configuration (``configuration``)
    #: differs from the worker's: ``continue`` (the default), ``reapprove`` (an approver with
    #: ``upgrade_role`` must accept the change), ``replan`` (go on; the agent sees
    #: ``state.config_changes``) or ``expire``, by field (``model``, ``prompt``, ``tools``,
    #: ``policy``; ``"*"`` for the others). Checked at registration
    #: (``durable.agents.configuration``).
    on_configuration_change: ClassVar[dict[str, config_.Policy]] = {}
    #: The version of the policy the agent runs under (its rules, guardrails): pinned per run.
    policy_version: ClassVar[str] = ""
    #: What an expired wait means: ``expired`` (the run ends) or ``continue`` (decide again,
    #: with ``state.last_wait.outcome == "expired"``).
    on_wait_expired: ClassVar[Literal["expired", "continue"]] = "expired"
    #: What a wait for a child run does when the child is quarantined: ``wait`` (its wait
    #: says so), ``fail`` (told as a child that did not complete) or ``cancel`` (the run is
    #: canceled) (``durable.controls.children``).
    on_child_quarantined: ClassVar[Literal["wait", "fail", "cancel"]] = "wait"
    #: The sources whose references its tools record (``ctx.evidence``): each must have a
    #: registered ``EvidenceChecker``. What a resume after a wait does when a reference no
    #: longer holds: ``refresh``, ``replan`` or ``expire`` (``durable.agents.evidence``).
    evidence_sources: ClassVar[tuple[str, ...]] = ()
    on_evidence_change: ClassVar[evidence_.Policy] = "refresh"
    #: Per-run limits: "steps", "model_calls", "tokens" (a start may override them).
    #: Reaching one ends the run ``failed`` with reason ``budget_exhausted``.
    budgets: ClassVar[dict[str, float]] = {}
    #: True for agents whose history is rebuilt by executing them again (code agents):
    #: their checkpoints keep only the latest decision's actions.
    rebuilt: ClassVar[bool] = False
    #: Most steps one ``Parallel`` decision (``ctx.parallel``, ``asyncio.gather``) may
    #: take at once; more is refused with an error naming the bound.
    max_parallel: ClassVar[int] = 16
    #: Names of input and result fields sealed at rest (``durable.security.sealing``); the
    #: ``SecretStr`` fields of ``input_model`` are sealed too.
    sensitive: ClassVar[tuple[str, ...]] = ()

    def sensitive_input(self) -> tuple[str, ...]:
        """The input fields sealed when a run starts: ``sensitive`` and the model's
        ``SecretStr`` fields."""
        model = getattr(self, "input_model", None)
        return tuple(dict.fromkeys((*self.sensitive, *secret_fields(model))))

    def decide(self, state: RunState) -> Decision | list[Call]:
        raise NotImplementedError

    def close_run(self, run_id: str) -> None:
        """The worker stopped driving ``run_id`` (for now): drop what was kept for it."""

    def revalidate(self, state: RunState) -> Stale | None:
        """What must still hold when the run resumes after a wait; None when all does."""
        return None

    def configuration(self, tools: Registry) -> dict[str, str]:
        """The configuration a run of this agent is pinned to (``durable.agents.configuration``):
        ``tools``, a digest of the names and argument schemas of ``self.tools`` as ``tools``
        has them, and ``policy``; override it to add ``model`` and ``prompt`` (a digest of
        the instructions), calling this one for the rest. The same in every process that has
        the same code and settings: no clock, no I/O."""
        have = [(n, tools.tools[n].args_model) for n in self.tools if n in tools.tools]
        return {"model": "", "prompt": "", "tools": config_.tools_digest(have),
                "policy": self.policy_version}


class Registry:
    def __init__(self) -> None:
        self.agents: dict[str, Agent] = {}
        self.tools: dict[str, Tool] = {}
        self.checkers: dict[str, EvidenceChecker] = {}
        self._loaded: set[str] = set()

    def add_agent(self, agent: Agent) -> None:
        """Register ``agent``; an unknown ``on_configuration_change`` word or field, or
        ``on_evidence_change`` word, or an evidence source without a checker, is a
        ``UsageError`` naming it, and nothing is registered."""
        config_.checked_policies(agent.name, agent.on_configuration_change)
        evidence_.checked_sources(agent.name, agent.evidence_sources,
                                  agent.on_evidence_change, self.checkers)
        self.agents[agent.name] = agent

    def add_checker(self, checker: EvidenceChecker) -> None:
        self.checkers[checker.source] = checker

    def add_tool(self, tool: Tool) -> None:
        self.tools[tool.name] = tool

    def agent(self, name: str) -> Agent:
        try:
            return self.agents[name]
        except KeyError:
            raise UnknownAgent(name, sorted(self.agents)) from None

    def tool(self, name: str) -> Tool:
        try:
            return self.tools[name]
        except KeyError:
            raise UnknownTool(name) from None

    def rebuilt_agents(self) -> frozenset[str]:
        """The agents whose history is rebuilt by executing them again (code agents): their
        runs' checkpoints need not keep settled actions."""
        return frozenset(name for name, agent in self.agents.items() if agent.rebuilt)

    def sensitive_names(self) -> frozenset[str]:
        """Every field name a registered agent or tool marks sensitive."""
        names: set[str] = set()
        for tool in self.tools.values():
            names.update(tool.sensitive)
        for agent in self.agents.values():
            names.update(agent.sensitive_input())
        return frozenset(names)

    def load(self, modules: str) -> None:
        """Import each module named in a comma-separated list, then the entry points."""
        for name in [m.strip() for m in modules.split(",") if m.strip()]:
            if name not in self._loaded:
                try:
                    importlib.import_module(name)
                except ModuleNotFoundError as exc:
                    itself = exc.name is not None and f"{name}.".startswith(f"{exc.name}.")
                    where = "it" if itself else f"its import of {exc.name!r}"
                    raise UsageError(
                        f"DURABLE_AGENTS names {name!r}, but {where} cannot be found: is it "
                        "installed, or on PYTHONPATH? (the installed `durable` command does "
                        "not look in the current directory; `python -m durable` does)"
                    ) from None
                self._loaded.add(name)
        if "entry-points" not in self._loaded:
            self._loaded.add("entry-points")
            for ep in entry_points(group="durable.agents"):
                ep.load()


#: The process-wide registry that ``@register`` fills.
registry = Registry()


def register(obj: Any) -> Any:
    """Class decorator: register an ``Agent``, ``Tool`` or ``EvidenceChecker`` subclass
    (instantiated once)."""
    instance = obj() if isinstance(obj, type) else obj
    if isinstance(instance, Agent):
        registry.add_agent(instance)
    elif isinstance(instance, Tool):
        registry.add_tool(instance)
    elif isinstance(instance, EvidenceChecker):
        registry.add_checker(instance)
    else:
        raise TypeError(f"{obj!r} is neither an Agent, a Tool nor an EvidenceChecker")
    return obj
