"""How a partition's leader is asked (``kafka.consumer.ask_leaders``: its offsets, the
offsets at a time), on a clock and a consumer that only record what was asked: the first ask is
short, the metadata is refreshed after each failure, a timed-out ask goes on with longer waits
until the timeout, and an ask that fails at once after a refresh is raised rather than
repeated. On a real cluster the test
``test_a_changelog_end_is_read_from_its_new_leader_once_the_old_one_was_killed`` shows what
that is for: an ask to a killed leader waited its whole timeout (30.0 s of 30), and the
scheduler's loop with it."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from jobwheel.errors import BrokerError
from jobwheel.kafka import consumer as kafka_consumer
from jobwheel.kafka.consumer import LEADER_FIRST_ASK_S, LEADER_NOT_NOW_S, LEADER_RETRY_PAUSE_S
from jobwheel.kafka.reader import TopicReader
from jobwheel.streams.kafka import _watermarks


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Cluster:
    """A consumer whose cache names a dead leader until its metadata is refreshed
    ``refreshes_to_heal`` times; each answer is ``(0, 7)``. ``fails_at_once``: every ask
    fails at once with "no leader" instead (a partition whose replicas are all down)."""

    def __init__(self, clock: Clock, refreshes_to_heal: int, fails_at_once: bool = False) -> None:
        self.clock = clock
        self.refreshes_to_heal = refreshes_to_heal
        self.fails_at_once = fails_at_once
        #: Asks answered "Leader high watermark is not caught up" first (a new leader).
        self.not_caught_up = 0
        self.calls: list[tuple[str, float]] = []

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        self.calls.append(("ask", timeout))
        if self.not_caught_up > 0:
            self.not_caught_up -= 1
            raise KafkaException(KafkaError(KafkaError.OFFSET_NOT_AVAILABLE))
        if self.fails_at_once:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        if self.refreshes_to_heal > 0:
            self.clock.now += timeout  # the dead leader never answers: the ask waits it out
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return 0, 7

    def list_topics(self, topic: str, timeout: float) -> None:
        self.calls.append(("refresh", timeout))
        self.refreshes_to_heal -= 1


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(kafka_consumer, "time", clock)
    return clock


def _scheduler_measure(cluster: Cluster) -> tuple[int, int]:
    return _watermarks(cluster, "t", 0, timeout_s=10.0)


def _reader_on(cluster: Cluster) -> TopicReader:
    reader = TopicReader.__new__(TopicReader)  # its consumer is the fake; nothing else is used
    reader._consumer = cluster
    return reader


def _reader_end(cluster: Cluster) -> tuple[int, int]:
    return _reader_on(cluster).watermarks("t", 0, timeout_s=10.0)


@pytest.mark.parametrize("ask", [_scheduler_measure, _reader_end], ids=["scheduler", "reader"])
def test_a_dead_cached_leader_costs_one_short_ask_then_the_new_leader_answers(
    clock: Clock, ask: Any
) -> None:
    """Both askers: the scheduler's changelog measure and the SDK's reader (``wait``, the
    dead-letter listing, the worker's acks lookup)."""
    cluster = Cluster(clock, refreshes_to_heal=1)
    assert ask(cluster) == (0, 7)
    assert cluster.calls == [
        ("ask", LEADER_FIRST_ASK_S),
        ("refresh", LEADER_FIRST_ASK_S),
        ("ask", LEADER_FIRST_ASK_S),
    ]
    assert clock.now - 1000.0 == LEADER_FIRST_ASK_S


def test_asks_that_time_out_wait_longer_each_time_until_the_timeout(clock: Clock) -> None:
    cluster = Cluster(clock, refreshes_to_heal=100)
    with pytest.raises(BrokerError, match="reading the offsets of t/0.*_TIMED_OUT"):
        _watermarks(cluster, "t", 0, timeout_s=10.0)
    asks = [wait for what, wait in cluster.calls if what == "ask"]
    assert asks == [1.0, 1.0, 2.0, 4.0, 2.0]  # the last one: what is left of the 10 s
    assert clock.now - 1000.0 == 10.0


def test_a_slow_leader_that_answers_within_the_timeout_is_waited_for(clock: Clock) -> None:
    cluster = Cluster(clock, refreshes_to_heal=3)
    assert _watermarks(cluster, "t", 0, timeout_s=10.0) == (0, 7)
    assert [wait for what, wait in cluster.calls if what == "ask"] == [1.0, 1.0, 2.0, 4.0]


def test_a_new_leader_not_caught_up_yet_is_asked_again_until_it_answers(clock: Clock) -> None:
    """What a leader elected a moment ago answers at first; on the cluster, right after a kill,
    two asks in a row got it, and the measure was raised instead of answered."""
    cluster = Cluster(clock, refreshes_to_heal=0)
    cluster.not_caught_up = 5
    assert _watermarks(cluster, "t", 0, timeout_s=10.0) == (0, 7)
    assert [what for what, _ in cluster.calls] == ["ask", "refresh"] * 5 + ["ask"]
    assert clock.now - 1000.0 == pytest.approx(5 * LEADER_RETRY_PAUSE_S)


def test_a_leader_that_stays_not_caught_up_is_raised_after_a_while(clock: Clock) -> None:
    """Its followers down too, a new leader can say "not caught up" for half a minute: the
    scheduler asks again in its next iteration rather than wait here its whole timeout."""
    cluster = Cluster(clock, refreshes_to_heal=0)
    cluster.not_caught_up = 1000
    with pytest.raises(BrokerError, match="OFFSET_NOT_AVAILABLE"):
        _watermarks(cluster, "t", 0, timeout_s=10.0)
    assert clock.now - 1000.0 == pytest.approx(LEADER_NOT_NOW_S)


def test_no_leader_after_a_refresh_is_raised_at_once(clock: Clock) -> None:
    """The cluster's answer now: the caller asks again in its next iteration, and the loop
    does not wait here for a broker that may be down for minutes."""
    cluster = Cluster(clock, refreshes_to_heal=0, fails_at_once=True)
    with pytest.raises(BrokerError, match="_UNKNOWN_PARTITION"):
        _watermarks(cluster, "t", 0, timeout_s=10.0)
    assert [what for what, _ in cluster.calls] == ["ask", "refresh", "ask"]


class LeaderOfTimesKilled(Cluster):
    """Offsets are answered; the offsets at a time are asked of the killed leader until the
    metadata is refreshed."""

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        self.calls.append(("ask", timeout))
        return 0, 7

    def offsets_for_times(self, tps: list[TopicPartition], timeout: float) -> list[Any]:
        self.calls.append(("times", timeout))
        if self.refreshes_to_heal > 0:
            self.clock.now += timeout
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return [TopicPartition(tp.topic, tp.partition, 5) for tp in tps]


def test_the_readers_offsets_at_a_time_are_asked_the_same_way(clock: Clock) -> None:
    """``wait`` finds where a job's events start by time: the same short first ask."""
    cluster = LeaderOfTimesKilled(clock, refreshes_to_heal=1)
    assert _reader_on(cluster).offsets_at("t", [0], ms=123, timeout_s=10.0) == {0: 5}
    assert cluster.calls == [
        ("ask", LEADER_FIRST_ASK_S),
        ("times", LEADER_FIRST_ASK_S),
        ("refresh", LEADER_FIRST_ASK_S),
        ("times", LEADER_FIRST_ASK_S),
    ]
