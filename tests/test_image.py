"""The image (deploy/Dockerfile and .dockerignore): a user of its own, a build context
without the virtualenv or git, the example agents, and every package the wheel holds."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _dockerfile() -> list[tuple[str, str]]:
    """deploy/Dockerfile as (INSTRUCTION, arguments), continuation lines joined."""
    text = (ROOT / "deploy" / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [(op.upper(), rest.strip()) for op, _, rest in
            (line.partition(" ") for line in lines if line and not line.startswith("#"))]


def parses(command: list[str]) -> None:
    """``command`` is a ``durable`` command line the CLI accepts, or a ``python -m
    examples`` one (the examples' commands, from the copy of the examples)."""
    from durable.cli.main import build_parser
    from examples.cli import register

    if command[:3] == ["python", "-m", "examples"]:
        build_parser([register]).parse_args(command[3:])
        return
    assert command[0] == "durable", command
    build_parser().parse_args(command[1:])


def test_the_image_runs_as_a_user_of_its_own() -> None:
    """The last USER is numeric and not root (Kubernetes' runAsNonRoot can check only a
    numeric one), and nothing runs after it as root."""
    steps = _dockerfile()
    users = [i for i, (op, _) in enumerate(steps) if op == "USER"]
    assert users, "no USER: the image would run as root"
    uid = steps[users[-1]][1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, uid
    assert not [op for op, _ in steps[users[-1]:] if op == "RUN"]
    [(_, cmd)] = [s for s in steps if s[0] == "CMD"]
    parses(json.loads(cmd))


def test_the_build_context_leaves_out_the_virtualenv_and_git() -> None:
    """.dockerignore keeps .venv and .git out of the context, and the image copies the
    project's packages one by one (never the whole context)."""
    ignored = {line.strip().rstrip("/") for line in
               (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".venv", ".git", "tests", "**/__pycache__"} <= ignored
    sources = [args.split()[:-1] for op, args in _dockerfile() if op == "COPY"]
    copied = {src for srcs in sources for src in srcs}
    assert "." not in copied and not copied & ignored, copied
    for src in copied:
        assert (ROOT / src).exists(), src


def test_the_image_holds_the_example_agents() -> None:
    """The image copies the examples (not in the wheel) to a directory on its PYTHONPATH and
    names their agents by default, so a compose or Helm install runs something before your
    agents are in."""
    import importlib

    copies = dict(args.split()[:2] for op, args in _dockerfile() if op == "COPY")
    assert {"durable", "workers", "reconciler", "console", "examples"} <= set(copies)
    env = " ".join(args for op, args in _dockerfile() if op == "ENV")
    assert "DURABLE_AGENTS=examples.agents" in env
    [path] = [a.split("=", 1)[1] for a in env.split() if a.startswith("PYTHONPATH=")]
    assert "/agents" in path.split(":")
    assert copies["examples"].rstrip("/").removesuffix("/examples") in path.split(":")
    from durable.agents import registry

    importlib.import_module("examples.agents")
    assert {"pipeline", "count"} <= set(registry.agents)


def test_what_the_image_copies_holds_every_package_of_the_wheel(tmp_path: Path) -> None:
    """The Dockerfile's COPY lines into the build directory alone (nothing else of the
    checkout) hold every package the wheel is made of (pyproject.toml's list, each in its
    folder: package-dir) and every package-data file: a package added to the project but
    not to the image fails here, not at a pod's start."""
    import shutil
    import tomllib

    context = tmp_path / "context"
    for op, args in _dockerfile():
        if op != "COPY":
            continue
        *sources, dest = args.split()
        if dest.startswith("/"):  # beside the wheel, not what it is built from
            continue
        for src in sources:
            target = context / (src if dest.endswith("/") else dest.removeprefix("./"))
            if (ROOT / src).is_dir():
                shutil.copytree(ROOT / src, target,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / src, target)
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = tool["package-dir"]

    def folder(package: str) -> Path:
        """Where setuptools takes ``package`` from: its own mapping, or its parent's."""
        head = package
        rest: list[str] = []
        while head not in folders and "." in head:
            head, _, last = head.rpartition(".")
            rest.insert(0, last)
        return context.joinpath(folders.get(head, head.replace(".", "/")), *rest)

    assert {"durable", "durable.workers", "durable.reconciler", "durable.console"} <= set(
        tool["packages"])
    for package in tool["packages"]:
        assert (folder(package) / "__init__.py").exists(), package
    for package, globs in tool["package-data"].items():
        for pattern in globs:
            assert list(folder(package).glob(pattern)), (package, pattern)
    assert (context / "README.md").exists()  # pyproject.toml's readme
