"""When a scheduler partition counts as stuck: work that has waited, not work that exists."""

from __future__ import annotations

from jobwheel.schemas.progress import Progress, stuck_reason

NOW = 10_000_000
AFTER = 30_000


def test_input_on_a_partition_never_committed_is_timed_from_its_oldest_record() -> None:
    assert stuck_reason(None, NOW, 5, stuck_after_ms=AFTER, waiting_since_ms=NOW - 1) is None
    why = stuck_reason(None, NOW, 5, stuck_after_ms=AFTER, waiting_since_ms=NOW - AFTER)
    assert why == "5 unread input records, the oldest waiting 30 s, and no commit recorded yet"
    # Nothing to time it from: no guess (before: stuck at once).
    assert stuck_reason(None, NOW, 5, stuck_after_ms=AFTER) is None
    assert stuck_reason(None, NOW, 0, stuck_after_ms=AFTER) is None


def test_a_record_arriving_on_a_long_idle_partition_is_no_stall_until_it_has_waited() -> None:
    idle = Progress(NOW - 3_600_000, None, "a")
    assert stuck_reason(idle, NOW, 1, stuck_after_ms=AFTER, waiting_since_ms=NOW - 5) is None
    why = stuck_reason(idle, NOW, 1, stuck_after_ms=AFTER, waiting_since_ms=NOW - 40_000)
    assert why == "1 unread input records, the oldest waiting 40 s, and no commit for 3600 s"
    # Unknown age: waiting since the last commit, as before.
    assert stuck_reason(idle, NOW, 1, stuck_after_ms=AFTER) == (
        "1 unread input records and no commit for 3600 s"
    )


def test_a_recent_commit_is_never_stuck_and_an_overdue_timer_still_is() -> None:
    fresh = Progress(NOW - 10, None, "a")
    assert stuck_reason(fresh, NOW, 9, stuck_after_ms=AFTER, waiting_since_ms=0) is None
    late = Progress(NOW - 60_000, NOW - 45_000, "a")
    assert stuck_reason(late, NOW, 0, stuck_after_ms=AFTER) == (
        "a timer due 45 s ago and no commit for 60 s"
    )
