"""A runs record no worker can decode, with a scheduler and a worker running on the real broker.

Before, the worker logged it and committed past it: the run it stood for got no verdict, and on
a quiet partition its job waited for ever. Now the worker copies it to the dead-letter topic
and, as the record's ``jobwheel.run`` header (written by the scheduler on every run) names the
attempt, answers that attempt FAILED with the reason: the scheduler retries the run or ends it
DEAD at once. A record that names no run (garbage) is dead-lettered and counted only.

The undecodable records are made the way they would reach a worker: the test reads the record
the scheduler dispatched for a job whose run is executing (it blocks on a gate), and produces
it again, in a transaction as the scheduler does, with the scheduler's headers and its value
stamped with a schema fingerprint no reader knows (a newer schema version), then bytes that are
no record at all with no headers.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from jobwheel.deploy.broker import free_port
from jobwheel.kafka.producer import producer_config
from jobwheel.producers.client import JobClient
from jobwheel.schemas.codec import Codec
from jobwheel.schemas.models import State
from jobwheel.schemas.partitioning import partition_for
from jobwheel.schemas.topics import (
    ERROR_HEADER,
    KIND_HEADER,
    RUN_HEADER,
    SIZE_HEADER,
    SOURCE_OFFSET_HEADER,
    SOURCE_PARTITION_HEADER,
    SOURCE_TOPIC_HEADER,
    UNDECODABLE_RUN_KIND,
    read_run_header,
    run_header,
)
from tests.integration.scheduler_support import TopicTail, make_run, start_scheduler
from tests.support import (
    Tail,
    file_lines,
    log_tail,
    metric,
    start_worker,
    wait_for_group,
    wait_until,
)

#: Single-object encoding's marker; the 8 bytes after it are the writer schema's fingerprint.
MARKER = b"\xc3\x01"
UNKNOWN_FINGERPRINT = bytes.fromhex("0123456789abcdef")
GARBAGE = b"\x00not a run, and no headers either"


def produce_as_scheduler(
    settings: Any, records: list[tuple[bytes, bytes, list[Any] | None]]
) -> None:
    """One committed transaction on the runs topic, keyed and partitioned as the scheduler's
    (murmur2 on the job id)."""
    producer = Producer(
        producer_config(settings, **{"transactional.id": f"test-runs-{uuid.uuid4().hex}"})
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for key, value, headers in records:
        producer.produce(settings.topics.runs, key=key, value=value, headers=headers)
    producer.commit_transaction(30)


def committed(settings: Any, partition: int) -> int:
    consumer = Consumer(settings.librdkafka(**{"group.id": settings.worker_group}))
    try:
        (tp,) = consumer.committed([TopicPartition(settings.topics.runs, partition)], timeout=10)
        return tp.offset
    finally:
        consumer.close()


def end_offset(settings: Any, partition: int) -> int:
    consumer = Consumer(settings.librdkafka(**{"group.id": f"test-{uuid.uuid4().hex[:8]}"}))
    try:
        tp = TopicPartition(settings.topics.runs, partition)
        return consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]
    finally:
        consumer.close()


@pytest.mark.timeout(660)  # the sum of its waits
def test_an_undecodable_run_is_dead_lettered_and_its_run_failed(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tmp_path: Path, tail: TopicTail
) -> None:
    start_scheduler(procs, jobwheel_env, tmp_path / "s1")
    port = free_port()
    worker_log = tmp_path / "worker.log"
    worker = start_worker(
        procs, jobwheel_env, worker_log, "--concurrency", "4", metrics_port=str(port)
    )
    base = f"http://127.0.0.1:{port}"
    wait_for_group(settings, settings.worker_group, settings.topics.runs)

    gate, started = tmp_path / "gate", tmp_path / "started"
    blocked = {"gate": str(gate), "started": str(started)}
    with JobClient(settings) as client:
        # One attempt only: its FAILED ends it DEAD. Two: its FAILED retries it.
        dies = client.schedule("dies", task="test.gate", args=blocked, now=True, max_attempts=1)
        retried = client.schedule(
            "retried", task="test.gate", args=blocked, now=True, max_attempts=2
        )
    # Both runs execute (and block): the scheduler has them in flight, DISPATCHED.
    wait_until(lambda: len(file_lines(started)) >= 2, 60, 0.1, "the blocked runs did not start")

    # The records the scheduler dispatched, with its headers, as a worker read them.
    runs = Tail(settings, [settings.topics.runs])
    dispatched: dict[bytes, Any] = {}

    def both() -> bool:
        for msg in runs.poll():
            dispatched[msg.key()] = msg
        return {dies.encode(), retried.encode()} <= dispatched.keys()

    wait_until(both, 30, 0.0, "the dispatched runs records were not read")
    runs.close()
    for job in (dies, retried):
        msg = dispatched[job.encode()]
        ref = read_run_header(msg.key(), msg.headers())
        assert ref is not None and (ref.job_id, ref.attempt) == (job, 1), msg.headers()

    def newer(job: str) -> tuple[bytes, bytes, list[Any]]:
        """The dispatched record again, its value written with a schema this worker lacks."""
        msg = dispatched[job.encode()]
        value = msg.value()
        assert value.startswith(MARKER)
        return msg.key(), MARKER + UNKNOWN_FINGERPRINT + value[10:], list(msg.headers())

    partition = partition_for(dies, settings.partitions)
    records = [newer(dies), newer(retried), (dies.encode(), GARBAGE, None)]
    produce_as_scheduler(settings, records)

    # The worker answered each named attempt FAILED with the reason, from the header alone.
    def worker_failed(job: str) -> list[Any]:
        return [e for e in tail.events(job, State.FAILED) if e.source == "worker"]

    for job in (dies, retried):
        (failed,) = tail.wait(lambda job=job: worker_failed(job), 60, f"{job}: no FAILED")
        assert failed.error.startswith("UndecodableRun: ") and "unknown schema" in failed.error
        ref = read_run_header(job.encode(), dispatched[job.encode()].headers())
        assert ref is not None and (failed.run_id, failed.attempt) == (ref.run_id, 1)
        assert (failed.seq, failed.task) == (ref.seq, "test.gate")
        assert failed.retry_delay_ms is not None  # the task's backoff: the scheduler decides
    # ... so the scheduler ends the one-attempt run DEAD at once, with the reason,
    dead = tail.wait(lambda: tail.events(dies, State.DEAD), 60, "the run was not DEAD")
    assert "UndecodableRun" in f"{dead[0].reason} {dead[0].error}", dead
    # and retries the other: its next attempt is dispatched (and decodes: it runs).
    retrying = tail.wait(lambda: tail.events(retried, State.RETRYING), 60, "not RETRYING")
    assert "UndecodableRun" in (retrying[0].error or ""), retrying
    tail.wait(lambda: len(file_lines(started)) >= 3, 60, "attempt 2 did not start")
    tail.wait(lambda: [r.attempt for r in tail.runs_of(retried)] == [1, 2], 30, "no attempt 2 read")

    # The dead-letter topic holds the original bytes and headers, with the reason and the place.
    def copies() -> dict[bytes, Any]:
        return {
            m.value(): m
            for m in tail.dead_letters()
            if dict(m.headers() or []).get(KIND_HEADER) == UNDECODABLE_RUN_KIND
        }

    tail.wait(lambda: len(copies()) == 3, 60, "undecodable runs not dead-lettered")
    for key, value, headers in records:
        copy = copies()[value]
        h = dict(copy.headers())
        assert copy.key() == key
        assert h[SOURCE_TOPIC_HEADER] == settings.topics.runs.encode()
        assert int(h[SOURCE_PARTITION_HEADER]) == partition_for(key.decode(), settings.partitions)
        assert int(h[SOURCE_OFFSET_HEADER]) >= 0
        assert b"undecodable run record" in h[ERROR_HEADER]
        assert (RUN_HEADER in h) == (headers is not None)
    assert metric(base, "jobwheel_worker_undecodable_runs_total", queue="default") == 3

    # The partition goes on: a decodable run after them runs, and the worker commits past all.
    gate.touch()
    after = next(
        f"after-{i}"
        for i in range(10_000)
        if partition_for(f"after-{i}", settings.partitions) == partition
    )
    with JobClient(settings) as client:
        client.schedule(after, task="demo.echo", args={"n": 1}, now=True)
    tail.wait(lambda: tail.events(after, State.SUCCEEDED), 60, "the run after them did not run")
    end = end_offset(settings, partition)
    wait_until(
        lambda: committed(settings, partition) >= end - 1,  # the last offset is a commit marker
        30,
        0.2,
        f"partition {partition} not committed to {end}:\n{log_tail(worker_log)}",
    )
    assert worker.poll() is None, log_tail(worker_log)


def test_a_copy_too_large_for_the_dead_letter_topic_goes_without_its_bytes(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tmp_path: Path
) -> None:
    """The dead-letter copy carries more headers than the runs record did, so a record that
    fitted the runs topic may not fit the dead-letter topic (here its ``max.message.bytes`` is
    made smaller). The broker's refusal is for good: the copy goes again without its value,
    saying how large it was, rather than being retried for ever with the partition's commit
    held behind it. The run is answered FAILED and the run after it runs."""
    limit = 2_000
    admin = AdminClient(settings.librdkafka())
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        settings.topics.dead_letter,
        incremental_configs=[
            ConfigEntry(
                "max.message.bytes", str(limit), incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    job = "too-large-copy"
    partition = partition_for(job, settings.partitions)

    def refused() -> bool:
        """Does the dead-letter partition refuse a record over the limit now? (The change
        takes effect on the broker shortly after the admin call.)"""
        probe = Producer(settings.librdkafka(**{"message.timeout.ms": 10_000}))
        errors: list[Any] = []
        probe.produce(
            settings.topics.dead_letter,
            value=b"p" * (limit * 2),
            partition=partition,
            on_delivery=lambda err, _msg: errors.append(err),
        )
        assert probe.flush(30) == 0, "the probe was neither accepted nor refused"
        return errors[0] is not None and errors[0].name() == "MSG_SIZE_TOO_LARGE"

    wait_until(refused, 30, 0.5, "the dead-letter topic's smaller limit never took effect")

    run = make_run(settings, "demo.echo", job_id=job, run_id=f"{job}@1")
    after = make_run(settings, "demo.echo", {"after": 1}, job_id=job, run_id=f"{job}@2")
    # Garbage over the dead-letter topic's limit, random: the worker compresses its batches.
    big = b"\x00" + os.urandom(limit * 2)
    produce_as_scheduler(
        settings,
        [
            (job.encode(), big, [(RUN_HEADER, run_header(run))]),
            (job.encode(), Codec().encode(after), [(RUN_HEADER, run_header(after))]),
        ],
    )
    tail = TopicTail(settings, [settings.topics.acks])
    dead = Tail(settings, [settings.topics.dead_letter])
    try:
        worker_log = tmp_path / "worker.log"
        start_worker(procs, jobwheel_env, worker_log)
        failed = tail.wait_for(run.run_id, State.FAILED)[0]
        assert (failed.error or "").startswith("UndecodableRun: ")
        tail.wait_for(after.run_id, State.SUCCEEDED)
        copies: list[Any] = []

        def copied() -> list[Any]:
            copies.extend(
                m
                for m in dead.poll()
                if dict(m.headers() or []).get(KIND_HEADER) == UNDECODABLE_RUN_KIND
            )
            return copies

        (copy,) = wait_until(copied, 30, 0.0, "no dead-letter record of the run")
        h = dict(copy.headers())
        assert (copy.key(), copy.value() or b"") == (job.encode(), b"")
        assert h[SIZE_HEADER] == str(len(big)).encode()
        assert h[RUN_HEADER] == run_header(run)
        end = end_offset(settings, partition)
        wait_until(
            lambda: committed(settings, partition) >= end - 1,
            30,
            0.2,
            f"partition {partition} not committed past the runs",
        )
    finally:
        tail.close()
        dead.close()
