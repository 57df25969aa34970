"""The import graph shows the architecture: processes -> library, never back, no cycles.

Every import counts, including those inside functions (a function-local import that hides a
cycle is a cycle); only imports under ``if TYPE_CHECKING:`` are left out, since they exist
for the type checker alone.

- ``durable`` (the library) imports nothing from ``workers``, ``reconciler``, ``console`` or
  ``examples``;
- the processes import no other process and no example: ``reconciler`` nothing from
  ``workers``, ``console`` or ``examples``; ``workers`` nothing from ``reconciler``,
  ``console`` or ``examples``; ``console`` nothing from ``workers``, ``reconciler`` or
  ``examples``;
- no module reaches itself through its imports.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("durable", "workers", "reconciler", "console", "examples")

#: package -> the packages it must never import.
FORBIDDEN = {
    "durable": {"workers", "reconciler", "console", "examples"},
    "workers": {"reconciler", "console", "examples"},
    "reconciler": {"workers", "console", "examples"},
    "console": {"workers", "reconciler", "examples"},
}


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``packages`` under ``root``."""
    found = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, except the bodies of ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules that module ``name`` imports."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` of a name inside a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    known = modules(root, packages)
    return {name: imports(name, path, known) for name, path in known.items()}


def back_arrows(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in sorted(edges.items()):
        banned = FORBIDDEN.get(src.split(".")[0], set())
        bad += [f"{src} -> {t}" for t in sorted(targets) if t.split(".")[0] in banned]
    return bad


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_library_never_imports_the_processes_or_the_examples() -> None:
    edges = graph(ROOT, PACKAGES)
    assert len(edges) > 60  # the walk found the tree
    assert back_arrows(edges) == []


def test_no_import_cycles() -> None:
    assert cycles(graph(ROOT, PACKAGES)) == []


def test_the_checks_see_a_back_arrow_and_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    """The checker itself: a library module importing the worker inside a function, and two
    modules importing each other, are both reported."""
    (tmp_path / "durable").mkdir()
    (tmp_path / "workers").mkdir()
    (tmp_path / "durable" / "__init__.py").write_text("")
    (tmp_path / "workers" / "__init__.py").write_text("")
    (tmp_path / "durable" / "a.py").write_text(
        "from durable import b\n\ndef f():\n    from workers.loop import StepLoop\n")
    (tmp_path / "durable" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from workers import loop\n"
        "def g():\n    from . import a\n")
    (tmp_path / "workers" / "loop.py").write_text("from durable.a import f\nStepLoop = 1\n")
    edges = graph(tmp_path, ("durable", "workers"))
    assert back_arrows(edges) == ["durable.a -> workers.loop"]
    assert edges["durable.b"] == {"durable.a"}  # the TYPE_CHECKING import is left out
    assert cycles(edges) == [["durable.a", "durable.b", "workers.loop"]]
