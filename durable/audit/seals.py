"""Seals: a terminal run's log hash chain head, signed with a key an admin registered.

``durable.log.chain`` builds the chain and makes seals (``Sealer``: the process that ends a
run signs its head, ``DURABLE_SEAL_KEY``); here they are checked against the approver
registry (``durable.controls.approvers``). A seal counts only when its signer is an entry an
admin key of ``DURABLE_ADMIN_KEYS`` vouches for, holding the role ``sealer``, not revoked
before the sealed entry was written, whose key made a signature over this run, the sealed
entry and the chain value the log gives at that entry. A writer who edited the log and
recomputed the whole chain (every link, the head) cannot make one.

- ``check`` is ``verify``'s: it says whether the run is sealed, by whom, up to which entry,
  and says "unsealed (chain only)" rather than passing silently when it is not;
- ``check_sealer`` is what a process configured with a seal key asks before it writes
  anything: a key that is not its signer's registered key would write seals that never
  verify, so it refuses to start (``UsageError``);
- ``seal_run`` is ``durable seal``: an operator seals a terminal run after the fact (one
  that ended where no seal key was configured, or whose sealing process died after the
  append), after checking its chain; a key that is not the signer's is refused and
  nothing is written;
- ``unsealed_ended`` finds the recently ended runs without a seal, which a reconciler with a
  seal key seals (``seal_with``) on its sweep, so a crash between a run's end and its seal
  leaves it unsealed for a sweep or two, not for good.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from durable import clock
from durable.controls.approvers import Approvers, standing_problem
from durable.errors import Refused, RunNotFound, UsageError
from durable.log import chain
from durable.log import events as ev
from durable.log.handle import text
from durable.log.sealer import SEAL_ROLE, Seal, Sealer
from durable.log.state import TERMINAL
from durable.log.store import EventLog
from durable.security.signing import valid


def signer_problem(registry: Approvers, name: str, key: str, at: int) -> str | None:
    """Why ``name``'s registry entry cannot vouch for a seal made with the key whose
    fingerprint is ``key`` at time ``at`` (ms), or None."""
    entry = registry.get(name)
    problem = standing_problem(entry, name, SEAL_ROLE, at)
    if problem is not None or entry is None:
        return problem
    if key != entry.fingerprint:
        return f"the key {key} is not {name}'s registered key ({entry.fingerprint})"
    return None


def check_sealer(registry: Approvers, sealer: Sealer | None) -> None:
    """Refuse (``UsageError``) a seal key that is not its signer's registered, trusted,
    unrevoked key with the role ``sealer``: every seal it made would be a forgery to
    ``verify``. None (no seal key): nothing to check."""
    if sealer is None:
        return
    problem = signer_problem(registry, sealer.signer, sealer.fingerprint, clock.now_ms())
    if problem is not None:
        raise UsageError(f"DURABLE_SEAL_KEY: {problem}; the seals this process would make "
                         "would not verify, so it does not start")


@dataclass
class SealCheck:
    """``verify``'s finding: ``problem`` (None: nothing wrong) and what to show."""

    problem: str | None
    shown: str


def check(registry: Approvers, run_id: str, raw_seal: Any, found: chain.ChainCheck,
          last_id: str, state: str, *, require: bool = False) -> SealCheck:
    """The run's seal (``raw_seal``: its ``dx:{R}:seal``) against the registry and
    the chain as recomputed (``found``, asked to keep the sealed entry's value); ``last_id``:
    the log's last entry; ``require``: an unsealed log, or entries past the seal, fail."""
    if not raw_seal:
        why = ("unsealed (chain only): no process that ended the run had a seal key "
               "(DURABLE_SEAL_KEY)" if state in TERMINAL else
               f"unsealed (chain only): the run has not ended ({state})")
        return SealCheck(why if require else None, why)
    seal = Seal.parse(raw_seal)
    if seal is None:
        return SealCheck("the seal is unreadable (not a seal's JSON)", "unreadable")
    problem = signer_problem(registry, seal.by, seal.key, ev.entry_ms(seal.entry))
    if problem is not None:
        return SealCheck(f"the seal by {seal.by} does not count: {problem}", "forged")
    head = found.values.get(seal.entry)
    if head is None:
        if not found.ok:
            return SealCheck(None, f"not checked: the chain breaks before entry {seal.entry}, "
                                   "which the seal covers")
        return SealCheck(f"the seal covers entry {seal.entry}, which is not in the log",
                         "forged")
    signer = registry.get(seal.by)
    if signer is None or not valid(signer.key_bytes, seal.sig, seal.statement(run_id, head)):
        return SealCheck(f"the seal by {seal.by} ({seal.key}) does not hold over this log up "
                         f"to entry {seal.entry}: the log was rewritten after it was sealed "
                         "(its chain recomputed), or the seal is forged", "forged")
    shown = f"sealed by {seal.by} ({seal.key}) at entry {seal.entry}"
    if seal.start is not None:  # (a seal of the first format does not say)
        shown += (f", its chain checked by its signer from entry {seal.start}" if seal.start
                  else ", its chain checked by its signer from the run's first entry")
    if seal.entry != last_id:
        after = f"; the entries after it, to {last_id}, are chained but not sealed"
        return SealCheck(shown + after if require else None, shown + after)
    return SealCheck(None, shown)


def seal_run(elog: EventLog, registry: Approvers, run_id: str, signer: str,
             private_key_pem: bytes) -> Seal:
    """Seal a terminal run's chain head now (``durable seal``). Refused, nothing written
    (``Refused``): a key that is not ``signer``'s registered sealing key, a run that has
    not ended, a log that does not chain (a seal would vouch for it) or was written
    before the chain."""
    seal = seal_with(elog, registry, run_id, Sealer(private_key_pem, signer))
    if seal is None:
        raise Refused(run_id, "not sealed: the run moved on while it was sealed; try again")
    return seal


def seal_with(elog: EventLog, registry: Approvers, run_id: str, sealer: Sealer
              ) -> Seal | None:
    """``seal_run`` with a ``Sealer`` already made (the reconciler's, from its settings);
    None, nothing written, when an entry was appended while it sealed (seal it again)."""
    problem = signer_problem(registry, sealer.signer, sealer.fingerprint, clock.now_ms())
    if problem is not None:
        raise Refused(run_id, f"not sealed: {problem}")
    proj = elog.projection(run_id)
    if not proj:
        raise RunNotFound(run_id)
    if proj.get("state") not in TERMINAL:
        raise Refused(run_id, f"not sealed: the run has not ended ({proj.get('state')}); "
                      "a run is sealed when it ends")
    last = proj.get("last", "")
    found = chain.check(run_id, elog.redis.xrange(elog.keys.log(run_id)), last)
    if not found.ok:
        raise Refused(run_id, f"not sealed: its log does not chain ({found.problem})")
    last_id, head = chain.split_last(last)
    if head is None:
        raise Refused(run_id, "not sealed: its log was written before the hash chain")
    seal = sealer.seal(run_id, last_id, head, "", found.before or "")
    written = elog.scripts.seal(keys=[elog.keys.run(run_id), elog.keys.seal(run_id)],
                                args=[last, seal.encode()])
    return seal if int(text(written)) else None


def unsealed_ended(elog: EventLog, state: str, shard: int | None, since: float, until: float,
                   limit: int = 200) -> tuple[list[str], float]:
    """The runs of ``shard`` that entered the terminal ``state`` between ``since`` and
    ``until`` (ms, inclusive) and have no seal: their ending process died between the
    terminal append and its seal, or had no seal key. At most ``limit`` looked at, oldest
    first; with them, where the next look starts (``until`` once all were looked at)."""
    index = elog.keys.runs_in_state(state, shard)
    rows = elog.redis.zrangebyscore(index, since, until, 0, limit, withscores=True)
    if not rows:
        return [], until
    ids = [text(i) for i, _ in rows]
    pipe = elog.redis.pipeline(transaction=False)
    for run_id in ids:
        pipe.exists(elog.keys.seal(run_id))
    unsealed = [r for r, sealed in zip(ids, pipe.execute(), strict=True) if not sealed]
    return unsealed, (float(rows[-1][1]) if len(rows) == limit else until)
