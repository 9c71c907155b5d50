"""How ``JobClient.wait`` reads a job's outcome from its events (producers/results.py), event by
event as they come off the status and acks partitions, in whatever order the two interleave."""

from __future__ import annotations

import pytest

from jobwheel.errors import JobFailedError
from jobwheel.producers.results import Outcome
from jobwheel.schemas.models import State, StatusEvent

RUN = "j@100"


def ev(state: State, seq: int, event_id: str = "", **kw) -> StatusEvent:
    source = "worker" if state in (State.SUCCEEDED, State.FAILED) else "scheduler"
    return StatusEvent(event_id or f"e{seq}{state}", "j", state, 1000 + seq, source, seq=seq, **kw)


def outcome_of(*events: StatusEvent, command_id: str | None = "c1") -> Outcome:
    outcome = Outcome("j", command_id=command_id)
    for event in events:
        outcome.feed(event)
    return outcome


SCHEDULED = ev(State.SCHEDULED, 5, "c1:SCHEDULED")


def test_the_result_is_the_succeeded_runs_even_when_its_ack_is_read_first() -> None:
    done = outcome_of(
        ev(State.SUCCEEDED, 6, run_id=RUN, result_json='{"a": [1, "ü"]}'),  # acks read first
        SCHEDULED,
        ev(State.DISPATCHED, 6, run_id=RUN),
        ev(State.COMPLETED, 7),
    )
    assert done.done and done.result() == {"a": [1, "ü"]}


def test_an_older_job_with_the_same_id_does_not_answer() -> None:
    older = outcome_of(ev(State.COMPLETED, 3), ev(State.DEAD, 4), SCHEDULED)
    assert not older.done
    older.feed(ev(State.SUCCEEDED, 6, run_id=RUN, result_json="42"))
    older.feed(ev(State.COMPLETED, 7))
    assert older.result() == 42


@pytest.mark.parametrize(
    ("events", "state", "text"),
    [
        (
            [
                ev(State.FAILED, 6, run_id=RUN, error="ValueError: x"),
                ev(State.DEAD, 7, run_id=RUN, error="ValueError: x"),
                ev(State.DEAD, 8, reason="its last run ended DEAD"),
            ],
            "DEAD",
            "ValueError: x",
        ),
        ([ev(State.CANCELLED, 6, reason="not needed")], "CANCELLED", "not needed"),
        ([ev(State.MISSED, 6, run_id=RUN), ev(State.COMPLETED, 7)], "MISSED", "ended MISSED"),
    ],
)
def test_a_job_without_a_result_raises_saying_how_it_ended(
    events: list[StatusEvent], state: str, text: str
) -> None:
    outcome = outcome_of(SCHEDULED, *events)
    assert outcome.done
    with pytest.raises(JobFailedError) as info:
        outcome.result()
    assert info.value.state == state and text in str(info.value)


def test_a_rejected_schedule_is_an_outcome_too() -> None:
    rejected = outcome_of(ev(State.REJECTED, 0, "c1:REJECTED", reason="invalid command: task"))
    with pytest.raises(JobFailedError) as info:
        rejected.result()
    assert info.value.state == "REJECTED" and "invalid command" in str(info.value)


def test_a_job_scheduled_again_or_paused_and_resumed_is_not_over() -> None:
    outcome = outcome_of(ev(State.COMPLETED, 3), command_id=None)
    assert outcome.done
    outcome.feed(ev(State.SCHEDULED, 4))
    assert not outcome.done
    outcome.feed(ev(State.SUCCEEDED, 5, run_id=RUN))  # a task that returned None
    outcome.feed(ev(State.COMPLETED, 6))
    assert outcome.result() is None
