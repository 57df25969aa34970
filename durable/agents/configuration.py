"""The configuration a run is pinned to, and what a resume does when it changed.

An agent's configuration (``Agent.configuration``) is a flat ``{field: value}`` of strings:

- ``model``: the model id its model steps use ("" for an agent without one);
- ``prompt``: a digest of its prompt or instructions ("" without one);
- ``tools``: a digest of its tool set, each tool's name and the JSON schema of its
  arguments (``tools_digest``);
- ``policy``: its policy version (``Agent.policy_version``);

and any field an agent adds. A run records it once: in ``run_started`` when the producer
has the agent, else in the ``resume_validated`` event of the first job that drives it (a
run of an older log is pinned then too). Every job compares the pin with what the worker
has; for each changed field the agent's ``on_configuration_change`` says what is done
(``POLICIES``, strictest first):

- ``expire``: the run ends ``expired``, its reason naming the fields;
- ``reapprove``: an approval of the change (kind ``configuration``, bound to ``change_digest``)
  by the agent's ``upgrade_role``; approved, the run goes on under the new pin; rejected, it
  is quarantined;
- ``replan``: the run goes on under the new pin and the agent sees what changed
  (``state.config_changes``) at its next decision;
- ``continue``: the run goes on under the new pin.

Nothing here knows an agent or a registry: ``durable.agents`` and the worker's gates
(``workers.gates``) call it with plain data.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from durable.errors import UsageError

Policy = Literal["continue", "reapprove", "replan", "expire"]

#: Strictest first: when several fields changed, the strictest of their policies is applied.
POLICIES: tuple[Policy, ...] = ("expire", "reapprove", "replan", "continue")
#: The fields every agent's configuration has; ``"*"`` in a policy map names the others.
FIELDS = ("model", "prompt", "tools", "policy")
#: What a field without a declared policy gets: today's agents keep working.
DEFAULT_POLICY: Policy = "continue"

#: Hex digits kept of a digest in a pin: enough to tell two configurations apart (this is
#: no signature; an approval is bound to the full ``change_digest``).
SHORT = 16


def short_digest(value: Any) -> str:
    """A short SHA-256 of ``value`` as canonical JSON ("" for an empty value)."""
    if value in (None, "", [], {}):
        return ""
    data = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(data.encode()).hexdigest()[:SHORT]


def tools_digest(tools: Iterable[tuple[str, Any]]) -> str:
    """The digest of a tool set: ``(name, args_model)`` pairs, each tool's name and the JSON
    schema of its arguments (None for a tool that declares no model of them)."""
    return short_digest({name: model.model_json_schema() if model is not None else None
                         for name, model in tools} or None)


def pinned(config: Mapping[str, Any], policies: Mapping[str, str]) -> dict[str, str]:
    """What a run of an agent with ``config`` and ``on_configuration_change`` ``policies``
    records: the fields that are not empty (an absent field reads as "", ``changes``); {}
    for an agent that declares nothing (no policy, and no model, prompt or policy version:
    only the default tool digest), whose runs are not pinned and carry no pin's bytes."""
    kept = {field: str(value) for field, value in config.items() if value}
    return kept if policies or set(kept) - {"tools"} else {}


def checked_policies(agent: str, policies: Mapping[str, str]) -> None:
    """Refuse an unknown policy word or field name (``UsageError`` naming it)."""
    for field, word in policies.items():
        if word not in POLICIES:
            raise UsageError(
                f"agent {agent!r}: on_configuration_change[{field!r}] is {word!r}; expected "
                f"one of {', '.join(POLICIES)} (the agent was not registered)")
        if field not in FIELDS and field != "*":
            raise UsageError(
                f"agent {agent!r}: on_configuration_change names the field {field!r}; "
                f"expected one of {', '.join(FIELDS)} or '*' for any other field (the agent "
                "was not registered)")


def changes(pinned: Mapping[str, str], have: Mapping[str, str]) -> dict[str, list[str]]:
    """``{field: [pinned, now]}`` for every field that differs, in field order."""
    return {f: [pinned.get(f, ""), have.get(f, "")]
            for f in sorted(set(pinned) | set(have)) if pinned.get(f, "") != have.get(f, "")}


def policy_for(policies: Mapping[str, str], field: str) -> Policy:
    word = policies.get(field, policies.get("*", DEFAULT_POLICY))
    return next((p for p in POLICIES if p == word), DEFAULT_POLICY)


def actions(policies: Mapping[str, str], changed: Mapping[str, Any]) -> dict[str, str]:
    """The policy applied to each changed field."""
    return {f: policy_for(policies, f) for f in changed}


def strictest(applied: Mapping[str, str]) -> Policy:
    """The policy the run gets when its fields' policies are ``applied``."""
    for word in POLICIES:
        if word in applied.values():
            return word
    return DEFAULT_POLICY


def describe(changed: Mapping[str, list[str]]) -> str:
    """``model 'a' -> 'b', tools ...``: what changed, for a reason or a wait."""
    return ", ".join(f"{f} {old or '(none)'!r} -> {new or '(none)'!r}"
                     for f, (old, new) in changed.items())


def change_digest(run_id: str, changed: Mapping[str, list[str]]) -> str:
    """What an approval of the change is bound to: the run and every changed field's old
    and new value (full SHA-256)."""
    data = json.dumps({"run": run_id, "changes": dict(changed)}, sort_keys=True,
                      separators=(",", ":"))
    return hashlib.sha256(data.encode()).hexdigest()


def model_used(config: Mapping[str, str]) -> str:
    """What a model step records of the pin it ran under: ``model@prompt`` ("" when the
    configuration names neither)."""
    model, prompt = config.get("model", ""), config.get("prompt", "")
    return f"{model}@{prompt}" if model or prompt else ""
