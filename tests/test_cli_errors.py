"""What a user meets when something is wrong: one line on stderr naming what to do, the
documented exit code, no traceback, and never a password."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ServerFactory, run_durable


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")}
    out.update(DURABLE_AGENTS="examples.agents", DURABLE_CONNECT_TIMEOUT_S="0.5",
               XDG_STATE_HOME=str(tmp_path / "state"))
    return out


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if not line.startswith("durable: waiting")
             and not line.startswith("durable: warning:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_redis_down_is_one_line_and_exit_3(env: dict[str, str]) -> None:
    env["DURABLE_REDIS_URL"] = "redis://127.0.0.1:1/0"
    out = run_durable("runs", env=env)
    assert out.returncode == 3
    line = _one_line(out.stderr)
    assert line.startswith("durable: cannot reach Redis at redis://127.0.0.1:1/0")


def test_a_wrong_password_is_one_line_without_the_password(
    env: dict[str, str], make_server: ServerFactory
) -> None:
    srv = make_server(fsync="everysec")
    srv.client().config_set("requirepass", "right-one")
    env["DURABLE_REDIS_URL"] = srv.url.replace("redis://", "redis://:wrong-one@")
    out = run_durable("runs", env=env)
    assert out.returncode == 3
    line = _one_line(out.stderr)
    assert "refused the credentials" in line and "wrong-one" not in out.stderr


def test_a_closed_pipe_ends_quietly(env: dict[str, str], make_server: ServerFactory) -> None:
    """``durable log RUN --json | head -1`` on a log far larger than a pipe's buffer."""
    srv = make_server(fsync="everysec")
    env["DURABLE_REDIS_URL"] = srv.url
    assert run_durable("start", "count", "--run-id", "big", "--input", '{"steps": 400}',
                    env=env).returncode == 0
    assert run_durable("worker", "--burst", env=env, timeout=120).returncode == 0
    whole = run_durable("log", "big", "--json", env=env)
    assert len(whole.stdout) > 200_000  # well past a 64 KiB pipe
    shell = f"{sys.executable} -m durable log big --json | head -1"
    out = subprocess.run(shell, shell=True, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.count("\n") == 1
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr


def test_an_input_nested_too_deeply_is_a_usage_error(env: dict[str, str],
                                                     make_server: ServerFactory) -> None:
    env["DURABLE_REDIS_URL"] = make_server(fsync="everysec").url
    deep = "[" * 10_000 + "]" * 10_000
    out = run_durable("start", "count", "--input", deep, env=env)
    assert out.returncode == 2
    assert _one_line(out.stderr) == "durable: --input is nested too deeply"


@pytest.mark.parametrize("modules, missing", [("nosuch_agents", "it"),
                                               ("examples.agents,nosuch.sub", "it"),
                                               ("mine.needs_more", "its import of")])
def test_an_agents_module_that_cannot_be_found_is_one_line(
        env: dict[str, str], make_server: ServerFactory, tmp_path: Path, modules: str,
        missing: str) -> None:
    """``DURABLE_AGENTS`` naming a module that is not importable (a typo, a module outside
    the path, a dependency not installed): one line naming it, exit 2, for a worker too."""
    env["DURABLE_REDIS_URL"] = make_server(fsync="everysec").url
    env["DURABLE_AGENTS"] = modules
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "needs_more.py").write_text("import not_installed_here\n")
    # mine/ and the checkout (examples.agents: not installed) from another directory
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(Path(__file__).parent.parent)])
    for args in (("worker", "--burst"), ("start", "count")):
        out = run_durable(*args, env=env, cwd=tmp_path)
        assert out.returncode == 2, out.stderr
        line = _one_line(out.stderr)
        named = modules.split(",")[-1]
        assert f"DURABLE_AGENTS names '{named}', but {missing}" in line, line


def test_times_are_shown_for_people_and_kept_as_milliseconds_in_json(
    env: dict[str, str], make_server: ServerFactory
) -> None:
    from durable.cli.output import age

    assert age(1_000, now_ms=4_000) == "3 s ago"
    assert age(4_000 + 120_000, now_ms=4_000) == "in 2 min"
    assert age(0) == ""
    env["DURABLE_REDIS_URL"] = make_server(fsync="everysec").url
    assert run_durable("start", "count", "--run-id", "t1", env=env).returncode == 0
    table = run_durable("runs", env=env).stdout
    assert "s ago" in table
    row = run_durable("runs", "--json", env=env).stdout
    assert '"updated":1' in row  # epoch milliseconds for scripts


def test_runs_page_and_filter_by_agent(env: dict[str, str],
                                       make_server: ServerFactory) -> None:
    env["DURABLE_REDIS_URL"] = make_server(fsync="everysec").url
    env["DURABLE_AGENTS"] = "examples.agents,tests.agents.basic"
    for i in range(5):
        assert run_durable("start", "count", "--run-id", f"c{i}", env=env).returncode == 0
        assert run_durable("start", "echo", "--run-id", f"e{i}", env=env).returncode == 0

    def ids(*args: str) -> list[str]:
        out = run_durable("runs", "--json", *args, env=env)
        assert out.returncode == 0, out.stderr
        return [json.loads(line)["run_id"] for line in out.stdout.splitlines()]

    everything = ids()
    assert len(everything) == 10
    first = ids("--limit", "4")
    second = ids("--limit", "4", "--after", first[-1])
    third = ids("--limit", "4", "--after", second[-1])
    assert first + second + third == everything
    assert sorted(ids("--agent", "count")) == [f"c{i}" for i in range(5)]
    assert ids("--agent", "count", "--limit", "2") == [r for r in everything
                                                       if r.startswith("c")][:2]


def test_an_acl_user_without_a_needed_permission_is_one_line(
    env: dict[str, str], make_server: ServerFactory
) -> None:
    """A user that may read but not write: starting a run is refused by Redis (NOPERM)."""
    srv = make_server(fsync="everysec")
    srv.client().execute_command("ACL", "SETUSER", "reader", "on", ">reader-pw", "~*",
                                 "&*", "+@read", "+@connection", "-@write", "-@scripting")
    env["DURABLE_REDIS_URL"] = srv.url.replace("redis://", "redis://reader:reader-pw@")
    out = run_durable("start", "count", env=env)
    assert out.returncode == 3
    line = _one_line(out.stderr)
    assert "denied a command to this user" in line and "reader-pw" not in out.stderr
    assert "warning" not in out.stderr  # denied CONFIG too: not warned of it, which it
    assert out.stderr.count("\n") == 1  # could never clear; the one line stays alone


def test_tls_against_a_server_without_tls_is_one_line(env: dict[str, str],
                                                      make_server: ServerFactory) -> None:
    srv = make_server(fsync="everysec")
    env["DURABLE_REDIS_URL"] = srv.url.replace("redis://", "rediss://")
    out = run_durable("runs", env=env)
    assert out.returncode == 3
    assert _one_line(out.stderr).startswith("durable: cannot reach Redis at rediss://")


@pytest.mark.parametrize(("setting", "command", "named"), [
    ({"DURABLE_CONTEXT_RETENTION": "banana"}, ("runs",), "DURABLE_CONTEXT_RETENTION=banana"),
    ({"DURABLE_CONTEXT_RETENTION": "2h", "DURABLE_RETENTION": "1h"}, ("worker", "--burst"),
     "DURABLE_RETENTION=1h"),
    ({"DURABLE_LEASE_TTL_MS": "abc"}, ("reconciler", "--once"), "DURABLE_LEASE_TTL_MS=abc"),
    ({"DURABLE_LEASE_TTL_MS": "abc"}, ("start", "count", "--input", '{"steps": 1}'),
     "DURABLE_LEASE_TTL_MS=abc"),
    ({"DURABLE_CONTEXT_RETENTION": "banana"}, ("console",), "DURABLE_CONTEXT_RETENTION"),
])
def test_a_malformed_setting_is_one_line_and_exit_2(
    setting: dict[str, str], command: tuple[str, ...], named: str, env: dict[str, str]
) -> None:
    """Every entry point turns a setting it cannot read into one line naming the variable
    and its value, and exit 2 (a usage error), not pydantic's traceback."""
    env.update(setting)
    out = run_durable(*command, env=env)
    assert out.returncode == 2, (out.returncode, out.stderr)
    line = _one_line(out.stderr)
    assert line.startswith("durable: bad setting: ") and named in line, line
