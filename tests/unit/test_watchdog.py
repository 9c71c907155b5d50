"""The call watchdog: a blocking call past its deadline takes the exit path (exit injected, so
nothing really exits), liveness turns red halfway there, and a call that returns in time is
left alone. Also that the scheduler's transactional calls and the sink's commit run under it."""

from __future__ import annotations

import logging
import threading

import pytest

from jobwheel.settings import Settings
from jobwheel.watchdog import HUNG_CALL_EXIT_CODE, CallWatchdog
from tests.support import scaled, wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watchdog(clock: Clock, exits: list[int], deadline_s: float = 30.0) -> CallWatchdog:
    return CallWatchdog(
        deadline_s,
        what="scheduler",
        setting="JOBWHEEL_SCHEDULER_CALL_DEADLINE_MS",
        exit=exits.append,
        clock=clock,
        check_every_s=3600,  # the passes are driven by the test
    )


def test_a_call_past_its_deadline_takes_the_exit_path(caplog: pytest.LogCaptureFixture) -> None:
    clock, exits = Clock(), []
    dog = watchdog(clock, exits)
    with dog.watch("send_offsets_to_transaction"):
        clock.now += 14
        assert not dog.check() and exits == []
        assert dog.check_live()[0]
        clock.now += 2  # 16 s: past half the deadline, liveness is red, no exit yet
        ok, detail = dog.check_live()
        assert not ok and "send_offsets_to_transaction has not returned for 16 s" in detail
        assert not dog.check() and exits == []
        clock.now += 15  # 31 s
        with caplog.at_level(logging.CRITICAL, logger="jobwheel.watchdog"):
            assert dog.check()
        assert exits == [HUNG_CALL_EXIT_CODE]
        [line] = [r for r in caplog.records if r.name == "jobwheel.watchdog"]
        assert "send_offsets_to_transaction has not returned for 31 s" in line.getMessage()
        assert "JOBWHEEL_SCHEDULER_CALL_DEADLINE_MS" in line.getMessage()
        assert line.call == "send_offsets_to_transaction"  # type: ignore[attr-defined]
        assert not dog.check() and exits == [HUNG_CALL_EXIT_CODE]  # one line, one exit
    dog.close()


def test_calls_that_return_are_forgotten() -> None:
    clock, exits = Clock(), []
    dog = watchdog(clock, exits)
    for _ in range(5):
        with dog.watch("commit_transaction"):
            clock.now += 20  # each within the deadline; together far past it
    clock.now += 100
    assert not dog.check() and exits == [] and dog.oldest() is None
    assert dog.check_live() == (True, "no blocking Kafka call of the scheduler in flight")
    dog.close()


def test_time_with_kafka_unreachable_does_not_count() -> None:
    """A call waiting out a broker outage is not hung; once Kafka accepts connections again
    the deadline counts from then."""
    clock, exits, up = Clock(), [], [False]
    dog = CallWatchdog(
        30.0,
        what="scheduler",
        setting="X",
        exit=exits.append,
        clock=clock,
        check_every_s=1.0,
        reachable=lambda: up[0],
    )
    with dog.watch("send_offsets_to_transaction"):
        for _ in range(10):  # a 100 s outage
            clock.now += 10
            assert not dog.check()
            assert dog.check_live()[0]
        up[0] = True
        clock.now += 29
        assert not dog.check() and exits == []
        clock.now += 2
        assert dog.check() and exits == [HUNG_CALL_EXIT_CODE]
    dog.close()


def test_the_watchdog_thread_ends_a_call_that_blocks_past_its_deadline() -> None:
    """The real thread and the real clock: a call blocked on an event that never comes (as
    librdkafka's would) is caught by the thread, which calls the exit function."""
    exited = threading.Event()
    codes: list[int] = []

    def exit_(code: int) -> None:
        codes.append(code)
        exited.set()

    dog = CallWatchdog(
        scaled(0.3), what="scheduler", setting="X", exit=exit_, check_every_s=scaled(0.02)
    )
    release = threading.Event()

    def hung_call() -> None:
        with dog.watch("abort_transaction"):
            release.wait()

    blocked = threading.Thread(target=hung_call, daemon=True)
    blocked.start()
    wait_until(exited.is_set, scaled(10), 0.01, "the watchdog never took the exit path")
    assert codes == [HUNG_CALL_EXIT_CODE]
    release.set()
    dog.close()


def test_the_default_deadlines_come_from_the_transaction_timeout() -> None:
    settings = Settings(_env_file=None, scheduler_transaction_timeout_ms=10_000)  # type: ignore[call-arg]
    assert settings.scheduler_call_timeout_s == 10.0
    assert settings.scheduler_call_deadline_s == 30.0
    assert settings.scheduler_offsets_deadline_s == 15.0  # send offsets: its timeout and 5 s
    short = Settings(_env_file=None, scheduler_transaction_timeout_ms=2_000)  # type: ignore[call-arg]
    assert short.scheduler_call_deadline_s == 15.0  # the call's timeout is at least 5 s
    assert short.scheduler_offsets_deadline_s == 10.0
    set_ = Settings(_env_file=None, scheduler_call_deadline_ms=12_000)  # type: ignore[call-arg]
    assert set_.scheduler_call_deadline_s == 12.0
    assert set_.scheduler_offsets_deadline_s == 12.0  # an operator's deadline is every call's
    with pytest.raises(ValueError, match="JOBWHEEL_SCHEDULER_CALL_DEADLINE_MS=4000"):
        Settings(_env_file=None, scheduler_call_deadline_ms=4_000)  # type: ignore[call-arg]


def test_a_call_given_its_own_deadline_exits_at_it_and_the_others_keep_the_watchdogs() -> None:
    clock, exits = Clock(), []
    dog = watchdog(clock, exits)  # 30 s
    with dog.watch("commit_transaction"), dog.watch("send_offsets_to_transaction", 15.0):
        clock.now += 8  # past half of 15 s: red, naming the call and its own deadline
        ok, detail = dog.check_live()
        assert not ok and "send_offsets_to_transaction" in detail and "exits at 15 s" in detail
        clock.now += 6  # 14 s
        assert not dog.check() and exits == []
        clock.now += 2  # 16 s: past its own deadline, far from the watchdog's
        assert dog.check() and exits == [HUNG_CALL_EXIT_CODE]
    dog.close()
    clock, exits = Clock(), []
    dog = watchdog(clock, exits)
    with dog.watch("commit_transaction"):
        clock.now += 16
        assert not dog.check() and exits == []
    with pytest.raises(ValueError, match="deadline must be positive"), dog.watch("x", -1.0):
        pass
    dog.close()


class _BlockingProducer:
    """Stands in for the librdkafka handle: each transactional call takes ``seconds`` of the
    watchdog's clock, and the watchdog looks while it is in flight (as its thread would)."""

    def __init__(self, dog: CallWatchdog, clock: Clock, seconds: float) -> None:
        self.dog, self.clock, self.seconds = dog, clock, seconds

    def _block(self, *_: object) -> None:
        self.clock.now += self.seconds
        self.dog.check()

    send_offsets_to_transaction = commit_transaction = _block

    def poll(self, _timeout: float) -> int:
        return 0


@pytest.mark.parametrize(("seconds", "exits_at"), [(14.0, None), (16.0, "send_offsets")])
def test_the_schedulers_send_offsets_is_hung_after_its_timeout_and_five_seconds(
    seconds: float, exits_at: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """``send_offsets_to_transaction`` is never resumed (a timeout replaces the producer), so
    past its own timeout (10 s) it is librdkafka's hang on a gone coordinator (issue 5511):
    the scheduler exits after 15 s of it, not the 30 s its commit may take when resumed."""
    from jobwheel.streams.kafka import TransactionalProducer

    settings = Settings(_env_file=None, bootstrap_servers="127.0.0.1:1")  # type: ignore[call-arg]
    assert settings.scheduler_offsets_deadline_s == 15.0
    clock, exits = Clock(), []
    dog = watchdog(clock, exits, settings.scheduler_call_deadline_s)
    producer = TransactionalProducer(settings, "scheduler-test-0", dog)
    producer._producer = _BlockingProducer(dog, clock, seconds)  # type: ignore[assignment]
    with caplog.at_level(logging.CRITICAL, logger="jobwheel.watchdog"):
        producer.commit([("requests", 0, 1, "")], object())
    hung = [r.call for r in caplog.records if r.name == "jobwheel.watchdog"]  # type: ignore[attr-defined]
    if exits_at is None:
        assert exits == [] and hung == []  # nor the commit's 14 s: 30 s is its deadline
    else:
        assert exits == [HUNG_CALL_EXIT_CODE] and hung == ["send_offsets_to_transaction"]
    dog.close()
