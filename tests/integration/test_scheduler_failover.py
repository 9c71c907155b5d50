"""Ownership changes on the real broker: restart from the changelog, SIGKILL failover, and
fencing of a stale owner (SIGSTOP) at the broker."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from jobwheel.errors import FencedError
from producers.client import JobClient, JobSpec
from schemas.models import State
from streams.dispatch import OutRecord, TransactionalDispatcher
from tests.integration.scheduler_support import TopicTail, now_ms, start_scheduler
from tests.support import consume, stop, wait_until


@pytest.fixture
def tail(settings):
    t = TopicTail(settings)
    yield t
    t.close()


def at_jobs(prefix: str, first_ms: int, count: int, spread_ms: int) -> list[JobSpec]:
    step = spread_ms / max(1, count - 1)
    return [
        JobSpec(
            job_id=f"{prefix}-{i}",
            task="demo.echo",
            at=datetime.fromtimestamp((first_ms + int(i * step)) / 1000, UTC),
        )
        for i in range(count)
    ]


def test_restart_restores_pending_jobs_from_the_changelog(
    settings, jobwheel_env, procs, tmp_path, tail
):
    first = start_scheduler(procs, jobwheel_env, tmp_path / "s1")
    due = now_ms() + 12_000
    with JobClient(settings) as client:
        job_ids = client.schedule_many(at_jobs("restart", due, 20, 3000))
    tail.wait(
        lambda: len(tail.events(state=State.SCHEDULED)) >= 20, 30, "jobs were not all SCHEDULED"
    )
    time.sleep(2)  # faust commits offsets and flushes the changelog every second
    assert stop(first, signal.SIGTERM, 30) is not None

    # Nothing to re-read: the requests topic is emptied, and the local state is deleted.
    admin = AdminClient(settings.librdkafka())
    topic = settings.topics.requests
    ends = [
        TopicPartition(topic, p, consume_end)
        for p, consume_end in _high_watermarks(settings, topic).items()
    ]
    for fut in admin.delete_records(ends).values():
        fut.result(30)
    assert consume(settings, topic, min_count=1, timeout_s=3) == []
    shutil.rmtree(tmp_path / "s1")

    start_scheduler(procs, jobwheel_env, tmp_path / "s2")
    tail.wait(lambda: all(tail.runs_of(j) for j in job_ids), 60, "not every pending job fired")
    for spec_job in job_ids:
        runs = tail.runs_of(spec_job)
        assert len({r.run_id for r in runs}) == 1
        assert runs[0].dispatched_at_ms >= runs[0].scheduled_time_ms


def _high_watermarks(settings, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer

    c = Consumer(settings.librdkafka(**{"group.id": f"hw-{uuid.uuid4().hex[:6]}"}))
    try:
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(settings.partitions)
        }
    finally:
        c.close()


def test_sigkill_one_of_two_schedulers_loses_no_job(
    settings, jobwheel_env, procs, tmp_path, tail, capsys
):
    a = start_scheduler(procs, jobwheel_env, tmp_path / "a")
    b = start_scheduler(procs, jobwheel_env, tmp_path / "b")
    # Both own partitions once the rebalance that b's join caused has settled.
    wait_until(
        lambda: (
            "partition claimed" in a.log_path.read_text().split("rebalance complete")[-1]
            or a.log_path.read_text().count("partition released") > 0
        ),
        40,
        0.2,
        "the first scheduler never took part in a rebalance",
    )
    start = now_ms() + 3000
    with JobClient(settings) as client:
        job_ids = client.schedule_many(at_jobs("kill", start, 500, 20_000))
    time.sleep(max(0, (start + 10_000 - now_ms()) / 1000))
    victim = a if a.log_path.read_text().count("partition claimed") else b
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(10)

    tail.wait(
        lambda: all(tail.runs_of(j) for j in job_ids),
        90,
        "some jobs never fired after the SIGKILL",
    )
    runs_by_job = defaultdict(list)
    for run, _ in tail.runs:
        runs_by_job[run.job_id].append(run)
    duplicates = 0
    for job in job_ids:
        runs = runs_by_job[job]
        assert len({r.run_id for r in runs}) == 1, f"{job} fired as different runs: {runs}"
        duplicates += len(runs) - 1
    late = sorted(
        r.dispatched_at_ms - r.scheduled_time_ms for rs in runs_by_job.values() for r in rs
    )
    with capsys.disabled():
        print(
            f"\n[failover] 500 jobs, 1 of 2 schedulers SIGKILLed at +10 s: every job fired; "
            f"duplicate dispatches (same run id): {duplicates}; "
            f"max lateness {late[-1]} ms (includes the {10}s session timeout)"
        )


def test_a_stale_owner_is_fenced_at_the_broker(settings):
    """Two dispatchers with the same transactional id: the newer claim fences the older."""

    async def scenario() -> None:
        old, new = TransactionalDispatcher(settings), TransactionalDispatcher(settings)
        topic = settings.topics.runs
        try:
            await old.claim(0)
            await old.send(0, [OutRecord(topic, b"k", b"from-old-owner-1")])
            await new.claim(0)
            with pytest.raises(FencedError):
                await old.send(0, [OutRecord(topic, b"k", b"from-old-owner-2")])
            await new.send(0, [OutRecord(topic, b"k", b"from-new-owner")])
        finally:
            await old.close()
            await new.close()

    asyncio.run(scenario())
    seen = [m.value() for m in consume(settings, settings.topics.runs, min_count=3, timeout_s=8)]
    assert b"from-old-owner-1" in seen and b"from-new-owner" in seen
    assert b"from-old-owner-2" not in seen


def test_sigstopped_owner_cannot_dispatch_after_takeover(
    settings, jobwheel_env, procs, tmp_path, tail, capsys
):
    stale = start_scheduler(procs, jobwheel_env, tmp_path / "stale")
    due = now_ms() + 6000
    with JobClient(settings) as client:
        job_ids = client.schedule_many(at_jobs("fence", due, 40, 20_000))
    tail.wait(lambda: len(tail.events(state=State.SCHEDULED)) >= 40, 30, "jobs not SCHEDULED")
    os.kill(stale.pid, signal.SIGSTOP)
    try:
        fresh = start_scheduler(procs, jobwheel_env, tmp_path / "fresh")
        tokens_fresh = wait_until(
            lambda: [r.fencing_token for r, _ in tail.runs], 60, 0.2, "new owner never fired"
        )
    finally:
        os.kill(stale.pid, signal.SIGCONT)
    tail.wait(lambda: all(tail.runs_of(j) for j in job_ids), 90, "not every job fired")
    time.sleep(3)  # give the resumed stale owner time to try its now-due entries
    stale_log = stale.log_path.read_text(errors="replace")
    # Per partition, the runs a consumer sees carry non-decreasing fencing tokens: once a newer
    # owner has dispatched, nothing from an older epoch becomes visible (the resumed process may
    # rejoin and own partitions again later, but under a newer token of its own).
    tokens_by_partition: dict[int, list[int]] = defaultdict(list)
    for run, _ in tail.runs:
        tokens_by_partition[run.partition].append(run.fencing_token)
    for partition, tokens in tokens_by_partition.items():
        assert tokens == sorted(tokens), f"partition {partition}: stale owner's run seen {tokens}"
    assert min(tokens_fresh) > 1, "the new owner did not take a newer epoch"
    for job in job_ids:
        assert len({r.run_id for r in tail.runs_of(job)}) == 1
    with capsys.disabled():
        print(
            f"\n[fencing] tokens seen per partition: "
            f"{ {p: sorted(set(t)) for p, t in tokens_by_partition.items()} }; the resumed "
            f"stale owner hit the broker's fence: {'fenced' in stale_log}"
        )
    assert fresh.poll() is None
