"""The scheduler's state on the real broker when a change cannot be kept, a timer cannot be
handled, or a partition's worker side stays silent: the local state and its changelog always
agree (what a new owner restores is what this owner had), a poison timer pauses its job and
the partition goes on, and a visibility deadline no ack will ever pass still expires."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from jobwheel.producers.client import JobClient
from jobwheel.schemas.models import Cron, ScheduleJob, State
from jobwheel.schemas.partitioning import key_for, partition_for
from jobwheel.settings import Settings
from jobwheel.streams.jobstate import JobRecord, encode_job
from jobwheel.streams.state.directory import StateDirectory
from jobwheel.streams.state.partition import RocksDBBackend
from jobwheel.streams.state.rocksdb import RocksDBLimits
from tests.integration.scheduler_support import (
    log_events,
    now_ms,
    start_scheduler,
    wait_owns_all,
)
from tests.support import HarnessError, log_tail, stop, wait_until


def neighbour_of(job_id: str, settings: Settings, name: str) -> str:
    p = partition_for(job_id, settings.partitions)
    return next(
        j for i in range(10_000) if partition_for(j := f"{name}-{i}", settings.partitions) == p
    )


def changelog_view(settings: Settings, partition: int) -> dict[bytes, bytes]:
    """A changelog partition as a restore sees it (read_committed, to its end): the latest
    record of each key, tombstoned keys left out."""
    consumer = Consumer(
        settings.librdkafka(
            **{
                "group.id": f"view-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
            }
        )
    )
    topic = settings.topics.changelog(settings.scheduler_app_id)
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    view: dict[bytes, bytes | None] = {}
    try:

        def read() -> bool:
            for msg in consumer.consume(1000, 0.5):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        return True
                    raise HarnessError(f"reading the changelog failed: {msg.error()}")
                view[msg.key()] = msg.value()
            return False

        wait_until(read, 30, 0, "the changelog's end was never reached")
    finally:
        consumer.close()
    return {k: v for k, v in view.items() if v is not None}


def local_view(data_dir: Path, settings: Settings, partition: int) -> dict[bytes, bytes]:
    """What the scheduler's local state (RocksDB) holds for the partition: it is stopped."""
    root = StateDirectory(data_dir / "scheduler" / settings.scheduler_app_id).partition(partition)
    backend = RocksDBBackend(root, RocksDBLimits().resources())
    try:
        return dict(backend.job_items())
    finally:
        backend.close()


@pytest.mark.timeout(240)
def test_a_changelog_record_the_producer_refuses_is_never_replaced_and_state_agrees(
    settings, jobwheel_env, procs, tmp_path, tail
):
    """The scheduler's producer takes records up to 30,000 bytes (``message.max.bytes``) and
    a job's record is 40 KB (its args). Before: the changelog record was replaced by a
    dead-letter reference, the transaction committed and the local state kept the job: this
    owner and the next one (which restores from the changelog) disagreed. Now: the
    transaction aborts, the record limit comes down, the command is REJECTED naming the size,
    the partition goes on, and the local state equals what a restore reads."""
    data_dir = tmp_path / "s"
    scheduler = start_scheduler(
        procs,
        jobwheel_env,
        data_dir,
        extra_env={
            "JOBWHEEL_SCHEDULER_KAFKA_PRODUCER_CONFIG": json.dumps({"message.max.bytes": 30_000})
        },
    )
    wait_owns_all(scheduler, settings.partitions)
    big = "big-record"
    small = neighbour_of(big, settings, "small")
    p = partition_for(big, settings.partitions)
    with JobClient(settings) as client:
        client.schedule(
            big, task="demo.echo", args={"blob": "x" * 40_000}, every=timedelta(hours=1)
        )
        client.schedule(small, task="demo.echo", now=True)
    # The commands of one partition are handled in order: the big one was, once the
    # small one's run is out.
    tail.wait(lambda: tail.runs_of(small), 60, "the partition stopped working")
    assert scheduler.poll() is None
    assert stop(scheduler) == 0
    local = local_view(data_dir, settings, p)
    assert key_for(small) in local
    assert local == changelog_view(settings, p)  # a restore from the changelog sees the same
    assert key_for(big) not in local

    [rejected] = tail.wait(
        lambda: tail.events(big, State.REJECTED), 60, "the oversized job got no verdict"
    )
    assert "its changelog can carry" in rejected.reason, rejected.reason
    assert not tail.events(big, State.SCHEDULED)
    assert log_events(
        scheduler.log_path,
        "changelog record too large to produce; the transaction is aborted and the record "
        "limit lowered",
    )


@pytest.mark.timeout(240)
def test_an_allow_job_with_no_worker_stops_at_the_bound_and_state_agrees(
    settings, jobwheel_env, procs, tmp_path, tail
):
    """An ``every 1s`` ALLOW job and no worker: its runs stay in flight and each was an entry
    of its record (6,000 made a 1.08 MB record the changelog refused). With the bound at 3,
    the fourth fire on is SKIPPED saying why; the record on the changelog has 3 runs."""
    data_dir = tmp_path / "s"
    scheduler = start_scheduler(
        procs, jobwheel_env, data_dir, extra_env={"JOBWHEEL_SCHEDULER_MAX_ACTIVE_RUNS": "3"}
    )
    job = "piling-up"
    with JobClient(settings) as client:
        client.schedule(
            job, task="demo.echo", every=timedelta(seconds=1), visibility_timeout=timedelta(hours=1)
        )
    skipped = tail.wait(
        lambda: len(tail.events(job, State.SKIPPED)) >= 2 and tail.events(job, State.SKIPPED),
        60,
        "no fire was skipped at the bound",
    )
    assert all("3 runs of the job are in flight" in e.reason for e in skipped)
    assert stop(scheduler) == 0
    assert len(tail.runs_of(job)) == 3
    p = partition_for(job, settings.partitions)
    local = local_view(data_dir, settings, p)
    assert local == changelog_view(settings, p)
    from jobwheel.streams.jobstate import decode_job

    assert len(decode_job(local[key_for(job)]).active) == 3


@pytest.mark.timeout(240)
def test_a_poison_timer_pauses_its_job_and_the_scheduler_goes_on(
    settings, jobwheel_env, procs, tmp_path, tail
):
    """A job record accepted by a scheduler with newer tzdata (a zone this host lacks),
    restored from the changelog: its fire raised ValidationError in punctuation, the process
    died, and so did every scheduler taking the partition over. Now the job is PAUSED naming
    the error, and the other jobs of its partition fire."""
    data_dir = tmp_path / "s"
    scheduler = start_scheduler(procs, jobwheel_env, data_dir)
    wait_owns_all(scheduler, settings.partitions)
    assert stop(scheduler) == 0

    mars = "mars-cron"
    p = partition_for(mars, settings.partitions)
    spec = ScheduleJob(task="demo.echo", trigger=Cron("* * * * *", "Mars/Olympus_Mons"))
    record = encode_job(JobRecord(mars, spec, now_ms(), next_fire_ms=now_ms()))
    producer = Producer(settings.librdkafka())
    topic = settings.topics.changelog(settings.scheduler_app_id)
    producer.produce(topic, key=key_for(mars), value=record, partition=p)
    assert producer.flush(30) == 0

    scheduler = start_scheduler(procs, jobwheel_env, data_dir, log_name="s-again")
    neighbour = neighbour_of(mars, settings, "earth")
    with JobClient(settings) as client:
        client.schedule(neighbour, task="demo.echo", now=True)

    def paused() -> list:
        assert scheduler.poll() is None, f"the scheduler died:\n{log_tail(scheduler.log_path)}"
        return tail.events(mars, State.PAUSED)

    [paused_event] = wait_until(paused, 60, 0.1, "the poisoned job got no verdict")
    assert "ValidationError" in paused_event.reason and "Mars/Olympus_Mons" in paused_event.reason
    tail.wait(lambda: tail.runs_of(neighbour), 60, "the partition stopped firing")
    assert scheduler.poll() is None, "the scheduler died on a timer"
    assert log_events(
        scheduler.log_path, "timer failed; its change is undone and the job gets a verdict"
    )


@pytest.mark.timeout(180)
def test_a_silent_acks_partition_cannot_hold_a_deadline_for_ever(
    settings, jobwheel_env, procs, tmp_path, tail
):
    """No worker, so nothing is ever written to the acks partition: the acks watermark never
    passes the run's deadline, and the job stayed SCHEDULED for ever. With the silence
    ceiling at 1 s, the deadline expires: the next attempt, then DEAD."""
    start_scheduler(
        procs,
        jobwheel_env,
        tmp_path / "s",
        extra_env={"JOBWHEEL_SCHEDULER_ACKS_SILENCE_MS": "1000"},
    )
    job = "unheard"
    with JobClient(settings) as client:
        client.schedule(
            job,
            task="demo.echo",
            now=True,
            visibility_timeout=timedelta(seconds=1),
            max_attempts=2,
        )
    tail.wait(
        lambda: any(r.attempt == 2 for r in tail.runs_of(job)), 60, "the deadline never expired"
    )
    tail.wait(lambda: tail.events(job, State.DEAD), 60, "the run never ended")
    assert [r.attempt for r in tail.runs_of(job)] == [1, 2]
