"""Disk is bounded: what each retention promises to delete is deleted (docs/operations.md,
"Retention"), on a real broker and the embedded engine, with retentions short enough to watch.

- The status store's TTL (``JOBWHEEL_STATUS_TTL_DAYS``): events older than it leave
  ``status_events``, and the rows of ``job_state`` and ``run_state`` last updated before it go
  with them; what is newer stays. ClickHouse deletes expired rows when it merges parts; the
  test holds merges back until it has seen the old rows stored, then forces the merge
  (``OPTIMIZE ... FINAL``) instead of waiting for the engine's own.
- The scheduler's job retention (``JOBWHEEL_JOB_RETENTION_MS``): a cancelled job is forgotten
  (a later command for it is refused as unknown), its changelog gets a tombstone, and the
  broker's compaction then removes every earlier record of it, while a live job's latest record
  stays.
- Topic retention: the records jobwheel writes to its delete-policy topics are deleted once
  their ``retention.ms`` has passed (their timestamps are the writers' clocks, or the broker's:
  nothing jobwheel stamps keeps a segment alive).

The broker side runs on a broker of the module's own: the broker looks for segments past
their retention every ``log.retention.check.interval.ms`` (five minutes by default, and not a
setting that can be changed on a running broker), so the session's broker would make this
test wait minutes, and lowering it there would make every test's broker scan its logs every
second. Its log cleaner also wakes every second instead of every 15 s.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from jobwheel.consumers.status.sink import StatusSink
from jobwheel.consumers.status.store import TTL_TABLES, StatusStore
from jobwheel.deploy.broker import LocalBroker, free_port, merge_properties
from jobwheel.producers.client import JobClient
from jobwheel.schemas.codec import default_codec
from jobwheel.schemas.models import State, StatusEvent
from jobwheel.schemas.partitioning import key_for
from jobwheel.settings import Settings
from tests.conftest import settings_env, settings_on
from tests.integration.scheduler_support import TopicTail, start_scheduler
from tests.status_support import event, lifecycle, now_ms
from tests.support import HarnessError, Tail, kafka_call, wait_until

DAY_MS = 24 * 3600 * 1000

#: What the module's broker runs with on top of jobwheel's own broker config (see the module
#: doc); ``log.initial.task.delay.ms`` (30 s by default) delays the first retention check.
RETENTION_BROKER = {
    "log.retention.check.interval.ms": "1000",
    "log.initial.task.delay.ms": "1000",
    "log.cleaner.backoff.ms": "1000",
}


class RetentionBroker(LocalBroker):
    """jobwheel's local broker with :data:`RETENTION_BROKER` added to its config."""

    def prepare(self) -> str:
        java = super().prepare()
        text = self.properties_path.read_text()
        self.properties_path.write_text(merge_properties(text, RETENTION_BROKER))
        return java


@pytest.fixture(scope="module")
def retention_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    broker = RetentionBroker(
        tmp_path_factory.mktemp("retention-kafka"),
        port=free_port(),
        controller_port=free_port(),
        heap="384m",
    )
    broker.start(die_with_parent=True)
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def alter_topic(settings: Settings, topic: str, config: dict[str, str]) -> None:
    """Set ``config`` on ``topic`` (incrementally: its other settings stay)."""
    admin = AdminClient(settings.librdkafka())
    entries = [
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in config.items()
    ]
    resource = ConfigResource("TOPIC", topic, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource]).values():
        kafka_call(lambda f=future: f.result(timeout=30), f"altering the config of {topic!r}")


def read_records(settings: Settings, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """Every record (key, value) on ``topic`` now, from its first retained offset to its end."""
    tail = Tail(settings, [topic])
    try:
        records: list[tuple[bytes | None, bytes | None]] = []
        tail.read_to_end(lambda msg: records.append((msg.key(), msg.value())))
        return records
    finally:
        tail.close()


def watermarks(settings: Settings, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (first retained offset, end offset) of ``topic``, as the broker says now."""
    consumer = Consumer(settings.librdkafka(**{"group.id": f"test-offsets-{uuid.uuid4().hex}"}))
    try:
        return {
            p: kafka_call(
                lambda p=p: consumer.get_watermark_offsets(
                    TopicPartition(topic, p), timeout=10, cached=False
                ),
                f"asking the offsets of {topic!r} [{p}]",
            )
            for p in range(settings.partitions)
        }
    finally:
        consumer.close()


# --- the status store's TTL ------------------------------------------------------------------


def produce_events(settings: Settings, events: list[StatusEvent]) -> None:
    codec = default_codec()
    producer = Producer(settings.librdkafka(**{"partitioner": "murmur2_random"}))
    t = settings.topics
    for item in events:
        topic = t.acks if item.source == "worker" else t.status
        producer.produce(topic, codec.encode(item), key_for(item.job_id))
    if producer.flush(30) != 0:
        raise HarnessError("the test's status events were not all delivered")


def rows_of(store: StatusStore, table: str) -> dict[str, int]:
    """job id -> rows of ``table`` (after its merges: FINAL)."""
    _, _, rows = store.query(f"SELECT job_id, count() FROM {table} FINAL GROUP BY job_id")
    return {str(job): int(n) for job, n in rows}


def test_status_rows_older_than_the_ttl_are_deleted(
    settings: Settings, engine_dsn: str, store: StatusStore
) -> None:
    # The operator lowers the TTL from 30 days to 1: the next start applies it to every table.
    short = StatusStore.open(engine_dsn, database=store.database, ttl_days=1)
    tables = list(TTL_TABLES)
    for table in tables:
        short.client.command(f"SYSTEM STOP MERGES {store.database}.{table}")
    now = now_ms()
    old = now - 2 * DAY_MS
    # A job finished two days ago (every row of it past the TTL), one finished now, and a
    # recurring one whose first run was two days ago and whose latest run is now.
    events = [
        *lifecycle("old-job", old),
        *lifecycle("new-job", now),
        *[e for e in lifecycle("recurring", old) if e.state != State.COMPLETED],
        event(
            "recurring",
            State.DISPATCHED,
            seq=4,
            t=now,
            run_id=f"recurring@{now}",
            attempt=1,
            task="demo.echo",
            scheduled_time_ms=now,
        ),
    ]
    sink = StatusSink(settings, short, batch_size=500, batch_ms=100)
    thread = threading.Thread(target=sink.run, daemon=True)
    thread.start()
    try:
        produce_events(settings, events)

        # Positive first: every event is stored, the old ones too, in all three tables.
        def stored() -> bool:
            events_rows = rows_of(short, "status_events")
            return (
                events_rows.get("old-job") == 6
                and events_rows.get("new-job") == 6
                and events_rows.get("recurring") == 6
            )

        wait_until(stored, 60, 0.2, "the sink did not store the test's events")
        assert rows_of(short, "job_state").keys() >= {"old-job", "new-job", "recurring"}
        assert rows_of(short, "run_state").keys() >= {"old-job", "new-job", "recurring"}

        for table in tables:
            short.client.command(f"SYSTEM START MERGES {store.database}.{table}")

        def expired_gone() -> bool:
            for table in tables:
                short.client.command(f"OPTIMIZE TABLE {store.database}.{table} FINAL")
            return all("old-job" not in rows_of(short, t) for t in tables)

        wait_until(expired_gone, 60, 0.5, "rows past the TTL were not deleted")
        assert rows_of(short, "status_events") == {"new-job": 6, "recurring": 1}
        assert rows_of(short, "job_state").keys() == {"new-job", "recurring"}
        _, _, runs = short.query("SELECT run_id FROM run_state FINAL WHERE job_id = 'recurring'")
        assert runs == [(f"recurring@{now}",)]  # the run of two days ago is gone
    finally:
        sink.stop()
        thread.join(30)
        short.close()


# --- job retention, the changelog's compaction, topic retention --------------------------------


def values_of(records: list[tuple[bytes | None, bytes | None]], job_id: str) -> list[bytes | None]:
    return [value for key, value in records if key == job_id.encode()]


# No worker runs here: the jobs are due in an hour, and cancelled or paused long before.
@pytest.mark.filterwarnings("ignore::jobwheel.errors.UnknownTaskWarning")
def test_a_finished_job_leaves_the_state_the_changelog_and_the_topics(
    retention_bootstrap: str, tmp_path: Path, procs: Any
) -> None:
    settings = settings_on(retention_bootstrap, tmp_path, partitions=1)
    t = settings.topics
    changelog = t.changelog(settings.scheduler_app_id)
    # Compaction as soon as there is anything to compact: every record batch in a segment of
    # its own (only closed segments are compacted), any share of old records worth a pass.
    alter_topic(
        settings,
        changelog,
        {"segment.ms": "1", "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "0"},
    )
    env = {**settings_env(settings), "JOBWHEEL_JOB_RETENTION_MS": "1000"}
    start_scheduler(procs, env, tmp_path / "scheduler")
    tail = TopicTail(settings)
    try:
        with JobClient(settings) as client:
            client.schedule("gone", task="demo.echo", in_=timedelta(hours=1))
            client.schedule("kept", task="demo.echo", in_=timedelta(hours=1))
            client.cancel("gone")
        tail.wait(lambda: tail.events("gone", State.CANCELLED), 30, "the job was never CANCELLED")

        # A second past its end the scheduler deletes the job: a tombstone on the changelog.
        def tombstoned() -> bool:
            return values_of(read_records(settings, changelog), "gone")[-1:] == [None]

        wait_until(tombstoned, 60, 0.5, "the finished job's record was never deleted")
        with JobClient(settings) as client:
            client.trigger("gone")  # forgotten: refused as unknown
            client.pause("kept")  # a record after the tombstone: its segment is closed
        refused = tail.wait(
            lambda: tail.events("gone", State.REJECTED), 30, "the trigger was not answered"
        )
        assert "unknown job" in (refused[0].reason or "")
        tail.wait(lambda: tail.events("kept", State.PAUSED), 30, "the job was not PAUSED")

        # Compaction leaves nothing of the deleted job but its tombstone (kept for the topic's
        # delete.retention.ms, a day, declared by its spec); the live job keeps its latest
        # record (the positive in the same read as the negative).
        def compacted() -> list[tuple[bytes | None, bytes | None]] | None:
            records = read_records(settings, changelog)
            return records if values_of(records, "gone") == [None] else None

        records = wait_until(compacted, 60, 0.5, "the deleted job's records were not compacted")
        kept = values_of(records, "kept")
        assert kept and kept[-1] is not None

        # Topic retention: everything the test's commands and the scheduler's events put on
        # the requests and status topics goes once it is older than retention.ms.
        for topic in (t.requests, t.status):
            assert watermarks(settings, topic)[0][1] > 0  # they were there
            alter_topic(settings, topic, {"retention.ms": "500", "segment.ms": "100"})

        def deleted() -> bool:
            return all(
                low == high
                for topic in (t.requests, t.status)
                for low, high in watermarks(settings, topic).values()
            )

        wait_until(deleted, 60, 0.5, "records past retention.ms were not deleted")
    finally:
        tail.close()
