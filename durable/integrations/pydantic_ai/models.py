"""The models of a durable pydantic-ai agent: the one its runs ask by default (the
capability's, else the agent's) and those registered by name (``models=``), checked when the
agent is built, and the one a run's input names (a registered name or a model id), checked
when the run begins.

pydantic-ai's peers (``TemporalAgent``, ``DBOSAgent``, ``PrefectAgent``) refuse, when they are
built, an agent they could not run: one without a model, or whose model settings cannot
cross the durable boundary. Here too, with a ``UsageError`` that names what is wrong,
before anything is registered: the agent's module then fails to import in the worker (or in
the producer) with the reason, instead of every run failing or quarantining later. A model
request's settings are part of its step's identity, as JSON: a value JSON cannot carry (a
function, a client object) would be checked on re-execution by its type alone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic_ai.agent import AbstractAgent
from pydantic_ai.exceptions import UserError
from pydantic_ai.models import Model, ModelResolutionContext, infer_model
from pydantic_core import PydanticSerializationError, to_jsonable_python

from durable.agents import Fail
from durable.code import EndRun
from durable.errors import UsageError

__all__ = ["check_buildable", "check_resolvable", "run_model"]


def check_buildable(name: str, agent: AbstractAgent[Any, Any], model: Model | str | None,
                    models: Mapping[str, Model | str]) -> None:
    """Refuse (``UsageError``) an agent this system cannot run: without a model (neither
    ``model`` nor the agent's), or with model settings (the agent's or a model's) that are
    not JSON data. ``model``: the capability's own; ``models``: those a run may choose by
    name."""
    default = model if model is not None else getattr(agent, "model", None)
    if default is None:
        raise UsageError(f"durable agent {name!r} needs a model: give the agent one "
                         "(Agent('openai:gpt-4o', ...)) or its durability "
                         "(RedisDurability(model=...), DurableAgent(agent, model=...)); a "
                         "run's input may name another, not the only one")
    sources: list[tuple[str, Any]] = [("the agent's", getattr(agent, "model_settings", None))]
    named = [(f"the model {key!r}'s", m) for key, m in models.items()]
    for which, candidate in (("the capability's model's", model),
                             ("the agent's model's", getattr(agent, "model", None)), *named):
        if isinstance(candidate, Model):
            sources.append((which, candidate.settings))
    for which, settings in sources:
        _check_settings(name, which, settings)


def _check_settings(name: str, which: str, settings: Any) -> None:
    if settings is None or callable(settings):  # a function is called per run, in the run
        return
    items = settings.items() if isinstance(settings, Mapping) else [("", settings)]
    for key, value in items:
        try:
            to_jsonable_python(value)
        except (PydanticSerializationError, TypeError, ValueError) as exc:
            where = f"{key!r}" if key else "them"
            raise UsageError(
                f"durable agent {name!r}: {which} model settings are not JSON data at "
                f"{where} ({str(exc).splitlines()[0]}): a model request's settings are "
                "recorded with its step; give plain values (a client or a function belongs "
                "to the model or the provider, not its settings)") from None


async def run_model(agent: AbstractAgent[Any, Any], model: Model | str | None,
                    models: Mapping[str, Model | str], chosen: str | None,
                    deps: Any) -> Model | str | None:
    """The model a run asks (``None``: the agent's own). ``chosen``, the name its input
    gives, is one of ``models`` (registered by name) or an id pydantic-ai resolves (else the
    run ends ``failed``, ``check_resolvable``); without one, the capability's ``model``.
    The input is in the run's log, so a recovered run asks the model it began with."""
    if chosen is None:
        return model
    if chosen in models:
        return models[chosen]
    await check_resolvable(agent, chosen, deps)
    return chosen


async def check_resolvable(agent: AbstractAgent[Any, Any], model_id: str, deps: Any) -> None:
    """End the run ``failed``, with pydantic-ai's reason, when it cannot resolve the model id
    the run's input gives (an unknown provider or name, a provider whose package or key this
    worker lacks): resolved as ``agent.run`` resolves it, by the agent's capabilities first,
    else ``infer_model``. Raised inside ``agent.run``, the error quarantined the run, as a
    bug of the function would, though no retry or release of it could help."""
    root = getattr(agent, "root_capability", None)
    try:
        found = None
        if root is not None and root.has_resolve_model_id:
            found = await root.resolve_model_id(ModelResolutionContext(agent=agent, deps=deps),
                                                model_id=model_id)
        if found is None:
            infer_model(model_id)
    except (UserError, ImportError, ValueError) as exc:
        raise EndRun(Fail(f"the model {model_id!r} the run's input names cannot be used: "
                          f"{exc}")) from None
