"""``durable config``: the settings this process sees, and the configuration reference.

``durable config`` shows each ``DURABLE_*`` setting's value here and where it came from (the
environment or the default); secrets show only whether they are set. ``durable config
--reference`` prints the reference tables of docs/reference.md, generated from
``durable.settings.Settings`` (each group a table titled by its field's title, each setting's
default and description): the page is this output, and a test fails when they differ.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from pydantic import SecretStr
from pydantic.fields import FieldInfo

from durable.backend.connection import safe_url
from durable.cli.output import OK, Add, json_out, table
from durable.settings import Settings, variables

#: How the reference writes defaults made by a function.
FACTORY_DEFAULTS = {
    "DURABLE_DATA_DIR": "`$XDG_STATE_HOME/durable` (`~/.local/state/durable`)",
    "DURABLE_APPROVERS": "`{}`",
}
#: Shown as set or unset only.
SECRETS = ("DURABLE_CANCEL_SECRET", "DURABLE_CONSOLE_SECRET")
#: Shown without their password.
URLS = ("DURABLE_REDIS_URL", "DURABLE_QUEUE_URL", "DURABLE_MODEL_BASE_URL")

_VAR = re.compile(r"(?<![`\w])(DURABLE_[A-Z_]+)")


def default_cell(var: str, field: FieldInfo) -> str:
    """The reference's default column for one setting."""
    if var in FACTORY_DEFAULTS:
        return FACTORY_DEFAULTS[var]
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


def _fields() -> list[tuple[str, str, str, FieldInfo]]:
    """(group title, variable, attribute path, field) of every setting, in the reference's
    order: ``("Leases and liveness", "DURABLE_LEASE_TTL_MS", "leases.ttl_ms", ...)``."""
    groups = Settings.model_fields
    out = []
    for var, (group, name) in variables().items():
        annotation = groups[group].annotation
        assert annotation is not None
        out.append((str(groups[group].title), var, f"{group}.{name}",
                    annotation.model_fields[name]))
    return out


def reference() -> str:
    """The configuration reference, one table per group of ``Settings``."""
    out: list[str] = []
    title = None
    for group_title, var, _path, field in _fields():
        if group_title != title:
            if title is not None:
                out.append("")
            title = group_title
            out += [f"### {title}", "", "| variable | default | meaning |", "|---|---|---|"]
        out.append(f"| `{var}` | {default_cell(var, field)} | {meaning(field)} |")
    out.append("")
    return "\n".join(out)


def shown(var: str, value: Any) -> str:
    """A setting's value as this command prints it: secrets and passwords never."""
    if isinstance(value, SecretStr) or var in SECRETS:
        return "(unset)" if value is None else "(set)"
    if value is None:
        return "(unset)"
    if var in URLS:
        return safe_url(str(value))
    return str(value)


def cmd_config(args: argparse.Namespace) -> int:
    if args.reference:
        print(reference(), end="")
        return OK
    settings = Settings()
    rows = []
    for title, var, path, _field in _fields():
        group, name = path.split(".")
        rows.append({"group": title, "variable": var,
                     "value": shown(var, getattr(getattr(settings, group), name)),
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
