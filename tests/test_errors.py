"""One error tree, one signal root, and a diagram that cannot drift from either.

Every module of every installed package is imported, found by name: ``durable`` and the
packages the project installs beside it (``durable.workers``, ``durable.reconciler``,
``durable.console``: process folders of the checkout, which an editable install maps into
``durable`` without putting them on its ``__path__``), integrations included. Then:

- every exception class defined there is a ``DurableError`` (what callers catch), a
  ``Signal`` (a ``BaseException`` that ``except Exception`` cannot swallow) or a warning
  category;
- the diagram in ``durable.errors``'s docstring draws exactly those classes (private ones,
  named ``_...``, left out), each under its direct parent, named by its module when it is
  defined outside ``durable.errors``.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
import tomllib
from pathlib import Path
from types import ModuleType

import durable
from durable import errors
from durable.errors import DurableError, Signal

ROOT = Path(__file__).resolve().parent.parent


def _installed_packages() -> list[str]:
    """The packages the project installs, by name (its build configuration's list)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages: list[str] = config["tool"]["setuptools"]["packages"]
    return packages


@functools.cache
def _modules() -> tuple[dict[str, ModuleType], tuple[str, ...]]:
    """Every importable module of the installed packages, by name; and the modules left out
    because a framework they adapt is not installed (an optional extra)."""
    found: dict[str, ModuleType] = {}
    missing: list[str] = []

    def take(name: str) -> ModuleType | None:
        if name in found or name.endswith(".__main__"):  # an entry point runs on import
            return found.get(name)
        try:
            found[name] = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if (exc.name or "").partition(".")[0] == "durable":
                raise
            missing.append(name)
            return None
        return found[name]

    for package in _installed_packages():
        module = take(package)
        if module is None:
            continue
        for info in pkgutil.walk_packages(module.__path__, f"{package}.",
                                          onerror=missing.append):
            take(info.name)
    return found, tuple(missing)


def _exceptions() -> dict[str, type[BaseException]]:
    """Every exception class the installed packages define, by dotted name."""
    found = {}
    for name, module in _modules()[0].items():
        for attr, obj in vars(module).items():
            if isinstance(obj, type) and issubclass(obj, BaseException) and \
                    obj.__module__ == name:
                found[f"{name}.{attr}"] = obj
    return found


def test_the_walk_sees_the_processes_and_the_library_is_complete() -> None:
    modules, missing = _modules()
    for process in ("durable.workers", "durable.reconciler", "durable.console"):
        assert process in modules
        assert any(name.startswith(f"{process}.") for name in modules)
    assert not [m for m in missing if not m.startswith("durable.integrations.")]
    assert "durable.console.auth.LoginRequired" in _exceptions()
    assert "durable.workers.dispatch._Retryable" in _exceptions()


def test_the_error_tree_is_closed() -> None:
    """Every exception class the library and its processes define (public or not) is a
    ``DurableError``, a ``Signal`` or a warning category: ``except DurableError`` catches
    every error raised on purpose, and a signal passes through ``except Exception``."""
    outside = [name for name, cls in _exceptions().items()
               if not issubclass(cls, DurableError | Signal | Warning)]
    assert outside == []


def test_every_signal_derives_from_signal_and_no_error_does() -> None:
    for name, cls in _exceptions().items():
        if not issubclass(cls, Exception):
            assert issubclass(cls, Signal), name
        else:
            assert not issubclass(cls, Signal), name
    assert Signal.__bases__ == (BaseException,)
    assert not issubclass(Signal, Exception)
    assert not issubclass(DurableError, Signal)


def test_cancellation_is_not_an_exception() -> None:
    """``except Exception`` in a tool cannot swallow a cancel."""
    assert issubclass(durable.Cancelled, Signal)
    assert issubclass(durable.Cancelled, BaseException)
    assert not issubclass(durable.Cancelled, Exception)
    assert not issubclass(durable.Cancelled, durable.DurableError)


def _label(cls: type) -> str:
    """How the diagram names a class: bare when ``durable.errors`` defines it."""
    return cls.__qualname__ if cls.__module__ == errors.__name__ else \
        f"{cls.__module__}.{cls.__qualname__}"


def live_tree() -> dict[str, str | None]:
    """Each public class of the error tree, the signals and the warning categories ->
    its parent in the tree (None for a root), from the classes themselves."""
    roots = (DurableError, Signal, Warning)
    tree: dict[str, str | None] = {}
    for cls in _exceptions().values():
        if cls.__name__.startswith("_") or not issubclass(cls, roots):
            continue
        parents = [b for b in cls.__bases__ if issubclass(b, roots) and
                   b.__module__.partition(".")[0] == "durable"]
        tree[_label(cls)] = _label(parents[0]) if parents else None
    return tree


#: A node of the diagram: 4 spaces, then its branch (``├── `` or ``└── `` after the
#: ``│`` of its ancestors) or nothing for a root, then the class's name.
_NODE = re.compile(r"^    (?P<lead>[ │]*)(?P<branch>[├└]── )?(?P<name>[A-Za-z_][\w.]*)")


def drawn_tree(doc: str) -> dict[str, str | None]:
    """Each class the docstring's diagrams (its ``::`` blocks) draw -> its parent."""
    tree: dict[str, str | None] = {}
    stack: list[str] = []
    inside = False
    for line in doc.splitlines():
        if line.rstrip().endswith("::"):
            inside = True
            continue
        if inside and line.strip() and not line.startswith("    "):
            inside = False
        match = _NODE.match(line) if inside else None
        if match is None or (not match["branch"] and match["lead"]):
            continue  # prose, or a comment carried onto the next line
        depth = len(match["lead"]) // 5 + 1 if match["branch"] else 0
        del stack[depth:]
        assert match["name"] not in tree, f"{match['name']} is drawn twice"
        tree[match["name"]] = stack[-1] if stack else None
        stack.append(match["name"])
    return tree


def render(tree: dict[str, str | None]) -> str:
    """The skeleton of a diagram of ``tree`` (names only, children in name order)."""
    lines: list[str] = []

    def draw(name: str, lead: str, last: bool, root: bool) -> None:
        lines.append("    " + (name if root else f"{lead}{'└' if last else '├'}── {name}"))
        kids = sorted(k for k, p in tree.items() if p == name)
        inner = " " if root else lead + ("     " if last else "│    ")
        for i, kid in enumerate(kids):
            draw(kid, inner, i == len(kids) - 1, False)

    for root in sorted(k for k, p in tree.items() if p is None):
        draw(root, "", True, True)
    return "\n".join(lines)


def test_the_diagram_draws_the_classes_as_they_are() -> None:
    """The diagram in ``durable.errors`` is the tree of the live classes: a class added,
    removed, moved or reparented without the diagram fails here, with the tree to draw."""
    live = live_tree()
    skipped = _modules()[1]
    drawn = {name: parent for name, parent in drawn_tree(errors.__doc__ or "").items()
             if not name.startswith(tuple(f"{m}." for m in skipped))}
    assert drawn == live, "durable.errors should draw this tree:\n" + render(live)


def test_the_diagram_check_sees_a_difference() -> None:
    doc = ("Tree::\n\n    A\n     ├── B        a comment\n     │    └── C\n"
           "     │                 carried on\n     └── D\n\n    W   (warning)\n\nProse.\n")
    assert drawn_tree(doc) == {"A": None, "B": "A", "C": "B", "D": "A", "W": None}
    assert drawn_tree(render(drawn_tree(doc)).replace("    A", "Tree::\n\n    A", 1)) == \
        drawn_tree(doc)
    assert drawn_tree(doc.replace("     └── D", "          └── D")) != drawn_tree(doc)
