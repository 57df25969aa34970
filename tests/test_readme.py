"""The reference's configuration table is the settings: a setting added, removed or given
another default in ``durable/settings.py`` fails here until the table says so. The README
is the front door: short, and every document it points to exists."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic.fields import FieldInfo

from durable.cli.config import reference
from durable.settings import Settings, variables

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
REFERENCE = ROOT / "docs" / "reference.md"


def _table() -> dict[str, str]:
    """``DURABLE_X`` -> its default cell, from the Configuration section's table."""
    section = REFERENCE.read_text().split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(DURABLE_[A-Z0-9_]+)` \| ([^|]*) \|", section, re.MULTILINE)
    return {name: default.strip() for name, default in rows}


def _settings() -> dict[str, FieldInfo]:
    """``DURABLE_X`` -> its field, from every group of ``Settings``."""
    groups = Settings.model_fields
    out = {}
    for var, (group, name) in variables().items():
        annotation = groups[group].annotation
        assert annotation is not None
        out[var] = annotation.model_fields[name]
    return out


def _shown(value: object) -> str | None:
    """How the table writes a scalar default; None for the ones it describes in words."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    if isinstance(value, int | float | str) and value != "":
        return f"`{value}`"
    return None


def test_the_configuration_table_lists_every_setting_and_nothing_else() -> None:
    table = _table()
    assert sorted(table) == sorted(_settings())


def test_the_configuration_table_shows_each_default() -> None:
    table = _table()
    for var, field in _settings().items():
        shown = _shown(field.default)
        if shown is not None:
            assert table[var].startswith(shown), var
        elif field.default is None:
            assert table[var] == "unset", var


def test_the_configuration_tables_are_the_generated_ones() -> None:
    """The page holds exactly what ``durable config --reference`` prints."""
    page = REFERENCE.read_text()
    generated = page.split("<!-- generated: durable config --reference -->\n", 1)[1]
    assert generated.split("<!-- end of generated -->", 1)[0] == reference(), \
        "docs/reference.md is stale: paste `durable config --reference` between its markers"


def test_every_setting_has_its_own_variable_a_title_and_a_description() -> None:
    named = [var for group in Settings.model_fields.values() if group.annotation
             for var in (str(f.validation_alias) for f in group.annotation.model_fields.values())]
    assert len(named) == len(set(named)) == len(variables())
    assert all(v.startswith("DURABLE_") and v == v.upper() for v in named)
    assert [n for n, group in Settings.model_fields.items() if not group.title] == []
    assert [v for v, f in _settings().items() if not f.description] == []


def test_the_readme_is_a_front_door_whose_links_exist() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 250
    assert "./demo.sh" in text and "./test.sh" in text
    for doc in ("guide", "operations", "security", "scaling", "performance", "reference"):
        assert f"(docs/{doc}.md)" in text
    for target in re.findall(r"\]\(((?:docs/)?[\w./-]+\.(?:md|png))(?:#[\w-]+)?\)", text):
        assert (ROOT / target).exists(), target
    for page in (ROOT / "docs").glob("*.md"):
        for target in re.findall(r"\]\(([\w./-]+\.(?:md|png))(?:#[\w-]+)?\)", page.read_text()):
            assert (page.parent / target).exists(), (page.name, target)
