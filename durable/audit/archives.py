"""Verifying an archive file: a run's evidence outlives its keys (``durable verify-archive``).

``durable archive`` writes a terminal run's evidence to ``<run>.jsonl.gz`` and deletes its
keys (``durable.log.archive``); the file keeps what the log's hash chain was computed over
(each entry's bytes, ``raw``, and link, ``h``), the head and the seal (the ``chain``
line), and the large values (``blob`` lines; ``durable.log.export``). So the archived run
is checked as it was in Redis, by the file alone and the approver registry:

- ``decodable``, ``contiguous``: every entry's bytes decode, with the seqs 1, 2, 3...;
- ``readable``: each entry's readable fields (what a reader of the JSON, DuckDB, sees) are
  what its bytes decode to: editing the JSON without the bytes is named;
- ``chain``, ``seal``: as ``verify`` (``durable.log.chain``, ``durable.audit.seals``),
  naming the first entry that does not chain;
- ``large_values``: each value's bytes match the digest its outcome recorded.

A file archived before the chain was kept in archives has no ``raw`` bytes to hash: its
``chain`` check says so and passes, as ``verify`` does for a log written before the chain.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
from pathlib import Path
from typing import Any

import msgspec

from durable.audit import seals
from durable.audit.verify import Report, chain_shown
from durable.controls.approvers import Approvers
from durable.errors import UsageError
from durable.log import blobs, chain
from durable.log import events as ev
from durable.log.entries import decode_entry
from durable.log.sealer import Seal
from durable.log.state import BlobRef

#: The fields of an event line that are not the event's own.
_ARCHIVED = ("kind", "id", "raw", "h")


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of an archive file (gzip, or plain), or a one-line ``UsageError``."""
    try:
        opener: Any = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError, EOFError) as exc:
        raise UsageError(f"cannot read the archive {path}: {exc}") from None


def verify_archive(path: Path, registry: Approvers, *,
                   require_seal: bool = False) -> Report:
    """Check the archive file at ``path`` (see the module doc)."""
    lines = read_lines(path)
    events = [line for line in lines if line.get("kind") == "event"]
    kept = next((line for line in lines if line.get("kind") == "chain"), None)
    summary = next((line for line in lines if line.get("kind") == "summary"), {})
    run_id = str((kept or summary).get("run", "")) or path.name.split(".jsonl")[0]
    report = Report(run_id)
    for name in ("decodable", "contiguous", "readable", "chain", "seal", "large_values"):
        report.checks[name] = "ok"
    report.events = len(events)
    if not events:
        report.fail("contiguous", "the archive holds no entry")
        return report
    if kept is None or any("raw" not in line for line in events):
        report.checks["chain"] = report.checks["seal"] = (
            "unchained: archived without the entries' bytes (before archives kept the chain)")
        if require_seal:
            report.fail("seal", report.checks["seal"])
        return report
    raw: list[tuple[str, dict[bytes, bytes]]] = []
    for line in events:
        try:
            fields = {b"e": base64.b64decode(str(line["raw"]), validate=True)}
        except (binascii.Error, ValueError):
            report.fail("decodable", f"{line.get('id')}: its bytes are not base64")
            return report
        if "h" in line:
            fields[b"h"] = str(line["h"]).encode()
        raw.append((str(line.get("id", "")), fields))
    refs = _entries(report, run_id, raw, events)
    sealed = Seal.parse(kept["seal"]) if kept.get("seal") else None
    found = chain.check(run_id, raw, kept.get("last", ""),
                        keep=[sealed.entry] if sealed else ())
    if found.problem is not None:
        report.bad_entry = found.bad_entry
        report.fail("chain", found.problem)
    else:
        report.checks["chain"] = chain_shown(found)
    state = str(summary.get("state", ""))
    seal = seals.check(registry, run_id, kept.get("seal"), found, raw[-1][0], state,
                       require=require_seal)
    if seal.problem is not None:
        report.fail("seal", seal.problem)
    else:
        report.checks["seal"] = seal.shown
    stored = {str(line.get("field")): str(line.get("data", "")).encode()
              for line in lines if line.get("kind") == "blob"}
    for entry_id, ref in refs:
        problem = blobs.check(ref, stored.get(ref.field))
        if problem is not None:
            report.fail("large_values", f"{entry_id}: {problem}")
    return report


def _entries(report: Report, run_id: str, raw: list[tuple[str, dict[bytes, bytes]]],
             events: list[dict[str, Any]]) -> list[tuple[str, BlobRef]]:
    """Decode the entries' bytes in order, checking their seqs and their readable lines;
    returns the large values they refer to."""
    actor = ""
    refs: list[tuple[str, BlobRef]] = []
    for position, ((entry_id, fields), line) in enumerate(zip(raw, events, strict=True), 1):
        entry = decode_entry(entry_id, fields, run_id, actor)
        if entry.event is None:
            if "decodable" not in report.failed:
                report.fail("decodable", f"{entry_id}: {entry.error}")
            continue
        actor = entry.event.actor
        if entry.event.seq != position and "contiguous" not in report.failed:
            report.fail("contiguous", f"{entry_id}: seq {entry.event.seq}, expected {position}")
        shown = {k: v for k, v in line.items() if k not in _ARCHIVED}
        if shown != json.loads(msgspec.json.encode(ev.to_builtins(entry.event))) \
                and "readable" not in report.failed:
            report.fail("readable", f"{entry_id}: its readable fields are not what its "
                        "bytes hold (the JSON was edited)")
        ref = blobs.ref_of(entry.event)
        if ref is not None:
            refs.append((entry_id, ref))
    return refs
