"""An agent card per published agent (``durable.catalog``): what another agent reads before
it calls one.

The card's one skill is the agent itself: its description says what to send, from the input
schema the workers published; the schema itself is in the card's capabilities as an
extension (``SCHEMA_EXTENSION``, its ``params``), for a caller that builds the input by
program. The card names one interface, JSON-RPC at ``<base>/agents/<name>/``, with both
protocol versions the endpoint answers (1.0's methods and 0.3's ``message/send``...).
"""

from __future__ import annotations

import json
from typing import Any

from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentExtension,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import PROTOCOL_VERSION_0_3, PROTOCOL_VERSION_1_0, TransportProtocol
from google.protobuf.struct_pb2 import Struct

from durable.catalog import Published

#: The extension whose ``params.schema`` is the agent's input JSON schema.
SCHEMA_EXTENSION = "urn:durable-agents:input-schema:v1"


def text_field(schema: dict[str, Any] | None) -> str | None:
    """The property a text message fills: the schema's only string property (or its only
    required one); None when there is no such single property."""
    if not schema:
        return None
    props = schema.get("properties")
    if not isinstance(props, dict):
        return None
    strings = [n for n, p in props.items() if isinstance(p, dict) and p.get("type") == "string"]
    if len(strings) == 1:
        return str(strings[0])
    required = [str(n) for n in schema.get("required") or () if n in strings]
    return required[0] if len(required) == 1 else None


def _describe(item: Published) -> str:
    field = text_field(item.schema)
    how = "Send the input as one data part, a JSON object matching the input schema " \
        f"({SCHEMA_EXTENSION} in the card's capabilities)"
    if field is not None:
        how += f", or as text: it becomes the field {field!r}"
    if item.schema is None:
        how = "This agent publishes no input schema: it cannot be started by name"
    props = (item.schema or {}).get("properties") or {}
    fields = ", ".join(f"{n} ({p.get('type', 'any')})" for n, p in props.items()
                       if isinstance(p, dict))
    return f"{how}." + (f" Fields: {fields}." if fields else "")


def card(item: Published, url: str, *, streaming: bool = True, push: bool = False,
         bearer: bool = True, basic: bool = False) -> AgentCard:
    """The card of the published agent ``item``, served at ``url`` (its JSON-RPC endpoint);
    ``bearer``, ``basic``: the schemes the server accepts (either one is enough)."""
    modes = ["application/json"] + (["text/plain"] if text_field(item.schema) else [])
    params = Struct()
    if item.schema is not None:
        params.update({"schema": json.loads(json.dumps(item.schema))})
    schemes = {}
    if bearer:
        schemes["bearer"] = SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
            scheme="bearer", description="a token of the server's tokens file"))
    if basic:
        schemes["basic"] = SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
            scheme="basic", description="the name and password of a console operator"))
    return AgentCard(
        name=item.name,
        description=f"Durable agent {item.name!r} (version {item.version}): each task is a "
                    "durable run, resumed after any crash, cancellable, one run per message id.",
        version=item.version or "0",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding=TransportProtocol.JSONRPC,
                           protocol_version=PROTOCOL_VERSION_1_0),
            AgentInterface(url=url, protocol_binding=TransportProtocol.JSONRPC,
                           protocol_version=PROTOCOL_VERSION_0_3)],
        capabilities=AgentCapabilities(
            streaming=streaming, push_notifications=push,
            extensions=[AgentExtension(uri=SCHEMA_EXTENSION, params=params,
                                       description="the input's JSON schema (draft 2020-12)")]),
        security_schemes=schemes,  # each one alone is enough: one requirement each
        security_requirements=[SecurityRequirement(schemes={s: StringList()})
                               for s in schemes],
        default_input_modes=modes,
        default_output_modes=["application/json"],
        skills=[AgentSkill(id=item.name, name=item.name, description=_describe(item),
                           tags=["durable", *item.tools], input_modes=modes,
                           output_modes=["application/json"])])

