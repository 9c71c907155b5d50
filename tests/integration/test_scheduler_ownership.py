"""One ownership of a partition does not leak into the next, on the real broker.

The engine runs in the test's own thread (``SchedulerEngine.step`` called by the test, its
clock a :class:`ManualClock`), on real clients of a real broker: its group membership, its
transactions and the broker's answers are Kafka's. The revoke -> standby -> reassign cycle is
driven through the engine's rebalance callbacks with the arguments the consumer passes them,
so a partition goes away with work read and not yet committed (the tail a revoke drops) and
comes back in a chosen iteration.
"""

from __future__ import annotations

import os
import secrets
import signal
import struct
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from jobwheel.clock import ManualClock
from jobwheel.errors import BrokerError
from jobwheel.kafka.admin import admin_client
from jobwheel.producers.client import JobClient
from jobwheel.schemas.codec import default_codec
from jobwheel.schemas.models import State, StatusEvent
from jobwheel.schemas.partitioning import partition_for
from jobwheel.settings import Settings
from jobwheel.streams.engine import Phase, SchedulerEngine
from jobwheel.streams.state.partition import EPOCH_KEY
from tests.integration.scheduler_support import (
    engine_of,
    job_in,
    log_events,
    now_ms,
    start_scheduler,
    step_until,
    wait_owns_all,
)
from tests.support import HarnessError, log_tail, scaled, stop, wait_until

CODEC = default_codec()
#: No run expires by time alone during a test: a second attempt is a wrong expiry.
VISIBILITY = timedelta(minutes=10)


def schedule_echo(settings: Settings, job: str, due_ms: int) -> None:
    """One ``demo.echo`` job due at ``due_ms`` that no deadline expires during a test."""
    with JobClient(settings) as client:
        client.schedule(
            job,
            task="demo.echo",
            at=datetime.fromtimestamp(due_ms / 1000, UTC),
            visibility_timeout=VISIBILITY,
        )


def reclaim(engine: SchedulerEngine, partition: int) -> None:
    """The partition is revoked (a standby copy is left) and assigned here again."""
    engine._on_revoke([partition])
    assert engine.tasks[partition].phase is Phase.STANDBY
    engine._on_assign([partition])


def test_a_reclaimed_partition_does_not_count_the_acks_its_last_ownership_dropped(settings, tail):
    """The acks watermark is how far this ownership has read the acks. A revoke drops what
    was read and not committed; the next claim reads it again from the committed offset.
    Carried over from the last ownership, the watermark counted that dropped tail as read,
    so a run whose HEARTBEAT was in the tail expired before the heartbeat was read again:
    a healthy run got a second attempt on the claim's first punctuation."""
    settings = settings.model_copy(update={"scheduler_commit_interval_ms": 3_000})
    dispatched = now_ms() - 2 * int(VISIBILITY.total_seconds() * 1000)
    clock = ManualClock(dispatched)  # the deadline is in the past only once the clock moves
    p = 0
    job = job_in(p, settings.partitions, "beat")
    with engine_of(settings, clock) as engine:
        schedule_echo(settings, job, dispatched)
        step_until(engine, lambda: tail.runs_of(job), "the job never fired")
        [run] = tail.runs_of(job)

        # The worker's side: the run's HEARTBEAT, appended after the run's first deadline
        # (the clock is behind) and moving it a visibility timeout past its own time.
        producer = Producer(settings.librdkafka())
        beat = StatusEvent(
            event_id=f"{run.run_id}:beat",
            job_id=job,
            state=State.HEARTBEAT,
            event_time_ms=now_ms(),
            source="worker",
            seq=run.seq + 1,
            run_id=run.run_id,
            attempt=run.attempt,
        )
        producer.produce(
            settings.topics.acks, value=CODEC.encode(beat), key=job.encode(), partition=p
        )
        assert producer.flush(scaled(30)) == 0
        task = engine.tasks[p]
        deadline = run.dispatched_at_ms + int(VISIBILITY.total_seconds() * 1000)
        step_until(engine, lambda: task.acks_next == 1, "the heartbeat was never read")
        assert task.acks_seen_ms > deadline
        # Read, not committed: the revoke drops it, and the next claim reads it again.
        assert p in engine._touched and task.acks_committed is None

        clock.set(now_ms())
        reclaim(engine, p)
        step_until(engine, lambda: engine.tasks[p].phase is Phase.READY, "never ready again")
        # Its first punctuation is done; once it has read the acks again, a job scheduled
        # now fires behind anything that punctuation sent on the same partition.
        probe = job_in(p, settings.partitions, "probe")
        with JobClient(settings) as client:
            at = datetime.fromtimestamp(clock.now_ms() / 1000, UTC)
            client.schedule(probe, task="demo.echo", at=at, visibility_timeout=VISIBILITY)
        step_until(engine, lambda: tail.runs_of(probe), "the reclaimed partition never fired")
    assert tail.runs_of(job) == [run], "a healthy run was dispatched again"
    assert not tail.events(job, State.DEAD)


def test_a_claim_whose_first_transaction_aborts_still_changelogs_its_epoch(settings, tail):
    """Each claim takes the next fencing token and writes it to the changelog, so the next
    owner takes a higher one. Carried over from the last ownership, "the epoch is committed"
    kept an aborted first transaction of the new claim from writing it again: the claim's
    runs carried a token the changelog never held, and the next owner would reuse it.
    The abort is the broker's: the runs topic refuses the claim's first run (too large)."""
    due = now_ms()
    clock = ManualClock(due - 60_000)
    p = 1
    job = job_in(p, settings.partitions, "big")
    runs = settings.topics.runs
    admin = admin_client(settings)
    # The limit is set before anything else happens: the broker applies a topic's config a
    # moment after the controller accepted it, and the engine's start, claims and the
    # SCHEDULED transaction (none of which writes a run) leave it seconds to do so.
    limit = ConfigEntry("max.message.bytes", "8192", incremental_operation=AlterConfigOpType.SET)
    unlimited = ConfigEntry(
        "max.message.bytes", None, incremental_operation=AlterConfigOpType.DELETE
    )
    _alter(admin, runs, limit)
    lifted = False
    try:
        with engine_of(settings, clock) as engine:
            with JobClient(settings) as client:
                client.schedule(
                    job,
                    task="demo.echo",
                    # random: the scheduler compresses its batches; repeats would fit
                    args={"pad": secrets.token_hex(10_000)},
                    at=datetime.fromtimestamp(due / 1000, UTC),
                    visibility_timeout=VISIBILITY,
                )
            step_until(engine, lambda: tail.events(job, State.SCHEDULED), "never SCHEDULED")
            step_until(engine, lambda: not engine._touched, "the SCHEDULED change never committed")
            first_token = engine.tasks[p].epoch

            clock.set(due)
            reclaim(engine, p)
            aborts, commits = engine.stats.aborts, engine.stats.transactions
            # The claim is restored from its standby copy, the job fires, and the first
            # transaction of the claim (its epoch and the run) is refused. Ready and that first
            # transaction may come in one iteration or two: the test waits for its outcome.
            step_until(engine, lambda: engine.tasks[p].phase is Phase.READY, "never ready")
            step_until(
                engine,
                lambda: (engine.stats.aborts, engine.stats.transactions) != (aborts, commits),
                "the claim's first transaction never ended",
            )
            assert (engine.stats.aborts, engine.stats.transactions) == (aborts + 1, commits)
            _alter(admin, runs, unlimited)
            lifted = True
            # The transaction is redone (and refused again) until the broker applies the lift.
            step_until(engine, lambda: engine.stats.transactions > commits, "never committed")
            step_until(engine, lambda: tail.runs_of(job), "the job never fired after the abort")
            token = engine.tasks[p].epoch
    finally:
        if not lifted:
            _alter(admin, runs, unlimited)
    [run] = tail.runs_of(job)
    assert run.fencing_token == token == first_token + 1
    assert changelog_epoch(settings, p) == token, "the claim's epoch is not in the changelog"


@pytest.mark.parametrize("call", ["committed", "seek"])
def test_a_claim_its_consumer_cannot_finish_is_given_up_with_every_client(settings, tail, call):
    """After a broker restart under commits, a claim (a producer timed out, every partition
    claimed again) was seen failing for good in the group consumer, with the broker up:
    reading the committed offsets timed out for 300 s, or rewinding the input
    was refused with ``Erroneous state`` for 120 s. The claim retried every iteration, the
    loop kept turning, nothing turned red, and the partitions stayed "restoring", their jobs
    unfired. Here the consumer's call refuses as it did, until the consumer is replaced: the
    claim must be given up with every client after the claim stall bound, the group joined
    again, and the partitions must claim, restore and fire on the new clients. What refuses
    is the test's stand-in for the client's stuck state; the broker, the group and the
    transactions are real."""
    settings = settings.model_copy(
        # the bound: max(restore stall 1 s, transaction timeout 1 s + 15 s) = 16 s
        update={"scheduler_restore_stall_ms": 1_000, "scheduler_transaction_timeout_ms": 1_000}
    )
    clock = ManualClock(now_ms())
    job = job_in(2, settings.partitions, "stuck")
    with engine_of(settings, clock) as engine:
        stuck = engine.input
        assert stuck is not None
        refusals: list[float] = []

        def refuse(*_args: object, **_kwargs: object) -> None:
            refusals.append(time.monotonic())
            code = "_TIMED_OUT" if call == "committed" else "_STATE"
            raise BrokerError(f"{call} refused by the test (as a stuck client)", code=code)

        setattr(stuck, call, refuse)  # this client only: a new one asks the broker
        engine._reset("test: a commit timed out", rejoin=False)  # claims every partition again
        step_until(engine, lambda: refusals, f"the claim never called {call}")
        assert engine.owned() == {p: "restoring" for p in range(settings.partitions)}
        step_until(
            engine,
            lambda: (
                engine.input is not stuck
                and engine.owned() == {p: "ready" for p in range(settings.partitions)}
            ),
            "the stuck claim was never given up and made again on new clients",
            timeout_s=120,
        )
        # Given up once, after the bound: refused all along until then.
        assert engine.stats.stuck_claims == 1
        assert refusals[-1] - refusals[0] >= settings.scheduler_claim_stall_s - 1
        schedule_echo(settings, job, clock.now_ms())
        step_until(engine, lambda: tail.runs_of(job), "the new claim never fired a job")
    assert len(tail.runs_of(job)) == 1


def _alter(admin, topic: str, entry: ConfigEntry) -> None:  # type: ignore[no-untyped-def]
    resource = ConfigResource("topic", topic, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=scaled(30))


def changelog_epoch(settings: Settings, partition: int) -> int | None:
    """The last fencing token the changelog partition holds (committed records only)."""
    topic = settings.topics.changelog(settings.scheduler_app_id)
    consumer = Consumer(
        settings.librdkafka(
            **{
                "group.id": f"{settings.scheduler_app_id}-epoch-check",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
    )
    try:
        _low, end = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=scaled(30)
        )
        consumer.assign([TopicPartition(topic, partition, 0)])
        epoch = None
        position = 0
        deadline = now_ms() + scaled(30) * 1000
        while position < end:
            if now_ms() > deadline:
                raise HarnessError(f"the changelog was not read to its end {end} in time")
            for msg in consumer.consume(500, 0.5):
                if msg.error() is not None:
                    raise HarnessError(f"reading the changelog failed: {msg.error()}")
                if msg.key() == EPOCH_KEY:
                    epoch = struct.unpack(">q", msg.value())[0]
            [tp] = consumer.position([TopicPartition(topic, partition)])
            position = max(position, tp.offset)
        return epoch
    finally:
        consumer.close()


def wait_written(
    settings: Settings, topic: str, partition: int, key: bytes, timeout_s: float = 30
) -> None:
    """Wait until a record with ``key`` is on the partition, committed or not (a transaction
    still open wrote it)."""
    consumer = Consumer(
        settings.librdkafka(
            **{
                "group.id": f"{settings.scheduler_app_id}-uncommitted",
                "isolation.level": "read_uncommitted",
                "enable.auto.commit": False,
            }
        )
    )
    consumer.assign([TopicPartition(topic, partition, 0)])

    def seen() -> bool:
        for msg in consumer.consume(100, 0.1):
            if msg.error() is not None:
                raise HarnessError(f"reading {topic} failed: {msg.error()}")
            if msg.key() == key:
                return True
        return False

    try:
        wait_until(
            seen, scaled(timeout_s), 0, f"no record {key!r} was written to {topic}/{partition}"
        )
    finally:
        consumer.close()


def stop_in_commit_hook(pid: int) -> None:
    """SIGSTOP a scheduler run with ``JOBWHEEL_SCHEDULER_FAULT_COMMIT_DELAY_MS`` while it
    sleeps in that hook: its offsets are in the open transaction, not committed yet. The hook
    is its process's only sleep in ``clock_nanosleep`` (wchan ``hrtimer_nanosleep``)."""
    wchan = Path(f"/proc/{pid}/wchan")
    wait_until(
        lambda: "nanosleep" in wchan.read_text(),
        scaled(30),
        0.005,
        f"the scheduler never slept in its commit hook (wchan {wchan.read_text()!r})",
    )
    os.kill(pid, signal.SIGSTOP)


def test_a_claim_reads_the_committed_offsets_before_it_measures_the_changelog(
    settings, jobwheel_env, procs, tmp_path, tail
):
    """The old owner is stopped inside a transaction that schedules a job: its offsets are
    sent (pending), its changelog record written (open). The new owner claims the partition
    once the old one's session times out. Measuring the changelog's end first, it stopped
    before the open transaction; its read of the committed offsets then waited for that
    transaction (``require_stable``), which committed when the old owner woke: the new owner
    took offsets past the command and never restored the job, which never fired. Reading the
    offsets first, it measures the end after the transaction ended and restores the job."""
    old = start_scheduler(
        procs,
        jobwheel_env,
        tmp_path / "old",
        extra_env={
            # Longer than the session timeout (6 s) and the claim that follows, shorter than the
            # new owner's wait for the committed offsets (10 s) on top of them.
            "JOBWHEEL_SCHEDULER_FAULT_COMMIT_DELAY_MS": "12000",
            # Inside the transaction timeout, past the session timeout (6 s).
            "JOBWHEEL_SCHEDULER_TRANSACTION_TIMEOUT_MS": "120000",
        },
    )
    wait_owns_all(old, settings.partitions)
    job = "stalled-claim"
    due = now_ms() + 40_000
    p = partition_for(job, settings.partitions)
    schedule_echo(settings, job, due)
    # The transaction that schedules it is open: stop its owner in the hook before its commit.
    changelog = settings.topics.changelog(settings.scheduler_app_id)
    wait_written(settings, changelog, p, job.encode(), timeout_s=90)
    stop_in_commit_hook(old.pid)
    try:
        new = start_scheduler(procs, jobwheel_env, tmp_path / "new", wait=False)
        # Wake the old owner once the new one has measured the changelog, or has waited for
        # the committed offsets (require_stable holds them back while the transaction is
        # open) until its read gave up: what comes first in the claim. The old owner then
        # sleeps out the rest of its hook (the stop counts), and commits.
        wait_until(
            lambda: (
                [e for e in log_events(new.log_path, "changelog measured") if e["partition"] == p]
                or log_events(new.log_path, "cannot read committed offsets yet")
            ),
            scaled(60),
            0.01,
            f"the new owner never claimed the partition:\n{log_tail(new.log_path)}",
        )
    finally:
        os.kill(old.pid, signal.SIGCONT)  # commits the transaction (its offsets are accepted)
    # What the new owner restored: the job is pending there. (The woken old owner rejoins
    # and may take the partition back with its own state, so the fire alone proves nothing.)
    ready = wait_until(
        lambda: [e for e in log_events(new.log_path, "partition ready") if e["partition"] == p],
        scaled(60),
        0.1,
        f"the new owner never made the partition ready:\n{log_tail(new.log_path)}",
    )
    assert ready[0]["next_due_ms"] == due, "the new owner restored state without the job"
    tail.wait(lambda: tail.runs_of(job), scaled(90), "the job never fired")
    assert len(tail.runs_of(job)) == 1


def hold_transaction_open(settings: Settings, topic: str, partition: int) -> Producer:
    """A transaction of another producer, open on ``topic``/``partition`` with one record: the
    partition's last stable offset stops before it until the transaction is decided, as it does
    while a committed transaction's marker waits for a leader that has just moved (the marker
    is written after ``commit_transaction`` returns). The caller aborts it."""
    producer = Producer(
        settings.librdkafka(
            **{
                "transactional.id": f"{settings.scheduler_app_id}-test-undecided",
                "transaction.timeout.ms": 300_000,
            }
        )
    )
    producer.init_transactions(scaled(30))
    producer.begin_transaction()
    # A tombstone of a key no job has: harmless even if read.
    producer.produce(topic, key=b"test-undecided", value=None, partition=partition)
    if producer.flush(scaled(30)) != 0:
        raise HarnessError("the undecided transaction's record was not delivered")
    return producer


@pytest.mark.parametrize("disk", ["new", "same"])
def test_a_claim_restores_the_committed_changelog_behind_an_undecided_transaction(
    settings, jobwheel_env, procs, tmp_path, tail, disk
):
    """A transaction undecided on a changelog partition hides the records committed after it
    from a ``read_committed`` reader's end (the last stable offset). In a broker cut off mid-
    commit that is the owner's own committed transaction, whose marker waits for a new leader;
    here another producer holds one open. A claim that restored to the last stable offset lost
    the job committed behind it (its command's offset was committed, its state never read): on
    a new disk it restored too little, on the same disk it took its checkpoint, past that end,
    for a changelog that had lost records and wiped it. The claim must read to the high
    watermark, and so waits until the transaction is decided; then the job is restored and
    fires once."""
    changelog = settings.topics.changelog(settings.scheduler_app_id)
    old = start_scheduler(procs, jobwheel_env, tmp_path / "old")
    wait_owns_all(old, settings.partitions)
    job = f"behind-undecided-{disk}"
    p = partition_for(job, settings.partitions)
    undecided = hold_transaction_open(settings, changelog, p)
    try:
        due = now_ms() + int(scaled(30_000))
        schedule_echo(settings, job, due)
        # Committed by the owner (its status event comes in the same transaction as its
        # changelog record, past the undecided one), then the owner stops cleanly.
        tail.wait(lambda: tail.events(job, State.SCHEDULED), scaled(60), f"{job} never scheduled")
        assert stop(old, signal.SIGTERM, 30) == 0, log_tail(old.log_path)
        new = start_scheduler(
            procs,
            jobwheel_env,
            tmp_path / ("new" if disk == "new" else "old"),
            wait=False,
            log_name=f"claim-{disk}",
        )

        def ready(partition: int) -> list[dict]:
            return [
                e
                for e in log_events(new.log_path, "partition ready")
                if e["partition"] == partition
            ]

        # Every other partition restores; this one waits for the transaction to be decided.
        others = [q for q in range(settings.partitions) if q != p]
        wait_until(
            lambda: all(ready(q) for q in others),
            scaled(60),
            0.1,
            f"the new owner never made the other partitions ready:\n{log_tail(new.log_path)}",
        )
        measured = [
            e for e in log_events(new.log_path, "changelog measured") if e["partition"] == p
        ]
        assert measured, log_tail(new.log_path)
        time.sleep(2)  # the negative check's span: the partition is still restoring
        assert ready(p) == [], "restored before the transaction under its end was decided"
        undecided.abort_transaction(scaled(30))
    finally:
        undecided.flush(0)
    restored = wait_until(
        lambda: ready(p),
        scaled(60),
        0.1,
        f"the new owner never made the partition ready:\n{log_tail(new.log_path)}",
    )
    assert restored[0]["next_due_ms"] == due, "the claim restored state without the job"
    assert not log_events(new.log_path, "local state does not fit the changelog")
    tail.wait(lambda: tail.runs_of(job), scaled(90), "the job never fired")
    assert len(tail.runs_of(job)) == 1
