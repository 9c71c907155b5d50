"""A quick run's worker sends only its verdict, with ``started_ms``: the status store must still
show the run's STARTED (events, ``runs.started_ms``), as if the worker had sent one."""

from __future__ import annotations

import threading

from jobwheel.consumers.status import queries
from jobwheel.consumers.status.sink import StatusSink
from jobwheel.consumers.status.store import StatusStore
from jobwheel.schemas.models import State
from jobwheel.settings import Settings
from tests.status_support import committed, event, now_ms, produce
from tests.support import wait_until


def test_a_verdict_with_started_ms_shows_the_run_started(
    settings: Settings, store: StatusStore
) -> None:
    t0 = now_ms()
    run = f"quick@{t0}"
    events = [
        event("quick", State.SCHEDULED, seq=1, t=t0, task="demo.echo", next_fire_ms=t0 + 10),
        event(
            "quick",
            State.DISPATCHED,
            seq=2,
            t=t0 + 15,
            run_id=run,
            attempt=1,
            task="demo.echo",
            scheduled_time_ms=t0 + 10,
        ),
        event(
            "quick",
            State.SUCCEEDED,
            seq=2,
            t=t0 + 22,
            run_id=run,
            attempt=1,
            worker="w:9",
            duration_ms=2,
            started_ms=t0 + 20,
            event_id=f"{run}:1:SUCCEEDED",
        ),
        event("quick", State.COMPLETED, seq=3, t=t0 + 23),
    ]
    sink = StatusSink(settings, store, batch_size=100, batch_ms=50)
    thread = threading.Thread(target=sink.run, daemon=True)
    thread.start()
    try:
        produce(settings, events)
        wait_until(lambda: committed(settings) == len(events), 30, message="not committed")
    finally:
        sink.stop()
        thread.join(30)
    assert sink.stats.inserted == len(events) + 1  # and the STARTED it stands for
    states = [e["state"] for e in queries.job_events(store, "quick")]
    assert states == ["SCHEDULED", "DISPATCHED", "STARTED", "SUCCEEDED", "COMPLETED"]
    started = next(e for e in queries.job_events(store, "quick") if e["state"] == "STARTED")
    assert (started["event_time_ms"], started["worker"], started["source"]) == (
        t0 + 20,
        "w:9",
        "worker",
    )
    (row,) = queries.job_runs(store, "quick")
    assert (row["state"], row["started_ms"], row["lateness_ms"]) == ("SUCCEEDED", t0 + 20, 5)
