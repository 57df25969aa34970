"""The package's public surface is chosen: this fails when a name appears or vanishes."""

import durable

EXPECTED = {
    "Action", "Agent", "Call", "CancelToken", "Cancelled", "Client", "ConflictError",
    "DecodeError", "DurableError", "Fail", "Finish", "ForbiddenJob", "InvalidInput",
    "LeaseLost", "Lookup", "NondeterminismError", "OutcomeUnknown", "PayloadTooLarge",
    "RunNotFound", "RunState",
    "RunSummary", "Settings", "Started", "Tool", "ToolContext", "UnknownAgent", "UnknownTool",
    "UnsafeRedis", "UsageError", "Wait", "register", "registry",
}


def test_public_names_are_exactly_the_chosen_ones() -> None:
    assert set(durable.__all__) == EXPECTED
    for name in EXPECTED:
        assert getattr(durable, name) is not None


def test_cancellation_is_not_an_exception() -> None:
    assert issubclass(durable.Cancelled, BaseException)
    assert not issubclass(durable.Cancelled, Exception)
