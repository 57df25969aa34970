"""Following a run as it goes: its log entries and the partial output of its steps.

- ``streaming``: ``Follower``, the sync reader (threads of its own);
- ``async_streaming``: the same coroutines on ``redis.asyncio`` (``afollow``), which the
  sync reader drives;
- ``partials``: ``Partial``, a step's partial output (tokens, tool-call deltas), re-exported
  by ``durable``.
"""
