"""The backoff of jobwheel's own retry loops (jobwheel/retry.py)."""

from __future__ import annotations

from jobwheel.retry import Backoff


def test_the_delay_doubles_from_the_start_up_to_the_cap() -> None:
    backoff = Backoff(start_s=0.1, max_s=1.0)
    assert backoff.delay_s == 0.0
    assert [backoff.failed() for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def test_a_success_starts_over() -> None:
    backoff = Backoff(start_s=1.0, max_s=30.0)
    backoff.failed()
    backoff.failed()
    backoff.reset()
    assert backoff.delay_s == 0.0
    assert backoff.failed() == 1.0
