"""``durable archive``: terminal runs' evidence to compressed files, then their keys away.

For each terminal run last updated before the cutoff (found in the ``dx:runs:<state>``
indexes), the evidence of ``durable export`` (its log, effects and summary; sealed fields
stay sealed), with its large values (``blob`` lines: each value as stored, which its digest
in the log checks) and its hash chain and seal (each entry's bytes and link, the head: the
file verifies on its own, ``durable verify-archive``), is written to
``<dir>/<run>.jsonl.gz``, made durable (fsync, then an atomic rename), and only then are
the run's keys deleted by ``archive_delete.lua``, which refuses
when the run moved on since it was read (a late reconciliation) or is held. The run is then
taken out of the global indexes. A crash between the file and the delete leaves both: the
next archive writes the file again and deletes.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from durable.log import keys
from durable.log.export import export_lines
from durable.log.handle import text
from durable.log.state import TERMINAL
from durable.log.store import EventLog


@dataclass
class Archived:
    written: list[str] = field(default_factory=list)
    #: Run id -> why it was left in Redis (it changed, or is held).
    skipped: dict[str, str] = field(default_factory=dict)


def candidates(elog: EventLog, cutoff_ms: int, limit: int) -> list[str]:
    """Terminal runs last updated at or before ``cutoff_ms``, oldest first."""
    found: list[tuple[float, str]] = []
    for state in sorted(TERMINAL):
        for shard in elog.keys.shard_ids():
            for member, score in elog.redis.zrangebyscore(elog.keys.runs_in_state(state, shard),
                                                          "-inf", cutoff_ms, 0, limit,
                                                          withscores=True):
                found.append((score, text(member)))
    return [run_id for _, run_id in sorted(found)[:limit]]


def archive(elog: EventLog, directory: Path, cutoff_ms: int, *, limit: int = 1000) -> Archived:
    directory.mkdir(parents=True, exist_ok=True)
    report = Archived()
    for run_id in candidates(elog, cutoff_ms, limit):
        proj = elog.projection(run_id)
        if not proj:  # expired or deleted already: only its index entries remain
            _unindex(elog, run_id, "")
            continue
        state, version = proj.get("state", ""), proj.get("version", "")
        if state not in TERMINAL:
            report.skipped[run_id] = f"state {state}"
            continue
        _write(directory / f"{run_id}.jsonl.gz", export_lines(elog, run_id, keep_sealed=True,
                                                              with_blobs=True,
                                                              with_chain=True))
        reply = elog.scripts.archive_delete(
            keys=[elog.keys.log(run_id), elog.keys.run(run_id), elog.keys.ledger(run_id),
                  elog.keys.lease(run_id), elog.keys.fence(run_id), elog.keys.queued(run_id),
                  elog.keys.blobs(run_id), elog.keys.seal(run_id)],
            args=[version])
        tag = text(reply[0])
        if tag != "ok":
            report.skipped[run_id] = "held by a lease" if tag == "held" else \
                f"changed since it was read (now {text(reply[2])} at version {text(reply[1])})"
            continue
        _unindex(elog, run_id, state)
        report.written.append(run_id)
    return report


def _write(path: Path, lines: Iterable[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", filename=path.name[:-3]) as out:
            for line in lines:
                out.write(line.encode() + b"\n")
        raw.flush()
        os.fsync(raw.fileno())
    tmp.replace(path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unindex(elog: EventLog, run_id: str, state: str) -> None:
    shard = elog.keys.shard_of(run_id)
    pipe = elog.redis.pipeline(transaction=False)
    for index in ([elog.keys.runs_in_state(state, shard)] if state else
                  [elog.keys.runs_in_state(s, shard) for s in sorted(TERMINAL)]):
        pipe.zrem(index, run_id)
    pipe.zrem(elog.keys.runs_index(shard), run_id)
    pipe.zrem(elog.keys.due(shard), run_id)
    pipe.hdel(keys.QUARANTINE, run_id)
    pipe.hdel(keys.CANCEL_LATENCY, run_id)
    pipe.execute()
