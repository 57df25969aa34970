"""What the commands' ``--help`` says of a default is the default the settings have."""

from __future__ import annotations

import os
import re

import pytest
from pydantic_settings import BaseSettings

from durable import settings, settings_doors
from tests.conftest import run_durable

#: ``(default: DURABLE_X, V)`` or ``(DURABLE_X, V)`` in a help text.
NAMED_DEFAULT = re.compile(r"\((?:default: )?(DURABLE_[A-Z0-9_]+), ([^,)\s]+)\)")


def _defaults() -> dict[str, str]:
    """Every setting's environment variable -> its default, as a help text would print it."""
    out: dict[str, str] = {}
    for module in (settings, settings_doors):
        for cls in vars(module).values():
            if isinstance(cls, type) and issubclass(cls, BaseSettings) \
                    and cls is not BaseSettings:
                for field in cls.model_fields.values():
                    alias = field.validation_alias
                    if isinstance(alias, str) and alias.startswith("DURABLE_"):
                        out[alias] = str(field.default)
    return out


def _same(said: str, default: str) -> bool:
    try:
        return float(said.replace(",", "")) == float(default)
    except ValueError:
        return said == default


@pytest.mark.parametrize("command", ["worker", "console", "mcp", "a2a", "reconciler"])
def test_a_default_the_help_names_is_the_settings_default(command: str) -> None:
    shown = run_durable(command, "--help", env=dict(os.environ))
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())  # argparse wraps help lines
    named = NAMED_DEFAULT.findall(text)
    defaults = _defaults()
    wrong = {var: (said, defaults[var]) for var, said in named
             if var in defaults and not _same(said, defaults[var])}
    assert not wrong, f"durable {command} --help: (said, the setting's default) {wrong}"
    if command == "worker":
        assert ("DURABLE_CONCURRENCY", defaults["DURABLE_CONCURRENCY"]) in named
