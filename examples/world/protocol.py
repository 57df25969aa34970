"""The world's wire protocol: header names, status codes and the applications report.

Shared by the world server, the example's tools and the Python helpers, so that each side
names a header or reads a count the same way.

Effect endpoints (``POST /notify``, ``GET /source/{name}``) take:

- ``Idempotency-Key``: the action's key (``<run id>:<step>``), stable across retries;
- ``X-Deadline-Ms``: the caller's absolute deadline, ms since the epoch. Work that reaches
  the point of being applied after it is refused (``408``, not applied).

Status codes of the effect endpoints: ``200`` applied (or, with deduplication on, an
earlier application's result replayed, header ``Idempotent-Replayed: true``); ``400``
missing or bad headers; ``404`` unknown source; ``408`` refused, past the deadline (not
applied); ``409`` refused, the key was aborted (not applied); ``503`` failed (not applied).
A dropped connection tells nothing: ask ``GET /notify/{key}``.

The model (``POST /v1/chat/completions``, OpenAI-compatible) takes the same two headers,
optional: it records every request under its key (a completion changes nothing, so these
are requests, not applications), answers ``408`` past the deadline and ``503`` on an
injected failure.

``POST /notify/{key}/abort`` with the abandoned attempt's ``X-Deadline-Ms`` makes the API
refuse every request for the key with that deadline or an earlier one, unless the key was
applied already (the reply says which). A caller that was canceled mid-request uses it to
turn "I do not know" into "it will never happen"; a later attempt has a later deadline and
is not refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KEY_HEADER = "Idempotency-Key"
DEADLINE_HEADER = "X-Deadline-Ms"
REPLAYED_HEADER = "Idempotent-Replayed"

#: Status codes meaning "not applied", by contract.
NOT_APPLIED = frozenset({408, 409, 503})

#: The systems whose applications the world counts.
SYSTEMS = ("api", "db")


@dataclass
class Applications:
    """How many times each key was applied, per system (``api``: the notification API,
    ``db``: the example's database), reads served by the data source per key, and requests
    the model received per key (``model``: a completion changes nothing, so these are not
    applications and never duplicates; a recorded model call sent again shows here)."""

    api: dict[str, int] = field(default_factory=dict)
    db: dict[str, int] = field(default_factory=dict)
    reads: dict[str, int] = field(default_factory=dict)
    model: dict[str, int] = field(default_factory=dict)
    dedupe: bool = True

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Applications:
        return cls(api=dict(data.get("api", {})), db=dict(data.get("db", {})),
                   reads=dict(data.get("reads", {})), model=dict(data.get("model", {})),
                   dedupe=bool(data.get("dedupe", True)))

    @property
    def duplicates(self) -> dict[str, int]:
        """``"<system> <key>" -> count`` for every key applied more than once."""
        out = {f"api {k}": n for k, n in self.api.items() if n > 1}
        out.update({f"db {k}": n for k, n in self.db.items() if n > 1})
        return out

    @property
    def total(self) -> int:
        return sum(self.api.values()) + sum(self.db.values())

    def of_run(self, run_id: str) -> Applications:
        """Only the keys of one run (keys are ``<run id>:<step>``)."""
        prefix = f"{run_id}:"
        return Applications(
            api={k: n for k, n in self.api.items() if k.startswith(prefix)},
            db={k: n for k, n in self.db.items() if k.startswith(prefix)},
            reads={k: n for k, n in self.reads.items() if k.startswith(prefix)},
            model={k: n for k, n in self.model.items() if k.startswith(prefix)},
            dedupe=self.dedupe,
        )

    def rows(self) -> list[tuple[str, str, int]]:
        """``(system, key, count)`` sorted, for tables."""
        out = [("api", k, n) for k, n in self.api.items()]
        out += [("db", k, n) for k, n in self.db.items()]
        out += [("source", k, n) for k, n in self.reads.items()]
        out += [("model", k, n) for k, n in self.model.items()]
        return sorted(out, key=lambda r: (r[1], r[0]))
