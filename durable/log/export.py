"""``durable export``: a run's evidence as JSON lines (its log, then its effects).

The first line names the format and its version (``{"kind": "format", "format":
"durable-run", "version": 1}``): a saved run is read back by later versions (a test of
agent code, ``durable.audit.offline``), which refuse a newer one by name. Each other line
is one object with a ``kind``: ``event`` (the entry id as ``id`` and the event's fields),
``effect`` (an idempotency key with its ledger status and the attempts seen in the log) and
``summary``; an archive adds a ``blob`` line per large value (``field``, ``sha256``,
``size`` and ``data``: the value's JSON as stored, sealed fields sealed). An outcome whose
result is a large value shows its reference (``blob``), not the value. DuckDB reads it with
``read_json('run.jsonl')``.

An archive (and a saved run, ``durable export RUN --saved``) also keeps what the log's hash
chain was computed over (``durable.log.chain``), so that the file verifies once the run's
keys are gone (``durable verify-archive``): each event line's entry bytes (``raw``, base64)
and link (``h``), and a ``chain`` line before the summary with the projection's ``last``
(the last entry id and the chain head) and ``seal``.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import msgspec

from durable.log import blobs
from durable.log import events as ev
from durable.log.fold import fold
from durable.log.handle import text
from durable.log.store import EventLog
from durable.security.sealing import shown_struct

#: What the first line of an export (and an archive) names: its format and version.
FORMAT = "durable-run"
VERSION = 1


def export_lines(elog: EventLog, run_id: str, *, keep_sealed: bool = False,
                 with_blobs: bool = False, with_chain: bool = False) -> Iterator[str]:
    """The evidence lines. Sealed fields are shown in clear to a caller holding their key,
    else as ``***``; ``keep_sealed`` keeps their envelopes as they are, ``with_blobs``
    adds the large values and ``with_chain`` the chain (an archive: see above)."""
    enc = msgspec.json.Encoder()
    yield enc.encode({"kind": "format", "format": FORMAT, "version": VERSION,
                      "run": run_id}).decode()
    raw = elog.redis.xrange(elog.keys.log(run_id))
    entries = elog.entries(run_id, raw)
    effects: dict[str, dict[str, Any]] = {}
    decoded = []
    for entry, (_, fields) in zip(entries, raw, strict=True):
        chained: dict[str, Any] = {}
        if with_chain:
            chained["raw"] = base64.b64encode(fields.get(b"e") or b"").decode()
            if b"h" in fields:
                chained["h"] = int(fields[b"h"])
        if entry.event is None:
            yield enc.encode({"kind": "event", "run": run_id, "id": entry.id,
                              "type": "undecodable", "error": entry.error,
                              **chained}).decode()
            continue
        e = entry.event
        decoded.append(e)
        # Sealed fields: in clear for a caller holding their key, else "***".
        yield enc.encode({"kind": "event", "id": entry.id,
                          **ev.to_builtins(e if keep_sealed else
                                           shown_struct(e, elog.keyring)),
                          **chained}).decode()
        key = getattr(e, "key", None)
        if key is not None:
            fx = effects.setdefault(key, {"kind": "effect", "run": run_id, "key": key,
                                          "step": getattr(e, "step", None), "dispatches": 0,
                                          "outcomes": []})
            if isinstance(e, ev.ActionDispatched):
                fx["dispatches"] += 1
            elif not isinstance(e, ev.StepDecided):
                fx["outcomes"].append(e.__struct_config__.tag)
    raw = elog.redis.hgetall(elog.keys.ledger(run_id))
    ledger = {k.decode(): v.decode() for k, v in raw.items()}
    for key, fx in effects.items():
        fx["ledger"] = ledger.get(key)
        yield enc.encode(fx).decode()
    if with_blobs:
        refs = {ref.field: ref for e in decoded
                if (ref := blobs.ref_of(e)) is not None}
        for name, data in sorted(blobs.stored(elog.redis, elog.keys, run_id).items()):
            ref = refs.get(name)
            yield enc.encode({"kind": "blob", "run": run_id, "field": name,
                              "sha256": ref.sha256 if ref else None,
                              "size": len(data), "data": data.decode()}).decode()
    if with_chain:
        last = elog.redis.hget(elog.keys.run(run_id), "last")
        seal = elog.redis.get(elog.keys.seal(run_id))
        yield enc.encode({"kind": "chain", "run": run_id, "last": text(last or b""),
                          "seal": text(seal) if seal is not None else None}).decode()
    state = fold(decoded, window=elog.window)
    yield enc.encode({"kind": "summary", "run": run_id, "state": state.state,
                      "version": state.version, "steps": state.step,
                      "events": len(entries)}).decode()
