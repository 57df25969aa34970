"""A call's identity, as replay compares it: a recorded intent against the decision taken
again. A call is its tool and the canonical (sorted-key JSON) encoding of its arguments, or
their digest when the log keeps only that (a tool's ``log_args = "digest"``: a model call's
request holds the whole conversation). A difference is told to a person by what differs.

``durable.agents`` re-exports these names, where they were first defined.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec


def args_digest(args: Any) -> str:
    """SHA-256 of the canonical (sorted-key JSON) encoding of a call's arguments (the
    digest they carry, when a caller digested them itself: ``given_digest``)."""
    given = given_digest(args)
    if given is not None:
        return given
    return hashlib.sha256(msgspec.json.encode(args, order="sorted")).hexdigest()


def digest_placeholder(args: Any) -> dict[str, Any]:
    """What the log records of arguments a tool keeps out of it (``log_args = "digest"``):
    their digest and size. A model call's request holds the whole conversation; recording
    it at every turn would grow the log with the square of the turns. Arguments that carry
    their digest (``given_digest``) are recorded by it, without being encoded."""
    if given_digest(args) is not None:
        return {"_digest": args["_digest"], "_bytes": args["_bytes"]}
    data = msgspec.json.encode(args, order="sorted")
    return {"_digest": hashlib.sha256(data).hexdigest(), "_bytes": len(data)}


def is_placeholder(args: Any) -> bool:
    """Whether ``args`` is what the log keeps of arguments kept out of it: their digest and
    size, nothing else."""
    return isinstance(args, dict) and set(args) == {"_digest", "_bytes"}


def given_digest(args: Any) -> str | None:
    """The digest arguments carry of themselves, else None. A caller that digests its
    arguments itself, incrementally (a model request's conversation grows by a message or
    two a turn: encoding it whole at every turn costs the square of its length), gives a
    step ``{"_digest": ..., "_bytes": ..., **fields}``: the digest and size
    ``digest_placeholder`` gives the full arguments, and the fields the step reads (at
    least one: without any, they are a log placeholder, arguments the agent did not give).
    The log records them, and replay compares them, as it would the full arguments."""
    if isinstance(args, dict) and isinstance(args.get("_digest"), str) \
            and isinstance(args.get("_bytes"), int):
        return str(args["_digest"])
    return None


def call_signature(tool: str, args: Any, *, digest: bool = False) -> str:
    """A call as canonical text: what replay compares between a recorded intent and a
    decision taken again. With ``digest`` (or when ``args`` is a recorded placeholder), the
    arguments are compared by their digest, as are arguments that carry it."""
    if is_placeholder(args):
        return f"call {tool}(sha256:{args['_digest']})"
    if digest or given_digest(args) is not None:
        return f"call {tool}(sha256:{args_digest(args)})"
    return f"call {tool}({msgspec.json.encode(args, order='sorted').decode()})"


def call_difference(was_tool: str, was_args: Any, tool: str, args: Any) -> str:
    """What differs between a recorded call and one decided again, for a person: the tool,
    or the arguments that differ with both values (clipped); arguments the log keeps only
    a digest of are compared by it."""
    if was_tool != tool:
        return f"the tool: {was_tool!r} recorded, {tool!r} now"
    if is_placeholder(was_args):
        return "the arguments (the log keeps only their digest)"
    if given_digest(args) is not None:
        return "the arguments (compared by their digest)"
    if not (isinstance(was_args, dict) and isinstance(args, dict)):
        return "the arguments"
    differing = []
    for name in sorted(set(was_args) | set(args), key=str):
        before, after = was_args.get(name, _MISSING), args.get(name, _MISSING)
        if before is _MISSING or after is _MISSING:
            same = before is after
        else:
            same = msgspec.json.encode(before, order="sorted") == msgspec.json.encode(
                after, order="sorted")
        if not same:
            differing.append(f"{name!r}: {_shown(before)} recorded, {_shown(after)} now")
    return "arguments " + "; ".join(differing[:4]) if differing else "the arguments"


_MISSING = object()


def _shown(value: Any, limit: int = 80) -> str:
    if value is _MISSING:
        return "absent"
    text = msgspec.json.encode(value, order="sorted").decode()
    return text if len(text) <= limit else text[:limit] + "..."
