"""``Client.start_many``: many runs of one agent started in a few round trips, with the
guarantees of ``start`` for each."""

from __future__ import annotations

import pytest

from durable.client import Client
from durable.errors import InvalidInput, RunIdConflict, TooManyPendingRuns
from durable.testing import wait_for
from tests.conftest import WorkerFactory


def _runs(client: Client) -> int:
    return len(client.runs(limit=10_000))


def test_many_runs_start_and_complete(client: Client, worker: WorkerFactory) -> None:
    ids = [f"many-{i}" for i in range(60)]
    started = client.start_many("count", [{"steps": 2}] * len(ids), run_ids=ids)
    assert [s.run_id for s in started] == ids and all(s.created for s in started)
    worker(DURABLE_CONCURRENCY="16")
    completed = client.log.keys.runs_in_state("completed")
    assert wait_for(lambda: client.redis.zcard(completed) == 60, 60)
    for run_id in ids:
        assert client.status(run_id).state == "completed"


def test_again_with_the_same_inputs_writes_nothing(client: Client) -> None:
    ids = ["again-1", "again-2"]
    client.start_many("count", [{"steps": 1}, {"steps": 2}], run_ids=ids)
    lengths = [client.redis.xlen(client.log.keys.log(r)) for r in ids]
    again = client.start_many("count", [{"steps": 1}, {"steps": 2}], run_ids=ids)
    assert [s.created for s in again] == [False, False]
    assert [client.redis.xlen(client.log.keys.log(r)) for r in ids] == lengths


def test_one_bad_input_or_conflicting_id_writes_nothing(client: Client) -> None:
    """Every input is checked before the first append: no partial batch."""
    client.start("count", {"steps": 1}, run_id="taken")
    before = _runs(client)
    with pytest.raises(InvalidInput):
        client.start_many("count", [{"steps": 1}, {"steps": -5}], run_ids=["b-1", "b-2"])
    with pytest.raises(RunIdConflict):
        client.start_many("count", [{"steps": 1}, {"steps": 9}], run_ids=["b-3", "taken"])
    assert _runs(client) == before
    assert not client.redis.exists(client.log.keys.log("b-1"), client.log.keys.log("b-3"))


def test_a_batch_over_the_pending_limit_is_refused_whole(client: Client) -> None:
    limited = Client(client.settings.replace(max_pending_runs=5), client.redis)
    limited.start_many("count", [{"steps": 1}] * 3, run_ids=["p-1", "p-2", "p-3"],
                       enqueue=False)
    with pytest.raises(TooManyPendingRuns):
        limited.start_many("count", [{"steps": 1}] * 3, run_ids=["p-4", "p-5", "p-6"])
    assert not client.redis.exists(client.log.keys.log("p-4"))
    assert len(limited.start_many("count", [{"steps": 1}] * 2, run_ids=["p-4", "p-5"])) == 2
