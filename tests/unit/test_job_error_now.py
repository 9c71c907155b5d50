"""A job's last error and reason describe it as it is now (migration 0010): a later success, a
new definition or a resume clears them; the events keep every one. Status store units on the
embedded engine, read after the parts merged (a merge must not bring an old error back)."""

from __future__ import annotations

from jobwheel.consumers.status import queries
from jobwheel.consumers.status.store import StatusStore
from jobwheel.schemas.models import State
from tests.status_support import event, now_ms, store_before


def _merged_job(store: StatusStore, job_id: str) -> dict[str, object]:
    store.client.command("OPTIMIZE TABLE job_state FINAL")
    # every column the store's `jobs` has at its version (queries read today's)
    [job] = store.dicts("SELECT * FROM jobs WHERE job_id = {job_id:String}", {"job_id": job_id})
    return job


def test_a_job_whose_run_succeeded_after_a_failure_shows_no_error(store: StatusStore) -> None:
    t0 = now_ms()
    run = "job-s@1"
    store.add_events(
        [
            event("job-s", State.SCHEDULED, seq=0, t=t0, task="t"),
            event("job-s", State.DISPATCHED, seq=1, t=t0 + 1, run_id=run, attempt=1),
            event("job-s", State.FAILED, seq=1, t=t0 + 2, run_id=run, attempt=1, error="E: boom"),
            event("job-s", State.RETRYING, seq=2, t=t0 + 3, run_id=run, attempt=1, error="E: boom"),
        ]
    )
    assert _merged_job(store, "job-s")["last_error"] == "E: boom"  # while it retries
    store.add_events(
        [
            event("job-s", State.DISPATCHED, seq=3, t=t0 + 10, run_id=run, attempt=2),
            event("job-s", State.SUCCEEDED, seq=3, t=t0 + 11, run_id=run, attempt=2),
            event("job-s", State.COMPLETED, seq=4, t=t0 + 12),
        ]
    )
    job = _merged_job(store, "job-s")
    assert (job["state"], job["last_error"]) == ("COMPLETED", None)


def test_a_resumed_job_does_not_keep_a_refused_pause_as_its_last_word(store: StatusStore) -> None:
    t0 = now_ms()
    refused = "cannot pause: job is already PAUSED"
    store.add_events(
        [
            event("job-p", State.SCHEDULED, seq=0, t=t0, task="t"),
            event("job-p", State.PAUSED, seq=1, t=t0 + 1),
            event("job-p", State.REJECTED, seq=1, t=t0 + 2, reason=refused),
        ]
    )
    assert _merged_job(store, "job-p")["last_reason"] == refused  # true while it is paused
    store.add_events([event("job-p", State.RESUMED, seq=2, t=t0 + 3)])
    job = _merged_job(store, "job-p")
    assert (job["state"], job["last_reason"], job["last_error"]) == ("SCHEDULED", None, None)
    # the events keep it
    assert refused in [e["reason"] for e in queries.job_events(store, "job-p")]


def test_a_store_with_events_gets_the_job_notes_of_now_from_migration_0010(
    engine_dsn: str,
) -> None:
    """Migration 0010 on a store that already holds a job that succeeded after a failure and
    was resumed after a refused pause, merged: both were kept before, cleared after, and
    events after it follow the new rule too."""
    with store_before(engine_dsn, 10) as (store, migrate):
        t0 = now_ms()
        store.add_events(
            [
                event("j", State.SCHEDULED, seq=0, t=t0, task="t"),
                event("j", State.FAILED, seq=1, t=t0 + 1, run_id="j@1", attempt=1, error="E"),
                event("j", State.PAUSED, seq=2, t=t0 + 2),
                event("j", State.REJECTED, seq=2, t=t0 + 3, reason="cannot pause"),
                event("j", State.RESUMED, seq=3, t=t0 + 4),
                event("j", State.SUCCEEDED, seq=4, t=t0 + 5, run_id="j@1", attempt=2),
            ]
        )
        job = _merged_job(store, "j")
        assert (job["last_error"], job["last_reason"]) == ("E", "cannot pause")
        assert migrate() == [10]
        job = _merged_job(store, "j")
        assert (job["last_error"], job["last_reason"]) == (None, None)
        store.add_events(
            [event("j", State.FAILED, seq=5, t=t0 + 6, run_id="j@2", attempt=1, error="E2")]
        )
        assert _merged_job(store, "j")["last_error"] == "E2"
