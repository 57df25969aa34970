"""The package's public surface is chosen: this fails when a name appears or vanishes, when
a name is re-exported from somewhere other than the module that defines it, or when an
exported error leaves the ``DurableError`` tree callers catch (``tests/test_errors.py``
checks every exception class, exported or not, and the diagram of the tree)."""

import importlib

import pytest

import durable

#: Each public name and the module that defines it.
EXPECTED = {
    "Action": "durable.log.state",
    "Agent": "durable.agents",
    "Call": "durable.agents.steps",
    "CancelToken": "durable.agents.cancel_token",
    "Cancelled": "durable.agents.cancel_token",
    "Client": "durable.client",
    "ConflictError": "durable.errors",
    "DecodeError": "durable.errors",
    "DurableError": "durable.errors",
    "Fail": "durable.agents.steps",
    "Finish": "durable.agents.steps",
    "ForbiddenJob": "durable.errors",
    "InvalidInput": "durable.errors",
    "LeaseLost": "durable.errors",
    "Limit": "durable.flow.limits",
    "Lookup": "durable.agents.steps",
    "NondeterminismError": "durable.errors",
    "OutcomeUnknown": "durable.agents.steps",
    "Partial": "durable.streams.partials",
    "RateLimited": "durable.errors",
    "PayloadTooLarge": "durable.errors",
    "RunIdConflict": "durable.errors",
    "RunContended": "durable.errors",
    "Refused": "durable.errors",
    "RunContext": "durable.code",
    "RunNotFound": "durable.errors",
    "RunState": "durable.log.state",
    "RunSummary": "durable.log.index",
    "SessionBusy": "durable.errors",
    "Settings": "durable.settings",
    "Started": "durable.controls.starts",
    "StepFailed": "durable.code.steps",
    "Tool": "durable.agents",
    "ToolContext": "durable.agents.steps",
    "UnknownAgent": "durable.errors",
    "UnknownTool": "durable.errors",
    "UnsafeRedis": "durable.errors",
    "UsageError": "durable.errors",
    "Wait": "durable.agents.steps",
    "WaitExpired": "durable.code.steps",
    "agent": "durable.code",
    "register": "durable.agents",
    "registry": "durable.agents",
}

#: Errors a caller can catch as ``DurableError``, with their direct parent.
ERRORS = {
    "UsageError": "DurableError",
    "UnknownAgent": "UsageError",
    "UnknownTool": "UsageError",
    "InvalidInput": "UsageError",
    "PayloadTooLarge": "UsageError",
    "RunIdConflict": "UsageError",
    "SessionBusy": "UsageError",
    "RunNotFound": "DurableError",
    "ConflictError": "DurableError",
    "RunContended": "DurableError",
    "LeaseLost": "DurableError",
    "DecodeError": "DurableError",
    "NondeterminismError": "DurableError",
    "ForbiddenJob": "DurableError",
    "Refused": "DurableError",
    "OutcomeUnknown": "DurableError",
    "StepFailed": "DurableError",
    "WaitExpired": "DurableError",
    "RateLimited": "DurableError",
}


def test_public_names_are_exactly_the_chosen_ones() -> None:
    assert sorted(durable.__all__) == sorted(EXPECTED)
    assert len(durable.__all__) == len(set(durable.__all__))  # no name listed twice


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_public_name_is_the_object_its_module_defines(name: str) -> None:
    obj = getattr(durable, name)
    module = EXPECTED[name]
    assert getattr(importlib.import_module(module), name) is obj
    if name == "registry":  # an instance: the one registry every process shares
        assert type(obj) is importlib.import_module(module).Registry
    else:
        assert (obj.__module__, obj.__qualname__) == (module, name)


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_library_errors_derive_from_durable_error(name: str) -> None:
    error = getattr(durable, name)
    assert error.__bases__ == (getattr(durable, ERRORS[name]),)
    assert issubclass(error, durable.DurableError)
    assert issubclass(durable.DurableError, Exception)


def test_names_outside_the_error_tree_stay_outside_it() -> None:
    """``UnsafeRedis`` is a warning category and ``Cancelled`` a signal; every other
    exported exception, a tool's ``OutcomeUnknown`` and what a code agent's step or wait
    raises included, is in the tree callers catch."""
    assert issubclass(durable.UnsafeRedis, UserWarning)
    assert not issubclass(durable.UnsafeRedis, durable.DurableError)
    exceptions = {name for name in EXPECTED if isinstance(getattr(durable, name), type)
                  and issubclass(getattr(durable, name), BaseException)}
    assert exceptions == {*ERRORS, "DurableError", "UnsafeRedis", "Cancelled"}
