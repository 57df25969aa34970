"""Where the example's world is: ``DURABLE_WORLD_URL`` (default ``http://127.0.0.1:8765``).

Kept here, not in the library's settings: only the examples have a world.
"""

from __future__ import annotations

import os

DEFAULT_WORLD_URL = "http://127.0.0.1:8765"


def world_url() -> str:
    return os.environ.get("DURABLE_WORLD_URL", DEFAULT_WORLD_URL).rstrip("/")
