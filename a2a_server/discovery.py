"""Where another agent finds a card, and the card in the shape it asked for.

**The host's card.** A client that knows only a host reads
``/.well-known/agent-card.json`` (A2A 1.0, section 8.2), the address the official
conformance kit reads too. Agents live under ``/agents/<name>/``, each with its card; the
host's card is the one published agent's, or the one ``DURABLE_A2A_AGENT`` (``--agent``)
names when several are published (``host_card``). With several and none named, that address
answers 404, its JSON body naming the setting and listing each agent's card: a card
describes one agent and one endpoint, so a card merging several would be a card of none.

**One shape per protocol version.** A 1.0 card and a 0.3 card differ in shape (0.3 has
``url``, ``preferredTransport`` and ``{"type": "http", "scheme": ...}`` security schemes,
1.0 ``supportedInterfaces`` and ``{"httpAuthSecurityScheme": {...}}``); the SDK's
``agent_card_to_dict`` merges both into one object, which a strict validator of either
version rejects. Here a card is served in one shape, the version's the client asks for with
the ``A2A-Version`` header or query parameter (3.6.1): ``0.3`` gets the 0.3 card (the
endpoint's 0.3 interface), ``1.0`` the 1.0 card. A request that names no version gets the
1.0 card: the operations read an empty version as 0.3 (3.6.2), but discovery comes before a
version is chosen, the 1.0 card lists the 0.3 interface in ``supportedInterfaces``, and the
official 1.0 kit reads the card without the header. A version neither shape is for is
refused (400).

**Caching** (8.6.1): ``Cache-Control: max-age``, an ``ETag`` (a digest of the card served),
``Last-Modified`` (when a worker published the agent), ``Vary: A2A-Version``; a request whose
``If-None-Match`` names the card's ETag gets 304.
"""

from __future__ import annotations

import hashlib
import json
from email.utils import formatdate
from typing import Any

from a2a.compat.v0_3.conversions import to_compat_agent_card
from a2a.types import AgentCard
from a2a.utils.constants import PROTOCOL_VERSION_0_3, PROTOCOL_VERSION_1_0, VERSION_HEADER
from google.protobuf.json_format import MessageToDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from durable.errors import DurableError

#: The setting that chooses the host's card among several agents.
HOST_AGENT_SETTING = "DURABLE_A2A_AGENT"
#: Seconds a client or cache may keep a card (workers publish a new version rarely).
MAX_AGE_S = 60
VERSIONS = (PROTOCOL_VERSION_1_0, PROTOCOL_VERSION_0_3)


class NoCard(DurableError):
    """No card to serve: ``status`` and a JSON ``body`` that says why."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("error", ""))
        self.status, self.body = status, body


def asked_version(request: Request) -> str:
    """The protocol version whose card shape ``request`` asks for ("1.0" when it names
    none), by ``Major.Minor`` (a patch number is ignored, 3.6); ``NoCard`` (400) for a version
    this server has no card for."""
    raw = (request.headers.get(VERSION_HEADER) or request.query_params.get(VERSION_HEADER)
           or "").strip()
    if not raw:
        return PROTOCOL_VERSION_1_0
    major, _, rest = raw.partition(".")
    minor = rest.partition(".")[0] or "0"
    version = f"{major}.{minor}"
    if version not in VERSIONS:
        raise NoCard(400, {"error": f"{VERSION_HEADER} {raw!r} is not a version this server "
                           f"speaks: ask for {' or '.join(VERSIONS)}"})
    return version


def shaped(card: AgentCard, version: str) -> dict[str, Any]:
    """``card`` as JSON in ``version``'s shape, and nothing of the other's."""
    if version == PROTOCOL_VERSION_0_3:
        out: dict[str, Any] = to_compat_agent_card(card).model_dump(exclude_none=True)
        if not out.get("supportsAuthenticatedExtendedCard"):
            out.pop("supportsAuthenticatedExtendedCard", None)
        return out
    shape: dict[str, Any] = MessageToDict(card)
    return shape


def host_card(names: list[str], chosen: str | None, card_url: Any) -> str:
    """The agent whose card the host's well-known address serves, among the published
    ``names``; ``NoCard`` (404) when there is none to choose or the one chosen is not
    published. ``card_url(name)``: the address of an agent's own card."""
    listed = [{"name": n, "card": card_url(n)} for n in names]
    if chosen:
        if chosen in names:
            return chosen
        raise NoCard(404, {"error": f"{HOST_AGENT_SETTING} names the agent {chosen!r}, which "
                           "is not published here (no worker has it)", "agents": listed})
    if len(names) == 1:
        return names[0]
    if not names:
        raise NoCard(404, {"error": "no agent is published here yet: a worker publishes "
                           "the agents it has when it starts", "agents": []})
    raise NoCard(404, {"error": f"{len(names)} agents are published here: set "
                       f"{HOST_AGENT_SETTING} (or durable a2a --agent) to the one whose card "
                       "this address serves; each agent's card is listed",
                       "agents": listed})


def card_response(request: Request, body: dict[str, Any], published_ms: int) -> Response:
    """The card ``body`` with its caching headers, or 304 when the client has it."""
    content = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    etag = '"' + hashlib.sha256(content).hexdigest()[:32] + '"'
    headers = {"Cache-Control": f"max-age={MAX_AGE_S}", "ETag": etag, "Vary": VERSION_HEADER}
    if published_ms > 0:
        headers["Last-Modified"] = formatdate(published_ms / 1000, usegmt=True)
    held = request.headers.get("if-none-match", "")
    if etag in {t.strip().removeprefix("W/") for t in held.split(",")} or held.strip() == "*":
        return Response(status_code=304, headers=headers)
    return Response(content, media_type="application/json", headers=headers)


def refusal(exc: NoCard) -> Response:
    return JSONResponse(exc.body, status_code=exc.status, headers={"Cache-Control": "no-store"})
