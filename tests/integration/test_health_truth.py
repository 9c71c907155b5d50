"""`jobwheel health` on the real broker: what it says of scheduler partitions nobody has
committed yet, and that it never dies of a signal while the broker starts, stops or restarts."""

from __future__ import annotations

from confluent_kafka import Producer

from jobwheel.consumers.status import cluster
from jobwheel.consumers.status.cli import _check_scheduler_partitions
from jobwheel.settings import Settings
from tests.integration.scheduler_support import now_ms
from tests.support import wait_until


def test_a_partition_never_committed_is_stuck_only_once_its_oldest_input_has_waited(
    settings: Settings,
) -> None:
    """No scheduler has ever committed (none runs). A request that arrived just now is work a
    starting scheduler will claim within seconds, not a stall; one that has waited ten minutes
    is. Before, both partitions were called stuck the moment they had input."""
    producer = Producer(settings.librdkafka("producer"))
    producer.produce(settings.topics.requests, b"fresh", b"k", partition=1)
    producer.produce(
        settings.topics.requests, b"old", b"k", partition=2, timestamp=now_ms() - 600_000
    )
    assert producer.flush(30) == 0

    # Topics made a moment ago can answer NOT_LEADER for a while: asked again until they do.
    rows, _ = wait_until(
        lambda: (found := cluster.scheduler_progress(settings, 10.0))[1] is None and found,
        30,
        message="the scheduler group's offsets could not be read",
    )
    by_partition = {r.partition: r for r in rows}
    assert (by_partition[1].unread, by_partition[2].unread) == (1, 1)
    assert by_partition[1].stuck is None, by_partition[1].stuck
    assert by_partition[2].stuck is not None and "the oldest waiting 6" in by_partition[2].stuck
    assert [r.partition for r in rows if r.stuck] == [2]

    ok, detail = _check_scheduler_partitions(settings, 10.0)
    assert not ok and "partition 2: " in detail and "partition 1: " not in detail, detail
