"""Jobs and runs by queue in the status store: every event names its queue (status_event.v4),
`jobs` and `runs` show it, `list --queue` (GET /jobs?queue=) filters by it; events of older
writers read as no queue, a job's queue then coming from its definition (spec_json), and
migration 0011 gives a store that already holds jobs their queues."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest
from fastavro import schemaless_writer

from jobwheel.consumers.status import queries
from jobwheel.consumers.status.store import EVENT_COLUMNS, StatusStore
from jobwheel.errors import ValidationError
from jobwheel.schemas.catalogue import SchemaCatalogue
from jobwheel.schemas.codec import Codec
from jobwheel.schemas.models import State, StatusEvent
from tests.status_support import event, now_ms, store_before

CATALOGUE = SchemaCatalogue.load()


def _spec(queue: str | None) -> str:
    """A SCHEDULED event's definition (status_event.v3); None: one from before queues."""
    document: dict[str, object] = {"task": "t", "trigger": {"type": "Now"}}
    if queue is not None:
        document["queue"] = queue
    return json.dumps(document)


@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
def test_an_event_of_an_older_writer_reads_with_no_queue_and_a_new_one_keeps_it(
    native: bool,
) -> None:
    codec = Codec(native=native)
    v3 = next(v for v in CATALOGUE.versions if v.label() == "status_event.v3")
    record = {"event_id": "e", "job_id": "j", "state": "SCHEDULED", "event_time_ms": 1,
              "source": "scheduler"}  # fmt: skip
    body = io.BytesIO()
    schemaless_writer(body, v3.parsed, record)
    old = codec.decode(b"\xc3\x01" + v3.fingerprint + body.getvalue())
    assert isinstance(old, StatusEvent) and old.queue is None
    new = StatusEvent("e", "j", State.DISPATCHED, 1, "scheduler", run_id="j@1", queue="reports")
    assert codec.decode(codec.encode(new)) == new


def test_every_status_event_field_is_stored_or_said_why_not() -> None:
    """A field added to StatusEvent and left out of the store's columns would be decoded by
    the sink and dropped without a word (schemas/README.md, "Adding a field")."""
    not_stored = {"started_ms": "becomes a STARTED row of its own (sink._started_row)"}
    fields = {f.name for f in dataclasses.fields(StatusEvent)}
    assert fields - set(EVENT_COLUMNS) == set(not_stored)
    assert set(EVENT_COLUMNS) - fields == {"kafka_partition", "kafka_offset"}  # the sink's own


def _merged(store: StatusStore) -> None:
    for table in ("job_state", "run_state"):
        store.client.command(f"OPTIMIZE TABLE {table} FINAL")


def test_jobs_and_runs_show_their_queue_and_list_filters_by_it(store: StatusStore) -> None:
    t0 = now_ms()
    store.add_events(
        [
            event("r1", State.SCHEDULED, seq=1, t=t0, task="t", queue="reports"),
            event("r1", State.DISPATCHED, seq=2, t=t0 + 1, run_id="r1@1", queue="reports"),
            event("r1", State.SUCCEEDED, seq=2, t=t0 + 2, run_id="r1@1", queue="reports"),
            event("d1", State.SCHEDULED, seq=1, t=t0, task="t", queue="default"),
            # moved to another pool: its latest definition names the queue
            event("m1", State.SCHEDULED, seq=1, t=t0, task="t", queue="default"),
            event("m1", State.SCHEDULED, seq=2, t=t0 + 1, task="t", queue="gpu"),
            # older writers: the definition names the queue, or (before queues) nothing
            event("o1", State.SCHEDULED, seq=1, t=t0, task="t", spec_json=_spec("reports")),
            event("o1", State.DISPATCHED, seq=2, t=t0 + 1, run_id="o1@1"),
            event("o2", State.SCHEDULED, seq=1, t=t0, task="t", spec_json=_spec(None)),
        ]
    )
    _merged(store)
    queue_of = {j["job_id"]: j["queue"] for j in queries.list_jobs(store, queries.JobFilter()).jobs}
    assert queue_of == {"r1": "reports", "d1": "default", "m1": "gpu", "o1": "reports",
                        "o2": "default"}  # fmt: skip
    reports = queries.list_jobs(store, queries.JobFilter(queue="reports"))
    assert sorted(j["job_id"] for j in reports.jobs) == ["o1", "r1"] and reports.total == 2
    assert [r["queue"] for r in queries.job_runs(store, "r1")] == ["reports"]
    assert [r["queue"] for r in queries.job_runs(store, "o1")] == [None]  # not known
    with pytest.raises(ValidationError, match="queue"):
        queries.JobFilter(queue="no such/queue")


def test_migration_0011_gives_the_jobs_a_store_holds_their_queues(engine_dsn: str) -> None:
    """A store at 0010 holding a job scheduled on the queue ``reports`` (its definition says
    so) and a run: after 0011 the job lists under its queue, and events written after it
    (naming their queue) reach jobs and runs through the recreated views."""
    with store_before(engine_dsn, 11) as (store, migrate):
        t0 = now_ms()
        store.add_events(
            [
                event("j", State.SCHEDULED, seq=1, t=t0, task="t", spec_json=_spec("reports")),
                event("j", State.DISPATCHED, seq=2, t=t0 + 1, run_id="j@1"),
            ]
        )
        assert migrate() == [11]
        _merged(store)
        [job] = queries.list_jobs(store, queries.JobFilter(queue="reports")).jobs
        assert (job["job_id"], job["state"], job["task"]) == ("j", "SCHEDULED", "t")
        store.add_events(
            [event("j", State.DISPATCHED, seq=3, t=t0 + 2, run_id="j@2", queue="reports")]
        )
        _merged(store)
        runs = {r["run_id"]: r["queue"] for r in queries.job_runs(store, "j")}
        assert runs == {"j@1": None, "j@2": "reports"}
        assert queries.list_jobs(store, queries.JobFilter(queue="default")).total == 0
