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
- a terminal run's head is **sealed**: signed by the process that ended it, with a key an
  admin registered in the approver registry with the role ``sealer`` (``Sealer``,
  ``DURABLE_SEAL_KEY``), over ``b"durable-seal-v1\n"`` + the canonical JSON of
  ``{"entry", "head", "run"}``; the seal (``Seal``: signer, key fingerprint, entry,
  signature) is kept beside the run in ``dx:{R}:seal`` (its own key: a value over 64
  bytes would turn the small projection hash into a full hash table), written by
  ``seal.lua`` right after the append that ended the run, only while the projection's
  ``last`` is still the one signed; it expires and is archived with the run.

The chain catches a change by anyone who does not also recompute it; a writer who
recomputes every ``h`` and the head after an edit is caught by the seal, which they cannot
make without the signer's private key (``durable.audit.seals`` checks it against the
registry). A run not sealed (no key configured, not terminal yet) has the chain alone.

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

import base64
import hashlib
import json
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from durable.errors import UsageError
from durable.log.handle import RunHandle, text
from durable.log.keys import KeyLayout
from durable.log.state import TERMINAL
from durable.security.signing import (
    fingerprint,
    load_private_key,
    public_key_of,
    read_key_file,
    statement,
)
from durable.settings import Settings

#: The first line of ``h_0``'s input (the version of this construction).
DOMAIN = b"durable-chain-v1\n"

#: What a seal's signature is made over starts with this line.
SEAL_DOMAIN = b"durable-seal-v1\n"

#: The role a seal's signer holds in the approver registry.
SEAL_ROLE = "sealer"

log = logging.getLogger("durable.log")

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

    @property
    def ok(self) -> bool:
        return self.problem is None

    def fail(self, entry_id: str, why: str) -> ChainCheck:
        self.bad_entry, self.problem = entry_id, f"entry {entry_id} {why}"
        return self


def check(run_id: str, raw: Iterable[tuple[Any, dict[Any, Any]]], last: Any,
          keep: Iterable[str] = ()) -> ChainCheck:
    """Recompute ``run_id``'s chain over its log as read (``raw``: stream entries in order)
    and hold it against the entries' ``h`` and the head recorded in the projection's
    ``last``; ``keep``: entry ids whose chain values to return (``values``)."""
    wanted = set(keep)
    values: dict[str, str] = {}
    found = ChainCheck(values=values)
    head: str | None = None
    prev = ""
    ids: list[str] = []
    for entry_id, fields in raw:
        eid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
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
        head = link(head, eid, fields.get(b"e") or b"")
        if eid in wanted:
            values[eid] = head
        if not _is_tag(carried, head):
            before = f"entry {prev}" if prev else "the run's start"
            return found.fail(eid, f"does not chain to {before}: it was changed, or an "
                              "entry between them was removed, added or moved")
        prev = eid
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


# Seals --------------------------------------------------------------------------------------


def seal_statement(run_id: str, entry_id: str, head: str) -> bytes:
    """The bytes a seal signs: the run's chain ``head`` after its entry ``entry_id``."""
    return statement(SEAL_DOMAIN, {"entry": entry_id, "head": head, "run": run_id})


@dataclass(frozen=True)
class Seal:
    """A signature over a run's chain head: by the registry name ``by`` (whose key's
    fingerprint is ``key``), covering the log up to ``entry``."""

    by: str
    key: str
    entry: str
    sig: str

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def parse(cls, value: Any) -> Seal | None:
        """A stored seal (``dx:{R}:seal``); None when it is not one."""
        try:
            body = json.loads(value)
            return cls(**{name: str(body[name]) for name in ("by", "key", "entry", "sig")})
        except (ValueError, TypeError, KeyError):
            return None


class Sealer:
    """Seals the chain heads of the runs this process ends (``DURABLE_SEAL_KEY``, registered
    as ``DURABLE_SEAL_SIGNER``)."""

    def __init__(self, private_key_pem: bytes, signer: str) -> None:
        self._key = load_private_key(private_key_pem)
        self.signer = signer
        #: The raw public key, and its fingerprint (what the registry entry must hold).
        self.public_key = public_key_of(private_key_pem)
        self.fingerprint = fingerprint(self.public_key)

    @classmethod
    def from_settings(cls, settings: Settings) -> Sealer | None:
        key, signer = settings.security.seal_key, settings.security.seal_signer
        if not key and not signer:
            return None
        if not key or not signer:
            raise UsageError("DURABLE_SEAL_KEY and DURABLE_SEAL_SIGNER go together: the key "
                             "file, and the registry name of its public key")
        return cls(read_key_file(key), signer)

    def seal(self, run_id: str, entry_id: str, head: str) -> Seal:
        sig = self._key.sign(seal_statement(run_id, entry_id, head))
        return Seal(self.signer, self.fingerprint, entry_id, base64.b64encode(sig).decode())


def seal_call(sealer: Sealer | None, layout: KeyLayout, handle: RunHandle,
              reply: Any) -> tuple[list[str], list[str]] | None:
    """The ``seal.lua`` call (keys, args) sealing the chain head an append left (its reply:
    ``{"ok", version, last id, head}``), when it ended the run (or appended to an ended
    one) and there is a sealer. Made the round trip after the append's: a process that
    dies in between leaves the run unsealed, which ``verify`` reports and ``durable seal``
    mends."""
    if sealer is None or handle.state.state not in TERMINAL or len(reply) < 4:
        return None
    last_id, head = text(reply[2]), text(reply[3])
    if not last_id:
        return None
    seal = sealer.seal(handle.run_id, last_id, head)
    return ([layout.run(handle.run_id), layout.seal(handle.run_id)],
            [f"{last_id} {head}", seal.encode()])


@contextmanager
def unsealed(run_id: str) -> Iterator[None]:
    """A seal that cannot be written (Redis unreachable, a user refused the seal key) leaves
    the run unsealed, logged: the append before it is written, and never reported failed."""
    try:
        yield
    except redis.RedisError as exc:
        log.warning("run %s ended but was not sealed: %s", run_id, exc)
