"""The log: one Redis Stream per run, the only truth about it.

- ``events``: the versioned event schema and its codec; ``migrations``: upcasters.
- ``state``: the typed run state; ``fold``: the pure fold of events into it.
- ``keys``: every Redis key template; ``scripts``: the Lua scripts (``scripts/*.lua``).
- ``store``: appending (one script call per batch) and loading from the last checkpoint.
- ``chain``: the hash chain over each run's log, and seals of its head.
- ``export``, ``index``: writing the evidence out, and rebuilding the derived indexes
  from it.

The bottom layer of the library: it imports nothing of ``durable`` outside itself but a
few modules below it (errors, settings, the clock, durations, sealing, signing;
``tests/test_layout.py`` holds the list). Reading the evidence back against the agents and
the approver registry (replay, verify) is ``durable.audit``, above it.
"""
