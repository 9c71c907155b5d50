"""``jobwheel status`` says a long error once: the text of a job DEAD on an unknown task, as
the status API returned it on a real stack, printed its message six times (the run's error,
the worker's event, the dead run's reason and the job's, which embed it)."""

from __future__ import annotations

from typing import Any

from jobwheel.consumers.status.cli import AS_ABOVE, status_lines

REGISTERED = "demo.count, demo.echo, demo.fail, demo.flaky, demo.sleep, test.gate"
ERROR = (
    "TaskError: unknown task 'demo.ecko': not registered in this worker; start the worker "
    f"with --tasks naming the module that defines it (registered: {REGISTERED})"
)
WORKER_REASON = "unknown task 'demo.ecko' on queue 'default'"
RUN_DEAD = f"attempt 1 failed and is not retried ({WORKER_REASON}): {ERROR}"
JOB_DEAD = f"its last run ended DEAD: {RUN_DEAD}"


def _payload() -> dict[str, Any]:
    run_id = "j@1"
    return {
        "job": {
            "job_id": "j",
            "state": "DEAD",
            "task": "demo.ecko",
            "attempts": 1,
            "last_error": ERROR,
            "last_reason": JOB_DEAD,
        },
        "runs": [{"run_id": run_id, "state": "DEAD", "attempts": 1, "error": ERROR}],
        "events": [
            {"event_time_ms": 1, "state": "SCHEDULED"},
            {"event_time_ms": 2, "state": "DISPATCHED", "run_id": run_id, "attempt": 1},
            {
                "event_time_ms": 3,
                "state": "FAILED",
                "run_id": run_id,
                "attempt": 1,
                "worker": "vm:1",
                "reason": WORKER_REASON,
                "error": ERROR,
            },
            {
                "event_time_ms": 4,
                "state": "DEAD",
                "run_id": run_id,
                "attempt": 1,
                "reason": RUN_DEAD,
            },
            {"event_time_ms": 4, "state": "DEAD", "reason": JOB_DEAD},
        ],
    }


def test_status_prints_a_long_error_once_and_refers_to_it_after() -> None:
    text = "\n".join(status_lines(_payload()))
    assert text.count(REGISTERED) == 1, text
    assert text.count(WORKER_REASON) == 2, text  # in the job's reason and the worker's event
    job, run, _header, *events = status_lines(_payload())
    assert f"last_error={ERROR!r}" in job
    said = f"its last run ended DEAD: attempt 1 failed and is not retried ({WORKER_REASON}): "
    assert f"reason={said + AS_ABOVE!r}" in job
    assert f"error={AS_ABOVE!r}" in run
    assert events[-1].endswith(f"reason={AS_ABOVE!r}")


def test_short_texts_are_said_again() -> None:
    payload = _payload()
    payload["job"] |= {"last_error": "E: boom", "last_reason": None}
    payload["runs"][0]["error"] = "E: boom"
    payload["events"] = []
    assert all("E: boom" in line for line in status_lines(payload)[:2])
