"""The commit benchmark on a real broker: each transaction it commits is timed phase by phase
by the scheduler's own producer (the figures BENCHMARKS.md compares the e2e's with)."""

from __future__ import annotations

import pytest

from load.commit_bench import measure


@pytest.mark.parametrize("topics, partitions", [(1, 12), (3, 2)])
def test_each_committed_transaction_is_timed_in_each_phase(
    kafka_bootstrap: str, topics: int, partitions: int
) -> None:
    spent = measure(kafka_bootstrap, 3, 10, topics, partitions)
    assert set(spent) == {"produce", "offsets", "end"}
    for phase, seconds in spent.items():
        assert len(seconds) == 3, phase
        assert all(0 < s < 30 for s in seconds), (phase, seconds)
