"""``durable config``: the settings this process sees, and the configuration reference.

``durable config`` shows each ``DURABLE_*`` setting's value here and where it came from (the
environment or the default); secrets show only whether they are set. ``durable config
--reference`` prints the reference tables of docs/reference.md, generated from
``durable.settings.Settings`` (each field's default and description) in the order of
``durable.settings.GROUPS``: the page is this output, and a test fails when they differ.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from pydantic import SecretStr
from pydantic.fields import FieldInfo

from durable.cli.output import OK, Add, json_out, table
from durable.connection import safe_url
from durable.settings import GROUPS, Settings

#: How the reference writes defaults made by a function.
FACTORY_DEFAULTS = {
    "data_dir": "`$XDG_STATE_HOME/durable` (`~/.local/state/durable`)",
    "approvers": "`{}`",
}

_VAR = re.compile(r"(?<![`\w])(DURABLE_[A-Z_]+)")


def variable(name: str) -> str:
    return f"DURABLE_{name.upper()}"


def default_cell(name: str, field: FieldInfo) -> str:
    """The reference's default column for one setting."""
    if name in FACTORY_DEFAULTS:
        return FACTORY_DEFAULTS[name]
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{int(value)}`"
    if value == "":
        return "empty"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    return f"`{value}`"


def meaning(field: FieldInfo) -> str:
    """The field's description, its variables in code font, on one table row."""
    text = " ".join((field.description or "").split())
    return _VAR.sub(r"`\1`", text).replace("|", "\\|")


def reference() -> str:
    """The configuration reference, one table per group of ``GROUPS``."""
    fields = Settings.model_fields
    out = []
    for group, names in GROUPS.items():
        out += [f"### {group}", "", "| variable | default | meaning |", "|---|---|---|"]
        out += [f"| `{variable(n)}` | {default_cell(n, fields[n])} | {meaning(fields[n])} |"
                for n in names]
        out.append("")
    return "\n".join(out)


def shown(name: str, value: Any) -> str:
    """A setting's value as this command prints it: secrets and passwords never."""
    if isinstance(value, SecretStr) or name in ("cancel_secret", "console_secret"):
        return "(unset)" if value is None else "(set)"
    if value is None:
        return "(unset)"
    if name in ("redis_url", "queue_url"):
        return safe_url(str(value))
    return str(value)


def cmd_config(args: argparse.Namespace) -> int:
    if args.reference:
        print(reference(), end="")
        return OK
    settings = Settings()
    rows = []
    for group, names in GROUPS.items():
        for name in names:
            var = variable(name)
            rows.append({"group": group, "variable": var,
                         "value": shown(name, getattr(settings, name)),
                         "from": "environment" if var in os.environ else "default"})
    if args.json:
        json_out(rows)
    else:
        table("settings", ["variable", "value", "from", "group"],
              [[r["variable"], r["value"], r["from"], r["group"]] for r in rows])
    return OK


def register(add: Add) -> None:
    sp = add("config", cmd_config, "the settings this process sees (secrets hidden); "
             "--reference: the configuration reference, generated from them")
    sp.add_argument("--reference", action="store_true",
                    help="print the reference tables of docs/reference.md (Markdown)")
