"""Seals: signatures over a run's hash chain (``durable.log.chain``), made by the process
that holds the run's lease (or ended it, or ``durable seal``), with a key an admin
registered in the approver registry with the role ``sealer`` (``Sealer``,
``DURABLE_SEAL_KEY``, ``DURABLE_SEAL_SIGNER``).

A seal (``Seal``) says: *the log of run R, from its first entry to entry E, hashes to the
chain value H; its signer checked the links from entry F to E.* Its signature is made over
``b"durable-seal-v2\\n"`` + the canonical JSON of ``{"entry", "from", "head", "run"}``
(``from`` is "" when the signer checked from the run's first entry). What it vouches for:

- **the whole log up to E**, as a commitment: H is a hash over every entry before E too,
  so any later change before E (edited, removed, added, moved, or rewritten with every
  link recomputed) gives another value at E, which ``verify`` names;
- **that the links from F to E held when it was made**: ``F`` is where its signer's check
  started, the entry of the seal before it (whose signature the signer checked first), or
  the run's first entry. A signer never seals a chain that breaks between F and E: the
  append that precedes a seal checks it in the same script call (``append.lua``'s ``v``),
  and a break quarantines the run, naming the entry, instead.

It does not vouch for what was already rewritten before F when the seal before it was
removed with it: a writer who deletes ``dx:{R}:seal`` and rewrites the whole log with
every link recomputed leaves nothing in Redis that shows it (the seals' copies outside it
do: the sealing process's log lines, ``durable archive`` files).

Stored in ``dx:{R}:seal`` (its own key: a value over 64 bytes would turn the small
projection hash into a full hash table) as JSON: by, key (fingerprint), entry, from,
head, before (the chain value before E: a later check starts from E with it and must
reach H, so E itself is checked too), sig. ``seal.lua`` writes it only while the
projection's ``last`` is still the one signed. A seal of the first format (``v1``: no
``from``, signed over entry and head alone) still verifies.

A run is sealed when it ends, and while it runs, by its lease holder: every
``DURABLE_SEAL_EVERY`` entries, every ``DURABLE_SEAL_INTERVAL``, and when a job lets go
of it at rest (waiting). The cost is in ``docs/performance.md``.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import redis

from durable.errors import UsageError
from durable.log.handle import RunHandle, now_ms, text
from durable.log.keys import KeyLayout
from durable.security.signing import (
    fingerprint,
    load_private_key,
    public_key_of,
    read_key_file,
    statement,
    valid,
)
from durable.settings import Settings

#: What a seal's signature is made over starts with this line (``V1``: seals made before
#: they said where their signer's check started).
SEAL_DOMAIN = b"durable-seal-v2\n"
SEAL_DOMAIN_V1 = b"durable-seal-v1\n"

#: The role a seal's signer holds in the approver registry.
SEAL_ROLE = "sealer"

log = logging.getLogger("durable.log")


def seal_statement(run_id: str, entry_id: str, head: str, start: str | None = "") -> bytes:
    """The bytes a seal signs: the run's chain ``head`` after its entry ``entry_id``,
    checked by its signer from the entry ``start`` ("": the run's first; None: a seal of
    the first format, which does not say)."""
    if start is None:
        return statement(SEAL_DOMAIN_V1, {"entry": entry_id, "head": head, "run": run_id})
    return statement(SEAL_DOMAIN, {"entry": entry_id, "from": start, "head": head,
                                   "run": run_id})


@dataclass(frozen=True)
class Seal:
    """A signature over a run's chain head: by the registry name ``by`` (whose key's
    fingerprint is ``key``), covering the log up to ``entry``, whose signer checked the
    chain from the entry ``start`` ("": the run's first; None: a seal of the first format).
    ``head`` and ``before``: the chain values after and before ``entry`` ("": not kept)."""

    by: str
    key: str
    entry: str
    sig: str
    start: str | None = ""
    head: str = ""
    before: str = ""

    def statement(self, run_id: str, head: str) -> bytes:
        """What this seal's signature must be over, for a log whose chain value at its
        entry is ``head``."""
        return seal_statement(run_id, self.entry, head, self.start)

    def encode(self) -> str:
        body = asdict(self)
        start = body.pop("start")
        if start is not None:
            body["from"] = start
        return json.dumps(body, separators=(",", ":"), sort_keys=True)

    @classmethod
    def parse(cls, value: Any) -> Seal | None:
        """A stored seal (``dx:{R}:seal``); None when it is not one."""
        try:
            body = json.loads(value)
            known = {name: str(body[name]) for name in ("by", "key", "entry", "sig")}
            start = body.get("from")
            return cls(**known, start=None if start is None else str(start),
                       head=str(body.get("head") or ""), before=str(body.get("before") or ""))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None

    @property
    def anchor(self) -> tuple[str, str] | None:
        """(its entry, the chain value after it) when the seal keeps it, else None."""
        return (self.entry, self.head) if self.head else None


class Sealer:
    """Seals the chain heads of the runs this process ends or holds (``DURABLE_SEAL_KEY``,
    registered as ``DURABLE_SEAL_SIGNER``); ``every`` entries and ``interval_ms`` (0: never)
    say how often a running run is sealed."""

    def __init__(self, private_key_pem: bytes, signer: str, *, every: int = 100,
                 interval_ms: int = 30_000) -> None:
        self._key = load_private_key(private_key_pem)
        self.signer = signer
        #: The raw public key, and its fingerprint (what the registry entry must hold).
        self.public_key = public_key_of(private_key_pem)
        self.fingerprint = fingerprint(self.public_key)
        self.every = every
        self.interval_ms = interval_ms

    @classmethod
    def from_settings(cls, settings: Settings) -> Sealer | None:
        key, signer = settings.security.seal_key, settings.security.seal_signer
        if not key and not signer:
            return None
        if not key or not signer:
            raise UsageError("DURABLE_SEAL_KEY and DURABLE_SEAL_SIGNER go together: the key "
                             "file, and the registry name of its public key")
        return cls(read_key_file(key), signer, every=settings.security.seal_every,
                   interval_ms=settings.security.seal_interval_ms)

    def seal(self, run_id: str, entry_id: str, head: str, start: str = "",
             before: str = "") -> Seal:
        sig = self._key.sign(seal_statement(run_id, entry_id, head, start))
        return Seal(self.signer, self.fingerprint, entry_id, base64.b64encode(sig).decode(),
                    start, head, before)

    def due(self, handle: RunHandle, *, ended: bool, release: bool, now: int) -> bool:
        """Whether the append of ``handle``'s batch is to be sealed: it ends the run, or
        ``every`` entries or ``interval_ms`` passed since the handle's last seal, or the
        job lets go of the run (``release``) after writing since then."""
        if ended:
            return True
        if not handle.lease:
            return False  # only the lease holder seals a running run
        written = handle.state.version - handle.sealed_version
        return written > 0 and (release or (self.every > 0 and written >= self.every) or (
            self.interval_ms > 0 and now - handle.sealed_ms >= self.interval_ms))

    def vouches(self, run_id: str, seal: Seal) -> bool:
        """Whether ``seal`` (the one a new seal starts its check from) is this signer's
        and its signature holds; one by another signer is checked against the registry
        by ``verify``, not here: a new seal then starts from the run's first entry."""
        return (seal.by == self.signer and seal.key == self.fingerprint and bool(seal.head)
                and valid(self.public_key, seal.sig, seal.statement(run_id, seal.head)))


def seal_call(sealer: Sealer | None, layout: KeyLayout, handle: RunHandle, reply: Any,
              due: bool = True) -> tuple[list[str], list[str]] | None:
    """The ``seal.lua`` call (keys, args) sealing the chain head an append checked and left
    (its reply: ``{"ok", version, last id, head, before, from, anchor seal}``). Made the
    round trip after the append's: a process that dies in between leaves the run unsealed,
    which ``verify`` reports and ``durable seal`` or the reconciler mends. None: nothing to
    seal (the anchor seal a check started from is not this signer's valid one: then
    nothing is sealed, and the next seal checks from the run's first entry)."""
    if sealer is None or not due or len(reply) < 6:
        return None
    last_id, head, before, start = (text(v) for v in reply[2:6])
    if not last_id:
        return None
    if start:
        anchor = Seal.parse(reply[6]) if len(reply) > 6 else None
        if anchor is None or anchor.entry != start or (
                anchor.sig != handle.own_seal and not sealer.vouches(handle.run_id, anchor)):
            log.warning("run %s: the seal at entry %s is not %s's (or does not hold): not "
                        "sealed from it", handle.run_id, start, sealer.signer)
            handle.seal_from_start = True
            return None
    seal = sealer.seal(handle.run_id, last_id, head, start, before)
    handle.sealing = seal.sig
    log.debug("run %s: sealing entry %s, head %s, checked from %s", handle.run_id, last_id,
              head, start or "its first entry")
    return ([layout.run(handle.run_id), layout.seal(handle.run_id)],
            [f"{last_id} {head}", seal.encode()])


def sealed(handle: RunHandle, written: Any) -> None:
    """``seal.lua``'s reply: when the seal was written, the handle's next one is counted
    from here."""
    if int(text(written)):
        handle.sealed_version, handle.sealed_ms = handle.state.version, now_ms()
        handle.seal_from_start, handle.own_seal = False, handle.sealing


@contextmanager
def unsealed(run_id: str) -> Iterator[None]:
    """A seal that cannot be written (Redis unreachable, a user refused the seal key) leaves
    the run unsealed, logged: the append before it is written, and never reported failed."""
    try:
        yield
    except redis.RedisError as exc:
        log.warning("run %s was not sealed: %s", run_id, exc)
