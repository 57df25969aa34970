"""A worker whose region does not own the data (``durable.regions``): it gives
back every run it was fenced from and takes no runs until its region owns them again.

A ``RegionFenced`` at lease acquisition means another region owns the run's shard (or a
takeover is under way): nothing was written, but the run was popped from the ready list,
and left off it the run would wait for a reconciler while the owning region's workers
find nothing. ``RegionGate.fenced`` makes it ready again at once and pauses the worker:
``Slots`` pops nothing while ``paused`` (a worker that kept popping would take the runs
away from their region's workers again and again). A thread of its own re-reads the
records that fenced it every ``recheck_s`` and lifts the pause once this region owns
them all, active. The log says so once when a pause begins and once when it ends.

Regions off (``DURABLE_REGION`` unset): nothing is ever fenced; ``paused`` is an
attribute read, and no Redis call is added.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

import redis

from durable.errors import RegionFenced
from durable.log.keys import KeyLayout
from durable.regions import ACTIVE

if TYPE_CHECKING:
    from .redis_io import RedisIO

log = logging.getLogger("durable.worker")


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class RegionGate:
    """Whether this worker may take runs now, for its region (see the module doc)."""

    def __init__(self, client: redis.Redis, layout: KeyLayout, region: str, *,
                 recheck_s: float = 1.0) -> None:
        self.redis = client
        self.layout = layout
        self.region = region
        self.recheck_s = recheck_s
        #: True while another region owns a shard this worker was fenced from.
        self.paused = False
        #: The region records (``KeyLayout.region``) that fenced this worker in this pause.
        self._records: set[str] = set()
        self._lock = threading.Lock()

    async def fenced(self, exc: RegionFenced, io: RedisIO) -> dict[str, Any]:
        """``exc`` refused this worker the lease of its run: pause (first, so that no slot
        pops meanwhile), and make the run ready again at once for the owning region."""
        with self._lock:
            self._records.add(self.layout.region_of(exc.run_id))
            first, self.paused = not self.paused, True
        if first:
            log.warning("%s. Region %r takes no runs while region %r owns them: paused, "
                        "checked again every %.1f s; the run is ready again for the "
                        "owning region", exc, self.region, exc.owner, self.recheck_s)
            threading.Thread(target=self._watch, name="region-pause", daemon=True).start()
        await io.enqueue(exc.run_id, force=True)  # (its "queued" marker is still set)
        return {"run": exc.run_id, "skipped": "another region owns it", "requeued": True}

    def owns(self, records: list[str]) -> bool:
        """Whether this region owns every one of ``records``, active (one round trip)."""
        pipe = self.redis.pipeline(transaction=False)
        for key in records:
            pipe.hmget(key, "owner", "state")
        return all(owner is not None and _s(owner) == self.region and
                   state is not None and _s(state) == ACTIVE
                   for owner, state in pipe.execute())

    def _watch(self) -> None:
        """A thread for one pause: lift it once this region owns what fenced it."""
        stop = threading.Event()  # (never set: the thread ends with the pause)
        while not stop.wait(self.recheck_s):
            with self._lock:
                records = sorted(self._records)
            try:
                if not self.owns(records):
                    continue
            except redis.RedisError:  # asked again at the next check
                continue
            with self._lock:
                if self._records != set(records):  # fenced by another shard meanwhile
                    continue
                self._records.clear()
                self.paused = False
            log.info("region %r owns its runs again: taking runs", self.region)
            return
