"""The plain-RQ baseline's job: a no-op, importable by name (JSON serializer)."""


def noop(n: int) -> dict[str, int]:
    return {"n": n}
