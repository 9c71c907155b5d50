"""A job's definition on its SCHEDULED event (status_event.v3 ``spec_json``), from the
scheduler's rule through the wire and the sink's rows to the store, the console's job page and
its next fires."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from datetime import UTC, datetime

from fastavro import schemaless_writer

from jobwheel.consumers.status import queries
from jobwheel.consumers.status.sink import EventRows
from jobwheel.consumers.status.store import EVENT_COLUMNS, StatusStore
from jobwheel.schemas.codec import SchemaCatalogue, default_codec
from jobwheel.schemas.models import Cron, Every, JobCommand, ScheduleJob, StatusEvent
from jobwheel.streams.processor import SchedulerProcessor
from jobwheel.streams.state.partition import MemoryBackend, PartitionState
from tests import status_support


def _next_january_15() -> int:
    """07:00 UTC on the coming 15 January: a winter day (the New York cron below fires at
    07:30 UTC then), and derived from now, so the store's TTL never drops its events (a fixed
    2027 date here would have failed this file from February 2027 on)."""
    now = datetime.now(UTC)
    year = now.year + (1 if (now.month, now.day) >= (1, 15) else 0)
    return int(datetime(year, 1, 15, 7, 0, tzinfo=UTC).timestamp() * 1000)


T0 = _next_january_15()


def scheduled(job_id: str, body: ScheduleJob) -> StatusEvent:
    proc = SchedulerProcessor(0, PartitionState(MemoryBackend()))
    [event] = proc.on_command(JobCommand(f"c-{job_id}", job_id, T0, body), T0).status
    return event


def test_the_scheduled_event_carries_the_definition_and_only_that_event_does() -> None:
    body = ScheduleJob(
        "billing.send", Cron("0 9 * * MON", "Europe/Berlin"), '{"customer": 7}', max_attempts=5
    )
    event = scheduled("j", body)
    spec = json.loads(event.spec_json or "")
    assert spec["trigger"] == {
        "type": "Cron",
        "expression": "0 9 * * MON",
        "timezone": "Europe/Berlin",
    }
    assert (spec["task"], spec["args_json"], spec["max_attempts"]) == (
        "billing.send",
        '{"customer": 7}',
        5,
    )
    assert default_codec().decode(default_codec().encode(event)) == event
    proc = SchedulerProcessor(0, PartitionState(MemoryBackend()))
    proc.on_command(JobCommand("c1", "k", T0, ScheduleJob("t", Every(1000))), T0)
    [dispatched] = proc.punctuate(T0 + 1000, 10)[0].status
    assert dispatched.spec_json is None


def test_the_sink_writes_it_to_its_column_and_reads_older_events_without_it() -> None:
    rows = EventRows(default_codec())
    event = scheduled("j", ScheduleJob("t", Every(60_000)))
    [row] = rows.rows(default_codec().encode(event), "scheduler", 1, 5)
    assert row[EVENT_COLUMNS.index("spec_json")] == event.spec_json
    assert row[-2:] == [1, 5] and len(row) == len(EVENT_COLUMNS)
    v2 = next(v for v in SchemaCatalogue.load().versions if v.label() == "status_event.v2")
    body = io.BytesIO()
    fields = {f["name"]: None for f in v2.parsed["fields"]}
    fields.update(event_id="e", job_id="j", seq=1, attempt=0, state="SCHEDULED", event_time_ms=T0)
    fields["source"] = "scheduler"
    schemaless_writer(body, v2.parsed, fields)
    [old] = rows.rows(b"\xc3\x01" + v2.fingerprint + body.getvalue(), "scheduler", 0, 1)
    assert old[EVENT_COLUMNS.index("spec_json")] is None
    assert old[EVENT_COLUMNS.index("job_id")] == "j" and len(old) == len(EVENT_COLUMNS)


def test_the_store_serves_the_latest_definition_and_the_next_fires(store: StatusStore) -> None:
    first = scheduled("j", ScheduleJob("t", Every(60_000)))
    replaced = scheduled("j", ScheduleJob("t", Cron("30 2 * * *", "America/New_York")))
    store.add_events([first, replace(replaced, event_id="c2:SCHEDULED", seq=first.seq + 1)])
    spec = queries.job_spec(store, "j")
    assert spec is not None and spec["trigger"]["type"] == "Cron"
    job = queries.get_job(store, "j")
    assert job is not None
    fires = queries.next_fires(job, spec, 3)
    assert fires[0] == job["next_fire_ms"]
    # 02:30 in New York, daily: 07:30 UTC in January
    shown = [datetime.fromtimestamp(t / 1000, UTC).strftime("%H:%M") for t in fires]
    assert shown == ["07:30"] * 3
    every = queries.next_fires(
        {"state": "SCHEDULED", "next_fire_ms": 1_000},
        {"trigger": {"type": "Every", "interval_ms": 500}},
        3,
    )
    assert every == [1_000, 1_500, 2_000]
    assert queries.next_fires({"state": "PAUSED", "next_fire_ms": 1}, spec, 3) == []
    assert queries.job_spec(store, "nobody") is None


def test_the_job_page_shows_a_cron_jobs_times_in_its_zone_beside_utc(store: StatusStore) -> None:
    """A cron job's fires are wall times in its zone: the console writes each of its times in
    UTC and, beside it, in that zone; a job of another trigger keeps UTC alone."""
    from fastapi.testclient import TestClient

    from jobwheel.consumers.status.api import create_app
    from jobwheel.schemas.models import State
    from jobwheel.settings import Settings

    ny = scheduled("ny", ScheduleJob("t", Cron("30 2 * * *", "America/New_York")))
    fire = T0 + 30 * 60_000  # 02:30 in New York, 07:30Z in January
    run = status_support.event(
        "ny",
        State.DISPATCHED,
        seq=ny.seq + 1,
        t=fire + 5,
        run_id=f"ny@{fire}",
        attempt=1,
        task="t",
        scheduled_time_ms=fire,
        next_fire_ms=fire + 86_400_000,  # what the scheduler's event says: the next day's
    )
    store.add_events([ny, run, scheduled("every", ScheduleJob("t", Every(60_000)))])
    settings = Settings(_env_file=None, bootstrap_servers="127.0.0.1:1")  # type: ignore[call-arg]
    with TestClient(create_app(settings, store, job_client_factory=lambda: None)) as client:
        page = client.get("/console/jobs/ny").text
        every = client.get("/console/jobs/every").text
    day = datetime.fromtimestamp(fire / 1000, UTC).strftime("%Y-%m-%d")
    beside = f"{day} 07:30:00.000Z ({day} 02:30:00 EST America/New_York)"
    next_fires = page.split("<dt>next fires</dt><dd>")[1].split("</dd>")[0].split("<br>")
    assert next_fires[0].endswith(
        "07:30:00.000Z (" + next_fires[0][:10] + " 02:30:00 EST America/New_York)"
    )
    assert len(next_fires) > 1 and all("02:30:00 EST America/New_York)" in f for f in next_fires)
    runs = page.split('class="runs"')[1]
    assert beside in runs  # the run's scheduled time
    assert "<dt>created</dt><dd>" in page and " EST America/New_York)</dd>" in page
    assert "America/" not in every and " EST " not in every and "Z (" not in every
