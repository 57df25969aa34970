"""Who may use the console, without a browser: the users file (TOML or JSON: scrypt
password hashes, roles, an approver's key), ``durable console --hash-password``, and
development mode (no login, on a loopback address only), against real ``durable console``
processes and a real Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from durable.backend.embedded import free_port
from durable.errors import UsageError
from durable.security.users import User, Users, hash_password, verify_password
from durable.testing import Server, wait_for
from durable.testing.processes import Process


def test_passwords_are_scrypt_hashes_checked_in_constant_time() -> None:
    stored = hash_password("s3cret")
    assert stored.startswith("scrypt$") and "s3cret" not in stored
    assert verify_password("s3cret", stored) and not verify_password("s3cret!", stored)
    assert not verify_password("s3cret", "scrypt$garbage")
    users = Users({"a": User("a", frozenset({"viewer"}), stored)})
    assert users.check("a", "s3cret") is not None
    assert users.check("a", "nope") is None and users.check("b", "s3cret") is None


@pytest.mark.parametrize(("text", "error"), [
    ("not toml [", "not valid TOML"),
    ("[users.a]\npassword = 'plain'\n", "must be a scrypt hash"),
    ("[users.a]\npassword = 'scrypt$1$1$1$a$b'\nroles = ['root']\n", "unknown roles"),
    ("title = 'no users'\n", "no [users.NAME] entries"),
])
def test_a_bad_users_file_is_one_clear_error(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "users.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=error.replace("[", r"\[")):
        Users.load(path)


def test_a_users_file_in_json_names_the_approvers_key(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    (tmp_path / "al.pem").write_text("a key file")
    path.write_text(json.dumps({"users": {"al": {
        "password": hash_password("pw"), "roles": ["approver"], "approver_key": "al.pem"}}}))
    user = Users.load(path).get("al")
    assert user is not None and user.can("approver") and user.can("viewer")
    assert not user.can("operator") and user.approver_key == tmp_path / "al.pem"


def test_development_mode_is_refused_off_loopback_and_a_login_needs_users(
        server: Server, r: redis.Redis) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")}
    env["DURABLE_REDIS_URL"] = server.url
    for args, error in ((["--dev", "--host", "0.0.0.0"], "only on a loopback address"),
                        ([], "set DURABLE_CONSOLE_USERS")):
        out = subprocess.run([sys.executable, "-m", "durable", "console", *args], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and error in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


def test_hash_password_reads_stdin() -> None:
    out = subprocess.run([sys.executable, "-m", "durable", "console", "--hash-password"],
                         input="pw\n", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and verify_password("pw", out.stdout.strip())


def test_development_mode_on_loopback_needs_no_login(server: Server, settings: Any) -> None:
    port = free_port()
    proc = Process(server.url, ["console", "--dev", "--dev-user", "dora", "--port", str(port)])
    url = f"http://127.0.0.1:{port}"

    def page() -> httpx.Response | None:
        try:
            return httpx.get(f"{url}/workers", timeout=2)
        except httpx.HTTPError:
            return None

    try:
        assert wait_for(lambda: page() is not None, 30, interval=0.2)
        reply = page()
        assert reply is not None and reply.status_code == 200
        assert 'id="whoami">dora<' in reply.text and "dev mode" in reply.text
    finally:
        proc.stop()
