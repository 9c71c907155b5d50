"""How long a claim may fail in the group consumer before the engine gives it up with every
client (:meth:`~jobwheel.streams.restore.Restorer.stuck_claim`): only time with Kafka
accepting connections counts, since a claim waiting out an outage is not stuck and a consumer
replaced then cannot tell the broker it leaves. The whole path, on a real broker:
``test_a_claim_its_consumer_cannot_finish_is_given_up_with_every_client``."""

from __future__ import annotations

from jobwheel.errors import BrokerError
from jobwheel.settings import Settings
from jobwheel.streams.engine import SchedulerEngine
from jobwheel.streams.state.partition import MemoryBackend, PartitionState
from jobwheel.streams.tasks import PartitionTask, Phase

SETTINGS = Settings(_env_file=None, topic_prefix="p", partitions=1)  # type: ignore[call-arg]
BOUND_S = SETTINGS.scheduler_claim_stall_s
TIMED_OUT = BrokerError("Failed to get committed offsets: Local: Timed out", code="_TIMED_OUT")


def claiming_engine(reachable: list[bool]) -> tuple[SchedulerEngine, PartitionTask]:
    engine = SchedulerEngine(SETTINGS)
    engine._kafka_reachable = lambda: reachable[0]
    state = PartitionState(MemoryBackend())
    task = PartitionTask(0, state.backend, state)  # type: ignore[arg-type]
    engine.tasks[0] = task
    return engine, task


def test_a_claim_failing_with_kafka_reachable_is_stuck_once_past_the_bound() -> None:
    engine, task = claiming_engine([True])
    engine._claim_failed(task, "cannot read committed offsets yet", TIMED_OUT)
    assert task.claim_failing_since is not None
    assert engine.stuck_claim() is None
    task.claim_failing_since -= BOUND_S - 1  # a second short of the bound
    engine._claim_failed(task, "cannot rewind the input yet", TIMED_OUT)  # the clock goes on
    assert engine.stuck_claim() is None
    task.claim_failing_since -= 2
    assert engine.stuck_claim() == f"the claim of partition 0 failed for {BOUND_S + 1:.0f} s"
    assert engine.stats.stuck_claims == 1


def test_time_with_kafka_unreachable_does_not_count() -> None:
    reachable = [True]
    engine, task = claiming_engine(reachable)
    engine._claim_failed(task, "cannot read committed offsets yet", TIMED_OUT)
    assert task.claim_failing_since is not None
    task.claim_failing_since -= BOUND_S + 5  # failing that long: stuck, had Kafka been up
    reachable[0] = False  # ...but it is down now: the clock starts again
    engine._claim_failed(task, "cannot read committed offsets yet", TIMED_OUT)
    assert engine.stuck_claim() is None
    reachable[0] = True
    engine._claim_failed(task, "cannot read committed offsets yet", TIMED_OUT)
    assert engine.stuck_claim() is None
    assert engine.stats.stuck_claims == 0


def test_the_bound_is_never_below_what_a_healthy_claim_can_wait() -> None:
    """A healthy claim waits behind a previous owner's open transaction until the broker aborts
    it: the transaction timeout, plus the broker's check for timed-out ones (10 s by default)."""
    short = Settings(  # type: ignore[call-arg]
        _env_file=None, scheduler_restore_stall_ms=1_000, scheduler_transaction_timeout_ms=60_000
    )
    assert short.scheduler_claim_stall_s == 75.0
    long = Settings(_env_file=None, scheduler_restore_stall_ms=120_000)  # type: ignore[call-arg]
    assert long.scheduler_claim_stall_s == 120.0
    assert SETTINGS.scheduler_claim_stall_s == 30.0  # the defaults: 30 s, 10 s + 15 s


def test_a_claim_that_failed_and_then_came_through_is_not_stuck() -> None:
    """Failures that end are not a stuck claim: a claim that waited behind a previous owner's
    transaction, then became ready, was given up 30 s after its first failure, its partitions
    processing by then, and every client replaced for nothing."""
    engine, task = claiming_engine([True])
    engine._claim_failed(task, "cannot read committed offsets yet", TIMED_OUT)
    assert task.claim_failing_since is not None
    task.claim_failing_since -= BOUND_S + 5
    task.phase = Phase.READY
    assert engine.stuck_claim() is None
    assert engine.stats.stuck_claims == 0
