"""Large test pages and their digests (no agent registered here: importing this module
leaves the registry as it is)."""

from __future__ import annotations

import hashlib


def page(size: int, seed: str = "page") -> str:
    """``size`` characters of hex text derived from ``seed`` (the same every time)."""
    chunks, block, total = [], seed.encode(), 0
    while total < size:
        block = hashlib.sha256(block).hexdigest().encode()
        chunks.append(block)
        total += len(block)
    return b"".join(chunks)[:size].decode()


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
