"""The log: one Redis Stream per run, the only truth about it.

- ``events``: the versioned event schema and its codec; ``migrations``: upcasters.
- ``state``: the typed run state; ``fold``: the pure fold of events into it.
- ``keys``: every Redis key template; ``scripts``: the Lua scripts (``scripts/*.lua``).
- ``store``: appending (one script call per batch) and loading from the last checkpoint.
- ``replay``, ``verify``, ``export``, ``index``: reading the evidence back, checking it,
  writing it out, and rebuilding the derived indexes from it.
"""
