"""The log's hash chain: every entry is chained to the one before it in its run's log, so an
entry edited, removed, added or moved shows, and ``verify`` names the first one.

``append.lua`` extends the chain as it appends (in the same call: no round trip, no read of
an entry) over exactly what it writes, the entry's id and its event bytes ``e``::

    h_0 = SHA-1("durable-chain-v1\\n" + run id)
    h_i = SHA-1(hex(h_{i-1}) + entry id + "\\n" + e)

The id is in the hash because it is part of the evidence (an entry's time is its id's) and
because reordering entries changes it; the newline ends the id (ids hold none), so no two
(id, bytes) pairs give the same input.

Where it is kept:

- each entry carries ``h``: the chain value after it, cut to 7 bits (its first byte modulo
  128: a stream's listpack keeps 0-127 in one byte, so the chain adds 2 bytes to an entry).
  That is enough to *locate* a break: the first entry whose bits do not match is the one
  changed, or the one after an entry removed, added or moved (an edit whose 7 bits happen
  to match, 1 in 128, shows at the entry after it, since every value after it differs).
- the full value after the last entry, the **head**, is kept with the run's projection, in
  ``last`` (``"<entry id> <hex head>"``: the entry the script wrote last and the chain
  after it change together, and the script reads them together). A change anywhere in the
  log changes the head, 7 bits or not.
- the head is **sealed** (``durable.log.sealer``): signed, with a key an admin registered,
  when the run ends and, while it runs, by its lease holder every so many entries or
  seconds and when a job leaves it waiting. A seal is kept beside the run in
  ``dx:{R}:seal``; it expires and is archived with the run.
- the chain value before the last checkpoint entry is kept with the projection too, in
  ``ckh`` (``"<entry id> <hex value>"``): a load, which reads the log from that entry on,
  checks the chain from there (``check_loaded``) without reading the entries before it.

The chain catches a change by anyone who does not also recompute it; a writer who
recomputes every ``h`` and the head after an edit is caught by a seal made before the
edit, which they cannot make again without the signer's private key
(``durable.audit.seals`` checks it against the registry): ``verify`` holds the chain value
at the sealed entry against the signed one, and so does a worker's load, when the sealed
entry is in the part it checks. A run not sealed (no key configured) has the chain alone.

Who checks what: ``verify``, the whole log from its first entry; a worker or reconciler
that loads a run, from its last checkpoint (or its first entry) to its end; the append
that precedes a seal, from the last seal (or the first entry) to its end, in the script
(``append.lua``'s ``v`` flag). A chain that does not hold there quarantines the run,
naming the entry, and nothing is sealed.

SHA-1 because it is the hash Redis's Lua has (``redis.sha1hex``, under a microsecond per
entry; a SHA-256 written in Lua would cost more than the rest of an append). Its known
weakness is collisions (a chosen-prefix collision costs about 2^63 operations): a forger who
controls the bytes of an entry before it is written could prepare two versions with one
chain value. Second preimages, which changing an existing log needs, are not known to be
feasible.

Entries written before the chain existed carry no ``h``, and a run's projection without a
head in ``last`` has none yet: the chain starts at the first entry written after (from
``h_0``), and ``verify`` reports the run "unchained before" it rather than failing. Every
entry after the first chained one must carry ``h``. Nothing legitimate removes an entry from
a live run's log (no process may ``XDEL`` or ``XTRIM``); a terminal run leaves Redis whole:
``durable archive`` writes its entries' bytes and links, head and seal to a file that
verifies on its own (``durable.audit.archives``), then deletes its keys together;
``DURABLE_RETENTION`` expires them together.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: The first line of ``h_0``'s input (the version of this construction).
DOMAIN = b"durable-chain-v1\n"

#: Each entry keeps its chain value modulo this (see above).
TAG_MOD = 128


def genesis(run_id: str) -> str:
    """``h_0``: the chain value before a run's first chained entry (hex)."""
    return hashlib.sha1(DOMAIN + run_id.encode()).hexdigest()


def link(prev: str, entry_id: str, data: bytes) -> str:
    """The chain value after the entry ``entry_id`` with event bytes ``data`` (hex)."""
    return hashlib.sha1(prev.encode() + entry_id.encode() + b"\n" + data).hexdigest()


def tag(head: str) -> int:
    """The part of a chain value an entry carries."""
    return int(head[:2], 16) % TAG_MOD


def split_last(value: Any) -> tuple[str, str | None]:
    """The projection's ``last``: (the entry id the script wrote last, the chain's head
    after it, or None for a run not chained yet)."""
    text = value.decode() if isinstance(value, bytes) else str(value or "")
    entry_id, _, head = text.partition(" ")
    return entry_id, head or None


@dataclass
class ChainCheck:
    """What ``check`` found in one run's log."""

    #: The first entry that does not chain (its id, or the id expected where one is
    #: missing) and why; None when the chain holds.
    bad_entry: str | None = None
    problem: str | None = None
    #: Entries written before the chain started (they carry no ``h``), and the first one
    #: that does carry it.
    unchained: int = 0
    first_chained: str | None = None
    #: Entries checked.
    entries: int = 0
    #: The chain value after each entry asked for (seals), up to where the chain breaks.
    values: dict[str, str] = field(default_factory=dict)
    #: The chain value before the last chained entry checked (what a seal of it keeps).
    before: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def fail(self, entry_id: str, why: str) -> ChainCheck:
        self.bad_entry, self.problem = entry_id, f"entry {entry_id} {why}"
        return self


def check(run_id: str, raw: Iterable[tuple[Any, dict[Any, Any]]], last: Any,
          keep: Iterable[str] = (), *, start: tuple[str, str] | None = None,
          sealed: tuple[str, str] | None = None) -> ChainCheck:
    """Recompute ``run_id``'s chain over its log as read (``raw``: stream entries in order)
    and hold it against the entries' ``h`` and the head recorded in the projection's
    ``last``; ``keep``: entry ids whose chain values to return (``values``).

    ``start``: (entry id, the chain value before it): check from that entry on, not from
    the run's first (entries of ``raw`` before it are skipped; it must be there).
    ``sealed``: (entry id, the chain value after it that a seal signed): where the check
    passes that entry, the value must be the signed one, all 160 bits of it."""
    wanted = set(keep)
    values: dict[str, str] = {}
    found = ChainCheck(values=values)
    head: str | None = start[1] if start else None
    prev = ""
    ids: list[str] = []
    for entry_id, fields in raw:
        eid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        if start is not None and not ids and eid != start[0]:
            if _id_key(eid) < _id_key(start[0]):
                continue
            return found.fail(start[0], "(where the chain is checked from: the last "
                              "checkpoint or seal) is missing: it was removed")
        found.entries += 1
        ids.append(eid)
        carried = fields.get(b"h")
        if carried is None:
            if head is None:
                found.unchained += 1
                prev = eid
                continue
            return found.fail(eid, f"carries no chain link, after chained entries (up to "
                              f"{prev}): it was written around the append script")
        if head is None:
            head, found.first_chained = genesis(run_id), eid
        found.before = head
        head = link(head, eid, fields.get(b"e") or b"")
        if eid in wanted:
            values[eid] = head
        if not _is_tag(carried, head):
            before = f"entry {prev}" if prev else (
                "the chain value kept for it (the last checkpoint's)" if start else
                "the run's start")
            return found.fail(eid, f"does not chain to {before}: it was changed, or an "
                              "entry between them was removed, added or moved")
        if sealed is not None and eid == sealed[0] and head != sealed[1]:
            return found.fail(eid, "does not end the chain its seal signed: the log up to "
                              "it was rewritten (its links recomputed) after it was sealed")
        prev = eid
    if start is not None and not ids:
        return found.fail(start[0], "(where the chain is checked from: the last checkpoint "
                          "or seal) is missing: it was removed")
    last_id, recorded = split_last(last)
    if recorded is None:
        if head is not None:
            found.problem = ("the run's projection holds no chain head, though its log is "
                             "chained: the head was removed")
            found.bad_entry = prev
        return found
    if head is None:
        what = f"its {found.entries} entries carry" if found.entries else "the log has"
        found.problem = f"the projection records a chain head but {what} no chain link"
        found.bad_entry = found.first_chained or last_id
        return found
    if prev != last_id:
        if _id_key(last_id) > _id_key(prev):
            return found.fail(last_id, f"(the last the append script wrote) is missing: the "
                              f"log ends at {prev}, entries after it were removed")
        past = next((i for i in ids if _id_key(i) > _id_key(last_id)), prev)
        return found.fail(past, f"is past {last_id}, the last entry the append script "
                          "wrote: it was appended around the script")
    if head != recorded:
        found.problem = (f"the chain over the log does not end at the head recorded after "
                         f"entry {last_id}: an entry was changed and the links after it "
                         "forged, or the head was changed")
        found.bad_entry = last_id
    return found


def _is_tag(carried: Any, head: str) -> bool:
    try:
        return int(carried) == tag(head)
    except ValueError:
        return False


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return 0, 0


@dataclass(frozen=True)
class Tail:
    """What a load reads beside the log to check its chain (``lease_acquire.lua``): the
    projection's ``last``, ``ckpt`` and ``ckh`` ("" when it has none), and the seal's
    (entry, chain value after it), if there is one that keeps it."""

    last: Any
    ckpt: str = ""
    ckh: str = ""
    sealed: tuple[str, str] | None = None


def check_loaded(run_id: str, raw: Iterable[tuple[Any, dict[Any, Any]]],
                 tail: Tail) -> ChainCheck | None:
    """The chain of the part of a run's log a load read (``raw``: from its last checkpoint,
    or its first entry when it has none), held against the head and, where it passes the
    sealed entry, the seal's value. None: not checkable (a checkpoint written before its
    chain value was kept)."""
    start = None
    if tail.ckpt:
        entry, _, value = tail.ckh.partition(" ")
        if entry != tail.ckpt or not value:
            return None
        start = (entry, value)
    return check(run_id, raw, tail.last, start=start, sealed=tail.sealed)
