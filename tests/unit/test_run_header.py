"""The ``jobwheel.run`` header of runs records (schemas/topics.py): what the scheduler writes a
worker reads back whole, even a run id with spaces, and anything else names no run (the worker
then answers nothing rather than a run the scheduler never dispatched)."""

from __future__ import annotations

import pytest

from jobwheel.schemas.models import Run
from jobwheel.schemas.topics import RUN_HEADER, RunRef, read_run_header, run_header

T0 = 1_800_000_000_000


def run(job_id: str = "job 1", run_id: str | None = None, attempt: int = 3) -> Run:
    return Run(
        run_id or f"{job_id}@trigger-{T0}",
        job_id,
        "billing.send_invoice",
        "{}",
        T0 + 9,
        T0,
        T0 + 5,
        attempt,
        4,
        None,
        30_000,
        T0 + 30_005,
        2,
        17,
    )


def test_what_the_scheduler_writes_a_worker_reads_back():
    r = run()
    ref = read_run_header(r.job_id.encode(), [("other", b"x"), (RUN_HEADER, run_header(r))])
    assert ref == RunRef(
        job_id=r.job_id,
        run_id=r.run_id,
        attempt=r.attempt,
        seq=r.seq,
        fencing_token=r.fencing_token,
        scheduled_time_ms=r.scheduled_time_ms,
        dispatched_at_ms=r.dispatched_at_ms,
        task=r.task,
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (None, run_header(run())),  # no key: no job
        (b"job 1", None),
        (b"job 1", b"3 5 17 1 2 billing.send_invoice"),  # no run id
        (b"job 1", b"x 5 17 1 2 t job 1@1"),  # not a number
        (b"job 1", b"0 5 17 1 2 t job 1@1"),  # attempts count from 1
        (b"job 1", b"3 5 17 1 2 t other@1"),  # another job's run
        (b"job 1", b"3 5 17 1 2  job 1@1"),  # no task
        (b"job 1", b"\xff 5 17 1 2 t job 1@1"),  # not text
        (b"\xff", run_header(run())),
    ],
)
def test_a_header_the_scheduler_did_not_write_names_no_run(key, value):
    assert read_run_header(key, [(RUN_HEADER, value)]) is None


def test_a_record_without_the_header_names_no_run():
    assert read_run_header(b"job 1", None) is None
    assert read_run_header(b"job 1", [("jobwheel.state", b"FAILED")]) is None
