"""The import graph shows the architecture: processes -> library, never back, no cycles.

The processes live in top-level folders of the repository and install as subpackages of the
library (``workers/`` is ``durable.workers``, ``reconciler/`` ``durable.reconciler``,
``console/`` ``durable.console``); modules are named here by their installed names. Every
import counts, including those inside functions (a function-local import that hides a
cycle is a cycle). Imports under ``if TYPE_CHECKING:`` exist for the type checker alone:
they are left out of the runtime graph, but a cycle closed through one is still a cycle
(the two modules cannot be read apart), so the cycle check counts them too.

- ``durable`` proper (the library) imports nothing from ``durable.workers``,
  ``durable.reconciler``, ``durable.console`` or ``examples``;
- the processes import no other process and no example;
- no module reaches itself through its imports, type-only imports included;
- the log (``durable.log``) is the bottom layer: outside itself it imports only the few
  modules of ``LOG_MAY_IMPORT``, which import nothing else of the library either;
- the library's subpackages layer (``SUBPACKAGE_ORDER``): each imports only those below it
  (and the modules at the library's top, which every part shares);
- nothing imports a process by its folder's name (``workers``...): the wheel has no such
  package.
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: installed package -> the repository folder it is made of.
PACKAGES = {"durable": "durable", "durable.workers": "workers",
            "durable.reconciler": "reconciler", "durable.console": "console",
            "durable.a2a": "a2a_server", "durable.mcp_server": "mcp_server",
            "examples": "examples"}
PROCESSES = ("durable.workers", "durable.reconciler", "durable.console", "durable.a2a",
             "durable.mcp_server")

#: package -> the packages it must never import.
FORBIDDEN = {
    "durable": {*PROCESSES, "examples"},
    **{p: {*PROCESSES, "examples"} - {p} for p in PROCESSES},
}

#: What the log may import from the rest of the library: modules below it, that know
#: nothing of runs beyond their bytes. The errors it raises; the settings ``EventLog`` is
#: built from (``from_settings``), with their front doors' groups (``settings_doors``), and
#: their parsers, ``durations`` (the retention) and ``signing`` (the admin keys recorded
#: approvals are checked against); the clock every writer stamps entries with; ``sealing``,
#: which seals and opens sensitive fields as entries are written and read. Anything else
#: (agents, approvals, the client...) sits above the log and reads it: ``durable.audit``
#: holds replay and verify for that reason.
LOG_MAY_IMPORT = frozenset({"durable.errors", "durable.settings", "durable.settings_doors",
                            "durable.durations", "durable.security.signing", "durable.clock",
                            "durable.security.sealing"})

def modules(root: Path, packages: dict[str, str]) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``packages`` (installed name ->
    folder) under ``root``."""
    found = {}
    for pkg, folder in packages.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = [*pkg.split("."), *path.relative_to(root / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def part_of(name: str, packages: Iterable[str]) -> str:
    """The package of ``packages`` that module ``name`` belongs to (the longest match)."""
    return max((p for p in packages if name == p or name.startswith(f"{p}.")), key=len,
               default=name)


def _nodes(tree: ast.AST, type_only: bool) -> Iterator[ast.AST]:
    """Every node; without ``type_only``, not the bodies of ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if (not type_only and isinstance(node, ast.If)
                and "TYPE_CHECKING" in ast.unparse(node.test)):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def imports(name: str, path: Path, known: dict[str, Path], type_only: bool = False) -> set[str]:
    """The project modules that module ``name`` imports (with ``type_only``: those under
    ``if TYPE_CHECKING:`` too)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in _nodes(ast.parse(path.read_text(), str(path)), type_only):
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


def graph(root: Path, packages: dict[str, str], type_only: bool = False) -> dict[str, set[str]]:
    known = modules(root, packages)
    return {name: imports(name, path, known, type_only) for name, path in known.items()}


def back_arrows(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in sorted(edges.items()):
        banned = FORBIDDEN.get(part_of(src, PACKAGES), set())
        bad += [f"{src} -> {t}" for t in sorted(targets) if part_of(t, PACKAGES) in banned]
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


def log_layer_breaches(edges: dict[str, set[str]], allowed: frozenset[str]) -> list[str]:
    """Imports of the library that break the log's place at the bottom: from ``durable.log``
    to a module outside it and outside ``allowed``, and from a module of ``allowed`` to one
    outside ``allowed`` (which would bring that module under the log all the same)."""
    bad = []
    for src, targets in sorted(edges.items()):
        if src == "durable.log" or src.startswith("durable.log."):
            bad += [f"{src} -> {t}" for t in sorted(targets)
                    if not (t == "durable.log" or t.startswith("durable.log."))
                    and t not in allowed]
        elif src in allowed:
            bad += [f"{src} -> {t}" for t in sorted(targets) if t not in allowed]
    return bad


def test_no_import_cycles() -> None:
    assert cycles(graph(ROOT, PACKAGES)) == []


def test_no_import_cycles_through_type_only_imports() -> None:
    """A cycle closed through an ``if TYPE_CHECKING:`` import is a cycle too: the modules
    still depend on each other, whatever the interpreter sees."""
    assert cycles(graph(ROOT, PACKAGES, type_only=True)) == []


def test_the_log_is_the_bottom_layer() -> None:
    edges = graph(ROOT, PACKAGES, type_only=True)
    assert {"durable.log.store", *LOG_MAY_IMPORT} <= edges.keys()  # the names are real
    assert log_layer_breaches(edges, LOG_MAY_IMPORT) == []


def test_the_checks_see_a_back_arrow_and_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    """The checker itself: a library module importing the worker inside a function, and two
    modules importing each other, are both reported."""
    (tmp_path / "durable").mkdir()
    (tmp_path / "workers").mkdir()
    (tmp_path / "durable" / "__init__.py").write_text("")
    (tmp_path / "workers" / "__init__.py").write_text("")
    (tmp_path / "durable" / "a.py").write_text(
        "from durable import b\n\ndef f():\n    from durable.workers.loop import StepLoop\n")
    (tmp_path / "durable" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from durable.workers import loop\ndef g():\n    from . import a\n")
    (tmp_path / "workers" / "loop.py").write_text(
        "from durable.a import f\nfrom . import calls\nStepLoop = 1\n")
    (tmp_path / "workers" / "calls.py").write_text("")
    edges = graph(tmp_path, {"durable": "durable", "durable.workers": "workers"})
    assert back_arrows(edges) == ["durable.a -> durable.workers.loop"]
    assert edges["durable.b"] == {"durable.a"}  # the TYPE_CHECKING import is left out
    assert edges["durable.workers.loop"] == {"durable.a", "durable.workers.calls"}
    assert cycles(edges) == [["durable.a", "durable.b", "durable.workers.loop"]]
    typed = graph(tmp_path, {"durable": "durable", "durable.workers": "workers"},
                  type_only=True)
    assert typed["durable.b"] == {"durable.a", "durable.workers.loop"}


def test_the_checks_see_a_cycle_closed_only_for_the_type_checker(tmp_path: Path) -> None:
    """Two modules that import each other, one of the two imports under
    ``if TYPE_CHECKING:``: no runtime cycle, but a cycle all the same."""
    (tmp_path / "durable").mkdir()
    (tmp_path / "durable" / "__init__.py").write_text("")
    (tmp_path / "durable" / "low.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from durable.high import H\n")
    (tmp_path / "durable" / "high.py").write_text("from durable import low\nH = 1\n")
    packages = {"durable": "durable"}
    assert cycles(graph(tmp_path, packages)) == []
    assert cycles(graph(tmp_path, packages, type_only=True)) == [["durable.high", "durable.low"]]


def test_the_check_sees_the_log_import_upward(tmp_path: Path) -> None:
    """A log module importing a library module not allowed (even for types only, even
    inside a function), and an allowed module importing one not allowed, are reported;
    the log's own modules and the allowed ones are not."""
    (tmp_path / "durable" / "log").mkdir(parents=True)
    for name in ("__init__.py", "errors.py", "agents.py", "log/__init__.py"):
        (tmp_path / "durable" / name).write_text("")
    (tmp_path / "durable" / "settings.py").write_text("from durable import agents\n")
    (tmp_path / "durable" / "log" / "store.py").write_text(
        "from durable.errors import E\nfrom durable.log import keys\n"
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from durable.settings import S\n"
        "def f():\n    import durable.agents\n")
    (tmp_path / "durable" / "log" / "keys.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from durable.agents import A\n")
    edges = graph(tmp_path, {"durable": "durable"}, type_only=True)
    assert log_layer_breaches(edges, frozenset({"durable.errors", "durable.settings"})) == [
        "durable.log.keys -> durable.agents", "durable.log.store -> durable.agents",
        "durable.settings -> durable.agents"]


#: The library's subpackages, bottom first: a module of one imports from the ones before it
#: and never from one after it, type-only imports included (``durable.<sub>``). The modules
#: at the library's top (``client``, ``settings``, ``errors``, ``leases``, ``regions``...)
#: are outside the order: every part may import the shared ones, and the client imports
#: every part. The log, at the bottom, has its own stricter rule (``LOG_MAY_IMPORT``),
#: which admits the two modules of ``security`` it seals and checks signatures with.
SUBPACKAGE_ORDER = ("log", "flow", "security", "backend", "streams", "telemetry", "agents",
                    "controls", "code", "audit", "integrations", "cli", "testing")


def subpackage(name: str) -> str | None:
    """The library subpackage module ``name`` is in (``durable.<sub>...``), if any."""
    parts = name.split(".")
    if parts[0] != "durable" or len(parts) < 2:
        return None
    return parts[1] if len(parts) > 2 or parts[1] in SUBPACKAGE_ORDER else None


def order_breaches(edges: dict[str, set[str]], order: tuple[str, ...] = SUBPACKAGE_ORDER,
                   allowed: frozenset[str] = LOG_MAY_IMPORT) -> list[str]:
    """Every import of a subpackage from one above it in ``order`` (the log's ``allowed``
    modules excepted), and every subpackage the order does not place."""
    rank = {sub: i for i, sub in enumerate(order)}
    bad = []
    for src, targets in sorted(edges.items()):
        low = subpackage(src)
        if low is None:
            continue
        if low not in rank:
            bad.append(f"{src}: durable.{low} is not in the order")
            continue
        for target in sorted(targets):
            high = subpackage(target)
            if high is None or high == low or (low == "log" and target in allowed):
                continue
            if high not in rank or rank[high] > rank[low]:
                bad.append(f"{src} -> {target}")
    return bad


def test_the_subpackages_import_only_those_below_them() -> None:
    edges = graph(ROOT, {"durable": "durable"}, type_only=True)
    found = {subpackage(name) for name in edges} - {None}
    assert found == set(SUBPACKAGE_ORDER)  # every subpackage is placed, and only those
    assert order_breaches(edges) == []


def test_the_order_check_sees_an_import_upward(tmp_path: Path) -> None:
    """A low subpackage importing a higher one, inside a function or for types only, is
    reported; importing a lower one, or a module at the library's top, is not."""
    for sub in ("log", "agents", "controls"):
        (tmp_path / "durable" / sub).mkdir(parents=True)
        (tmp_path / "durable" / sub / "__init__.py").write_text("")
    (tmp_path / "durable" / "__init__.py").write_text("")
    (tmp_path / "durable" / "clock.py").write_text("")
    (tmp_path / "durable" / "agents" / "steps.py").write_text(
        "from durable import clock\nfrom durable.log import keys\n"
        "def f():\n    from durable.controls import cancellation\n")
    (tmp_path / "durable" / "log" / "keys.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from durable.agents import A\n")
    (tmp_path / "durable" / "controls" / "cancellation.py").write_text(
        "from durable.agents import steps\n")
    edges = graph(tmp_path, {"durable": "durable"}, type_only=True)
    assert order_breaches(edges, ("log", "agents", "controls"), frozenset()) == [
        "durable.agents.steps -> durable.controls.cancellation",
        "durable.log.keys -> durable.agents"]


def folder_name_imports(root: Path) -> list[str]:
    """Imports, anywhere in the project's Python, of a process by its folder's name."""
    folders = {PACKAGES[p] for p in PROCESSES}
    bad = []
    for top in (*PACKAGES.values(), "tests", "bench"):
        for path in sorted((root / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module or ""]
                else:
                    continue
                bad += [f"{path.relative_to(root)}:{node.lineno}: {n}" for n in names
                        if n.split(".")[0] in folders]
    return bad


def test_nothing_imports_a_process_by_its_folder_name() -> None:
    """``workers.loop`` works in a checkout (the folder is on the path) but not once
    installed: the process is ``durable.workers.loop`` there."""
    assert folder_name_imports(ROOT) == []


def test_the_check_sees_a_folder_name_import(tmp_path: Path) -> None:
    for top in (*PACKAGES.values(), "tests", "bench"):
        (tmp_path / top).mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "import durable.workers.loop\nfrom . import workers\n\ndef f():\n"
        "    from workers.loop import StepLoop\n")
    (tmp_path / "bench" / "b.py").write_text("import console.app\n")
    assert sorted(folder_name_imports(tmp_path)) == ["bench/b.py:1: console.app",
                                                     "tests/test_x.py:5: workers.loop"]


#: The largest module of the library and the processes, in lines: past it, a module holds
#: more than one thing and is split by what it holds (by concern: never trimmed to fit).
MAX_LINES = 450
#: Past this, the suite warns: a review signal that the module's next change should split it.
WARN_LINES = 400


def test_no_module_of_the_library_or_the_processes_is_over_the_limit() -> None:
    library = {name: path for name, path in modules(ROOT, PACKAGES).items()
               if not name.startswith("examples")}
    assert len(library) > 100  # the walk found the library
    long = {name: n for name, path in library.items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
    near = {name: n for name, path in library.items()
            if WARN_LINES < (n := len(path.read_text().splitlines())) <= MAX_LINES}
    if near:
        warnings.warn(f"modules over {WARN_LINES} lines, to split by concern before they "
                      f"reach {MAX_LINES}: {dict(sorted(near.items()))}", stacklevel=1)
