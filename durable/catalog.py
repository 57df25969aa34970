"""The agent catalog in Redis: which agents are served, at which version, taking what input.

One hash, ``dx:agents`` (``keys.AGENTS``): field = agent name, value = JSON ``{name,
version, schema, tools, published_at, by, budgets}``, where ``schema`` is the input model's
JSON schema (pydantic's ``model_json_schema()``, draft 2020-12) and ``budgets`` the agent's
default limits.

- A worker publishes every agent it loads when it starts (``workers.runtime``), or once
  Redis answers if it did not then; its entry replaces any other: workers are the ones
  that run the agent.
- A producer that imports the agent validates with the model itself, and publishes the
  entry only where none exists yet (a worker's entry is never replaced by a producer's).
- A producer that does not import the agent starts it by name: the input is validated
  against the published schema (``jsonschema``), the defaults the schema declares are
  filled in, and the run records the published version and tools.

What the schema cannot say is not checked by name: pydantic's own validators, and its
lax coercions (``"3"`` for an integer is refused here, where the model would accept it).
Entries are never removed: an agent no worker serves any more stays listed until its
field is deleted (``HDEL dx:agents NAME``).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis

from durable.agents import Agent
from durable.errors import InvalidInput, UsageError
from durable.flow.budgets import checked as checked_budgets
from durable.log import keys
from durable.log.store import now_ms


@dataclass(frozen=True)
class Published:
    """One agent as the catalog lists it."""

    name: str
    version: str
    #: The input's JSON schema; None when the model has none (then only a process that
    #: imports the agent can start it).
    schema: dict[str, Any] | None
    tools: tuple[str, ...]
    published_at: int
    by: str
    #: The agent's default budgets ("steps", "model_calls", "tokens", "usd_micros"), recorded
    #: by a run.
    budgets: dict[str, int] = field(default_factory=dict)
    #: Input fields a producer must seal (``Agent.sensitive_input``).
    sensitive: tuple[str, ...] = ()


def entry(agent: Agent, by: str) -> Published:
    """What the catalog says about ``agent``, published by ``by``."""
    try:
        schema: dict[str, Any] | None = agent.input_model.model_json_schema()
    except Exception:  # a model with types JSON schema cannot describe
        schema = None
    return Published(name=agent.name, version=str(agent.version), schema=schema,
                     tools=tuple(agent.tools), published_at=now_ms(), by=by,
                     budgets=checked_budgets(agent.budgets),
                     sensitive=agent.sensitive_input())


def _encode(item: Published) -> str:
    return json.dumps({"name": item.name, "version": item.version, "schema": item.schema,
                       "tools": list(item.tools), "published_at": item.published_at,
                       "by": item.by, "budgets": item.budgets,
                       "sensitive": list(item.sensitive)}, sort_keys=True)


def publish(client: redis.Redis, agents: Iterable[Agent], by: str, *,
            replace: bool = True) -> list[str]:
    """Publish ``agents`` (``replace=False``: only those not listed yet); returns the names
    written."""
    items = [entry(agent, by) for agent in agents]
    if not items:
        return []
    if replace:
        client.hset(keys.AGENTS, mapping={i.name: _encode(i) for i in items})
        return [i.name for i in items]
    pipe = client.pipeline(transaction=False)
    for item in items:
        pipe.hsetnx(keys.AGENTS, item.name, _encode(item))
    return [i.name for i, written in zip(items, pipe.execute(), strict=True) if written]


def published(client: redis.Redis, name: str) -> Published | None:
    """The catalog's entry for ``name``; None when there is none or it cannot be read."""
    raw = client.hget(keys.AGENTS, name)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        schema = data.get("schema")
        return Published(name=str(data["name"]), version=str(data.get("version", "")),
                         schema=schema if isinstance(schema, dict) else None,
                         tools=tuple(str(t) for t in data.get("tools") or ()),
                         published_at=int(data.get("published_at") or 0),
                         by=str(data.get("by", "")),
                         budgets={str(k): int(v) for k, v in
                                  (data.get("budgets") or {}).items()},
                         sensitive=tuple(str(n) for n in data.get("sensitive") or ()))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def names(client: redis.Redis) -> list[str]:
    """Every agent name the catalog lists."""
    return sorted(n.decode() if isinstance(n, bytes) else str(n)
                  for n in client.hkeys(keys.AGENTS))


def producer_id() -> str:
    """``by`` for entries a producer publishes."""
    return f"client:{socket.gethostname()}:{os.getpid()}"


@functools.cache
def _filling() -> Any:
    """jsonschema's validator class whose ``properties`` also sets each absent property's
    declared default (the extension jsonschema's documentation gives), made once, when the
    first start by name is checked."""
    from jsonschema import Draft202012Validator, validators

    properties = Draft202012Validator.VALIDATORS["properties"]

    def fill_defaults(validator: Any, props: Any, instance: Any,
                      schema: Any) -> Iterator[Any]:
        if isinstance(instance, dict):
            for name, sub in props.items():
                if isinstance(sub, dict) and "default" in sub:
                    instance.setdefault(name, copy.deepcopy(sub["default"]))
        yield from properties(validator, props, instance, schema)

    return validators.extend(Draft202012Validator, {"properties": fill_defaults})


def validate(item: Published, data: Any) -> Any:
    """``data`` checked against the published schema, with its defaults filled in (a copy);
    raises ``InvalidInput``."""
    if item.schema is None:
        raise UsageError(f"agent {item.name!r} publishes no input schema: start it from a "
                         "process that imports it (DURABLE_AGENTS)")
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(item.schema)
    except SchemaError as exc:
        raise UsageError(f"agent {item.name!r} publishes an unusable input schema: "
                         f"{exc.message}") from None
    checker = Draft202012Validator(item.schema,
                                   format_checker=Draft202012Validator.FORMAT_CHECKER)
    errors = sorted(checker.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        raise InvalidInput(item.name, "; ".join(
            f"{'.'.join(str(p) for p in e.absolute_path) or 'input'}: {e.message}"
            for e in errors))
    filled = copy.deepcopy(data)
    for _ in _filling()(item.schema).iter_errors(filled):
        pass  # valid already: this pass only fills in the defaults
    return filled
