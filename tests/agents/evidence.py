"""The agent of the evidence tests (``tests/test_evidence.py``): a small CRM the test
controls, kept as a JSON file (``TEST_CRM``)::

    {"records": {"42": {"version": 1, "name": "Ada"}}, "denied": [], "checker": ""}

``crm.read`` reads a record and records the reference ``crm/<id>`` at its version; the
``crm`` checker reads the file again: a record gone, an id in ``denied`` or another version
is a reference that no longer holds; ``checker`` set to ``raise`` or ``hang`` makes the
checker raise or outlast its timeout.

The ``dossier`` agent reads its record, waits for input, and finishes with what it read;
told to refresh (``state.refresh``) it reads again first; told what failed without a
refresh (``replan``) it finishes naming it. ``TEST_EVIDENCE_POLICY`` (read at import: a
worker's environment) is its ``on_evidence_change``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from durable.agents import (
    Agent,
    Call,
    Decision,
    Finish,
    Lookup,
    Tool,
    ToolContext,
    Wait,
    register,
)
from durable.agents.evidence import Current, EvidenceChecker, EvidenceRef
from durable.log.state import RunState


def crm() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(os.environ["TEST_CRM"]).read_text())
    return data


def write_crm(path: Path, data: dict[str, Any]) -> None:
    """Replace the store's content at once (a reader never sees half of it)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


class DossierInput(BaseModel):
    id: str


@register
class CrmChecker(EvidenceChecker):
    source = "crm"
    timeout_s = 0.5

    def check(self, ref: EvidenceRef) -> Current:
        store = crm()
        if store.get("checker") == "raise":
            raise ConnectionError("crm unreachable")
        if store.get("checker") == "hang":
            time.sleep(30)
        record = store["records"].get(ref.id)
        if record is None:
            return Current.gone()
        if ref.id in store.get("denied", []):
            return Current.denied()
        return Current.at(record["version"])


@register
class CrmRead(Tool):
    name = "crm.read"
    effect_free = True

    def run(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        record = crm()["records"][args["id"]]
        ctx.evidence("crm", args["id"], record["version"])
        return record

    def lookup(self, key: str, args: dict[str, Any]) -> Lookup:
        return Lookup.not_applied()


@register
class Dossier(Agent):
    name = "dossier"
    input_model = DossierInput
    tools = ("crm.read",)
    evidence_sources = ("crm",)
    on_evidence_change = os.environ.get("TEST_EVIDENCE_POLICY",  # type: ignore[assignment]
                                        "refresh")

    def decide(self, state: RunState) -> Decision:
        read = Call("crm.read", {"id": state.input["id"]})
        if state.step == 0:
            return read
        if state.last_wait is None:
            return Wait("input", reason="send this dossier?", timeout_s=600)
        if state.refresh:
            return read
        if state.evidence_failed:
            return Finish({"replanned": [f"{r.source}/{r.id}: {r.why}"
                                         for r in state.evidence_failed]})
        last = state.last
        assert last is not None
        return Finish({"record": last.result, "reads": state.step})
