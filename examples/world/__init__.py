"""The example's external world: a data source, a notification API and a database.

It runs as its own process (``python -m examples world``, or :class:`WorldProcess` on a random port)
so that crashes, timeouts and lost replies between a worker and the world are real. It
counts every application of every key, so that scenarios and the chaos suite can prove
that no effect happened twice. Tools find it through ``DURABLE_WORLD_URL``
(``examples.settings.world_url()``) and ask it (``GET /info``) where its database is.
"""

from examples.world.client import WorldClient, WorldProcess
from examples.world.protocol import (
    DEADLINE_HEADER,
    KEY_HEADER,
    NOT_APPLIED,
    Applications,
)

__all__ = [
    "DEADLINE_HEADER",
    "KEY_HEADER",
    "NOT_APPLIED",
    "Applications",
    "WorldClient",
    "WorldProcess",
]
