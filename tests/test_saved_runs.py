"""A saved run is a test (``durable export RUN --saved``, ``durable.testing.replay_file``,
``durable replay-test``): runs recorded by a real worker on a real Redis, against the local
model server, then replayed from their files alone against agent code, with no model, no
tool and no Redis; a changed argument, a changed prompt, a changed ``decide()`` fail naming
the step. The known-good logs of ``tests/fixtures`` are replayed as tests here too."""

from __future__ import annotations

import base64
import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest

import examples.agents  # noqa: F401  (the agents the fixtures' runs are of)
import tests.agents.basic  # noqa: F401
from durable.agents import registry
from durable.audit.offline import load
from durable.cli import main
from durable.client import Client
from durable.errors import UsageError
from durable.security.sealing import Keyring
from durable.settings import Settings
from durable.testing import SavedRunDiverged, replay_file, saved_run_tests
from tests.agents import model_steps, saved
from tests.conftest import ModelFactory, WorkerFactory, run_durable
from tests.servers.model import ModelServer

FIXTURES = Path(__file__).parent / "fixtures"
AGENTS = "examples.agents,tests.agents.basic,tests.agents.model_steps"
CARD = "4111222233334444"

#: Every known-good log kept as a fixture replays against the agents of this checkout.
test_known_good_logs_replay = saved_run_tests(FIXTURES)


@pytest.fixture()
def model(serve_model: ModelFactory) -> ModelServer:
    return serve_model(AGENTS, tokens=5)


def _export(run: str, path: Path) -> Path:
    assert main(["export", run, "--saved", "-o", str(path)]) == 0
    return path


def _offline_env() -> dict[str, str]:
    """The environment of a process with no Redis to reach: nothing listens on port 1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")}
    return {**env, "DURABLE_REDIS_URL": "redis://127.0.0.1:1/0"}


def test_a_saved_code_agent_run_replays_offline_and_a_change_fails_naming_its_step(
        client: Client, worker: WorkerFactory, model: ModelServer, tmp_path: Path) -> None:
    """Three model calls, each followed by a tool step, recorded by a real worker; the file
    replays with the model server stopped and no Redis; the same code with one tool
    argument changed fails at that step, with both values; another prompt fails at the
    first model step, by its request's digest."""
    run = client.start("model_looper", {"calls": 3}, run_id="saved-code").run_id
    worker(burst=True).wait(60)
    assert client.wait(run, 30).state == "completed"
    path = _export(run, tmp_path / "saved-code.jsonl.gz")
    with gzip.open(path, "rt") as f:
        head = json.loads(f.readline())
    assert head == {"kind": "format", "format": "durable-run", "version": 1, "run": run}
    model.stop()
    sent = len(model.seen)

    verdict = replay_file(path)
    assert (verdict.ok, verdict.steps, verdict.agent) == (True, 6, "model_looper")
    assert len(model.seen) == sent  # no model

    done = run_durable("replay-test", str(path), "--agents", AGENTS, "--json",
                       env=_offline_env())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outcome"] == "same"

    with pytest.raises(SavedRunDiverged) as changed:
        replay_file(path, saved.looper_other_argument.agent)  # type: ignore[attr-defined]
    assert changed.value.step == 6, changed.value
    assert "'n': 2 recorded, 3 now" in str(changed.value)
    with pytest.raises(SavedRunDiverged) as prompt:
        replay_file(path, saved.looper_other_prompt.agent)  # type: ignore[attr-defined]
    assert prompt.value.step == 1 and "digest" in str(prompt.value), prompt.value

    # The CLI fails it too, with no Redis: exit 1, the step named.
    registry.agents["model_looper"] = saved.looper_other_argument.agent  # type: ignore
    try:
        code = main(["replay-test", str(path), "--agents", AGENTS, "--json"])
    finally:
        registry.agents["model_looper"] = model_steps.model_looper.agent  # type: ignore
    assert code == 1


def test_a_saved_decide_agent_run_replays_and_a_changed_decision_fails_naming_its_step(
        client: Client, worker: WorkerFactory, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A ``decide()`` agent's run: each recorded step is decided again from the state
    before it, and the end too; the third step decided with other arguments fails there."""
    run = client.start("count", {"steps": 4}, run_id="saved-count").run_id
    worker(burst=True).wait(60)
    assert client.wait(run, 30).state == "completed"
    path = _export(run, tmp_path / "saved-count.jsonl")
    assert replay_file(path).steps == 4
    with pytest.raises(SavedRunDiverged) as changed:
        replay_file(path, registry.agent("count_other_third"))
    assert changed.value.step == 3 and "'n': 3 recorded, 30 now" in str(changed.value)

    capsys.readouterr()
    assert main(["replay-test", str(path), str(FIXTURES / "count_completed.jsonl")]) == 0
    assert "2 saved run(s): 2 replay the same, 0 diverge" in capsys.readouterr().out


def test_a_saved_run_keeps_sensitive_fields_sealed_and_replays_with_the_key(
        settings: Any, r: Any, worker: WorkerFactory, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The card number (a sealed input and argument) is not in the file; the replay opens
    it with the environment's key, and without the key it is refused by name."""
    import tests.agents.sensitive  # noqa: F401  (registers secret_checkout)

    monkeypatch.setenv("DURABLE_ENCRYPTION_KEYS",
                       f"k1:{base64.b64encode(os.urandom(32)).decode()}")
    monkeypatch.setenv("DURABLE_AGENTS", AGENTS + ",tests.agents.sensitive")
    monkeypatch.setenv("TEST_SEEN_FILE", str(tmp_path / "seen.txt"))
    client = Client(Settings(), r)
    client.start("secret_checkout", {"holder": "Ann", "card_number": CARD, "amount": 7},
                 run_id="sealed-saved")
    worker(burst=True).wait(60)
    assert client.wait("sealed-saved", 30).state == "completed"
    path = _export("sealed-saved", tmp_path / "sealed.jsonl")
    assert CARD not in path.read_text() and "_sealed" in path.read_text()
    assert replay_file(path).ok
    with pytest.raises(UsageError, match="DURABLE_ENCRYPTION_KEYS"):
        replay_file(path, keyring=Keyring({}, None))


def test_a_file_of_a_newer_format_or_an_undecodable_entry_is_refused_by_name(
        tmp_path: Path) -> None:
    """Bad input is a clear error: a file of a later format version, an entry that does
    not decode, a file that is not a run's log."""
    newer = tmp_path / "newer.jsonl"
    newer.write_text(json.dumps({"kind": "format", "format": "durable-run", "version": 9})
                     + "\n" + (FIXTURES / "count_completed.jsonl").read_text())
    with pytest.raises(UsageError, match="version 9; this version of durable reads"):
        load(newer)
    lines = (FIXTURES / "count_completed.jsonl").read_text().splitlines()
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join([lines[0], '{"type": "step_decided", "seq": 3}', *lines[1:]]))
    with pytest.raises(UsageError, match="does not decode"):
        load(broken)
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"kind": "summary"}) + "\n")
    with pytest.raises(UsageError, match="not a saved run"):
        load(other)
