"""What ``jobwheel pause|resume|trigger|cancel`` print: what happened to the job, not only its
id. The command is built as the CLI builds it; no broker is needed to word the outcome."""

from __future__ import annotations

from typing import Any

import pytest

from jobwheel.consumers.status.cli import control_line
from jobwheel.schemas.models import (
    CancelJob,
    JobCommand,
    PauseJob,
    ResumeJob,
    TriggerJob,
    trigger_run_id,
)

ISSUED = 1_900_000_000_123  # fixed date: a trigger's name only, never compared to a clock
BODIES: dict[str, Any] = {
    "cancel": CancelJob(),
    "pause": PauseJob(),
    "resume": ResumeJob(),
    "trigger": TriggerJob(),
}


def command(kind: str) -> JobCommand:
    return JobCommand("c-1", "nightly", ISSUED, BODIES[kind])


@pytest.mark.parametrize(
    ("kind", "line"),
    [
        ("pause", "nightly: pause applied; the job is PAUSED"),
        ("resume", "nightly: resume applied; the job is SCHEDULED"),
        ("cancel", "nightly: cancel applied; the job is CANCELLED"),
    ],
)
def test_an_answered_command_says_the_jobs_new_state(kind: str, line: str) -> None:
    state = line.rsplit(" ", 1)[1]
    assert control_line(kind, command(kind), {"state": state}) == line


@pytest.mark.parametrize(
    ("kind", "line"),
    [
        ("pause", "nightly: pause sent; the scheduler will make the job PAUSED"),
        ("resume", "nightly: resume sent; the scheduler will make the job SCHEDULED"),
        ("cancel", "nightly: cancel sent; the scheduler will make the job CANCELLED"),
        (
            "trigger",
            f"nightly: trigger sent; the scheduler will dispatch run nightly@trigger-{ISSUED}",
        ),
    ],
)
def test_an_unanswered_command_says_it_was_sent_and_what_the_scheduler_will_do(
    kind: str, line: str
) -> None:
    """No answer (the status API down, --wait 0, the scheduler slow): the line still says what
    was sent, and a trigger's run id, which is named by the trigger's issue time."""
    note = {"note": "sent; cannot confirm: the status API at http://x does not answer"}
    assert control_line(kind, command(kind), note) == line
    assert control_line(kind, command(kind), {}) == line


def test_an_answered_trigger_names_its_run_and_the_runs_state() -> None:
    run = trigger_run_id("nightly", ISSUED)
    answer = {"state": "DISPATCHED", "run_id": run}
    assert control_line("trigger", command("trigger"), answer) == (
        f"nightly: trigger applied; run {run} is DISPATCHED"
    )
    # The verdict read from GET /jobs/{id}/commands/{command_id} carries no run id: it is known.
    assert control_line("trigger", command("trigger"), {"state": "DISPATCHED"}) == (
        f"nightly: trigger applied; run {run} is DISPATCHED"
    )
