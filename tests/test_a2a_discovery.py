"""Discovery as A2A 1.0 says it (section 8), against a real ``durable a2a`` process: the host's
card at ``/.well-known/agent-card.json`` (8.2), each card in the shape of the protocol
version asked for and nothing of the other's (3.6, 8.3), its caching headers (8.6.1).

A card's shape is checked by the protocol's own definitions, strictly: a 1.0 card must parse
as the 1.0 ``AgentCard`` protobuf with no unknown field and print back the same; a 0.3 card
must be the SDK's 0.3 ``AgentCard`` model and dump back the same (its models ignore unknown
fields, so the round trip is what finds one)."""

from __future__ import annotations

from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from a2a.compat.v0_3.types import AgentCard as AgentCard03
from a2a.types import AgentCard
from google.protobuf.json_format import MessageToDict, ParseDict

from durable import catalog
from durable.client import Client
from durable.testing import Server
from tests.agent2agent import A2AServer, door, serving

__all__ = ["door"]  # the fixture

pytestmark = pytest.mark.timeout(240)

CARD = ".well-known/agent-card.json"


def publish(client: Client, *names: str) -> None:
    """Publish ``names`` to the catalog as a producer that has the agents does (no worker
    is needed for a card)."""
    catalog.publish(client.redis, [client.registry.agent(n) for n in names], "worker:test")


def strict_v1(body: dict[str, Any]) -> AgentCard:
    card = AgentCard()
    ParseDict(body, card)  # an unknown field raises
    assert MessageToDict(card) == body
    return card


def strict_v03(body: dict[str, Any]) -> AgentCard03:
    card = AgentCard03.model_validate(body)
    assert card.model_dump(exclude_none=True) == body, "fields a 0.3 card does not have"
    return card


def test_the_host_card_is_the_only_agents_or_the_chosen_ones(
        door: A2AServer, client: Client, server: Server, tmp_path: Path) -> None:
    """8.2: a client that knows only the host finds a card at its well-known address; with
    several agents and none chosen, a 404 that names the setting and lists each card."""
    def host(d: A2AServer) -> httpx.Response:
        return httpx.get(f"{d.url}/{CARD}", timeout=30)

    none = host(door)
    assert none.status_code == 404 and "no agent is published" in none.json()["error"]
    publish(client, "chat")
    only = host(door)
    assert only.status_code == 200, only.text
    card = strict_v1(only.json())
    assert card.name == "chat"
    assert [i.url for i in card.supported_interfaces] == [door.endpoint("chat")] * 2
    publish(client, "asker")
    several = host(door)
    assert several.status_code == 404
    assert "DURABLE_A2A_AGENT" in several.json()["error"]
    assert several.json()["agents"] == [
        {"name": n, "card": f"{door.url}/agents/{n}/{CARD}"} for n in ("asker", "chat")]
    with serving(server, tmp_path / "chosen", "--agent", "asker") as chosen:
        assert strict_v1(host(chosen).json()).name == "asker"
    with serving(server, tmp_path / "gone", "--agent", "nope") as gone:
        refused = host(gone)
        assert refused.status_code == 404 and "'nope'" in refused.json()["error"]
        assert "DURABLE_A2A_AGENT" in refused.json()["error"]


#: What a request asks for (headers; "query": the query parameter) -> the card's shape.
ASKED = [({}, "1.0"), ({"A2A-Version": "1.0"}, "1.0"), ({"A2A-Version": "1.0.2"}, "1.0"),
         ({"A2A-Version": "0.3"}, "0.3"), ({"A2A-Version": "0.3.0"}, "0.3"),
         ({"query": "0.3"}, "0.3"), ({"A2A-Version": "99.0"}, "refused")]


def test_a_card_has_the_shape_of_the_version_asked_for(door: A2AServer,
                                                      client: Client) -> None:
    """3.6.1, 8.3: the A2A-Version header or query parameter picks the card's shape (a patch
    number is ignored); no version: 1.0's. Each shape passes its version's strict check,
    security schemes included; a version with no card is refused."""
    publish(client, "chat")
    for asked, shape in ASKED:
        headers = {k: v for k, v in asked.items() if k != "query"}
        query = {"A2A-Version": asked["query"]} if "query" in asked else {}
        got = httpx.get(f"{door.endpoint('chat')}{CARD}", headers=headers, params=query,
                        timeout=30)
        if shape == "refused":
            assert got.status_code == 400 and "'99.0'" in got.json()["error"]
            continue
        assert got.status_code == 200, (asked, got.text)
        body = got.json()
        if shape == "1.0":
            card = strict_v1(body)
            assert [(i.protocol_version, i.url) for i in card.supported_interfaces] == \
                [("1.0", door.endpoint("chat")), ("0.3", door.endpoint("chat"))]
            assert body["securitySchemes"] == {"bearer": {"httpAuthSecurityScheme": {
                "scheme": "bearer", "description": "a token of the server's tokens file"}}}
            assert body["securityRequirements"] == [{"schemes": {"bearer": {}}}]
            assert "url" not in body and "security" not in body
        else:
            old = strict_v03(body)
            assert (old.url, old.protocol_version, old.preferred_transport) == \
                (door.endpoint("chat"), "0.3", "JSONRPC"), asked
            assert body["securitySchemes"] == {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "a token of the server's tokens file"}}
            assert body["security"] == [{"bearer": []}]
            assert "supportedInterfaces" not in body and "securityRequirements" not in body


def test_a_card_carries_caching_headers(door: A2AServer, client: Client,
                                        r: redis.Redis) -> None:
    """8.6.1: Cache-Control with max-age, an ETag of the card served (one per shape), the
    time its agent was published as Last-Modified; the ETag sent back gets a 304."""
    publish(client, "chat")
    url = f"{door.endpoint('chat')}{CARD}"
    v1 = httpx.get(url, timeout=30)
    v03 = httpx.get(url, headers={"A2A-Version": "0.3"}, timeout=30)
    assert v1.headers["cache-control"] == "max-age=60"
    assert v1.headers["vary"] == "A2A-Version"
    assert v1.headers["etag"].startswith('"') and v1.headers["etag"] != v03.headers["etag"]
    published = catalog.published(r, "chat")
    assert published is not None
    assert parsedate_to_datetime(v1.headers["last-modified"]).timestamp() == \
        published.published_at // 1000
    again = httpx.get(url, headers={"If-None-Match": v1.headers["etag"]}, timeout=30)
    assert again.status_code == 304 and not again.content
    assert again.headers["etag"] == v1.headers["etag"]
    other = httpx.get(url, headers={"If-None-Match": v03.headers["etag"]}, timeout=30)
    assert other.status_code == 200 and other.json() == v1.json()
