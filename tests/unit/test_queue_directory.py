"""The queues a process knows: JOBWHEEL_QUEUES, and the runs topics found on the broker (a
queue added at run time), read at most once a second however many records name unknown ones."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from jobwheel.kafka.queues import QueueDirectory
from jobwheel.schemas.topics import queue_of_topic
from jobwheel.settings import Settings


class Broker:
    """The topic list a directory reads, and how often it was read."""

    def __init__(self, *topics: str) -> None:
        self.topics = set(topics)
        self.reads = 0
        self.down = False

    def __call__(self, timeout_s: float) -> Iterable[str]:
        self.reads += 1
        if self.down:
            raise TimeoutError("broker unreachable")
        return sorted(self.topics)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def directory(broker: Broker, clock: Clock, **kw: object) -> QueueDirectory:
    settings = Settings(_env_file=None, topic_prefix="jw", queues="alpha")  # type: ignore[call-arg]
    return QueueDirectory(settings, broker, clock=clock, **kw)  # type: ignore[arg-type]


def test_a_runs_topic_is_a_queue_and_nothing_else_is() -> None:
    assert queue_of_topic("jw", "jw.runs") == "default"
    assert queue_of_topic("jw", "jw.runs.reports") == "reports"
    assert queue_of_topic("jw", "jw.runs.a.b") == "a.b"
    assert queue_of_topic("jw", "jw.requests") is None
    assert queue_of_topic("jw", "other.runs.x") is None
    assert queue_of_topic("jw", "jw.runs.") is None  # no name
    assert queue_of_topic("jw", "jw.runs." + "x" * 65) is None  # no queue could make it


def test_declared_queues_cost_no_read_and_an_added_one_is_found() -> None:
    broker, clock = Broker("jw.runs", "jw.runs.alpha", "jw.requests"), Clock()
    queues = directory(broker, clock)
    assert "default" in queues and "alpha" in queues
    assert broker.reads == 0
    assert "beta" not in queues  # not on the broker: read once, not there
    assert broker.reads == 1
    broker.topics.add("jw.runs.beta")  # `jobwheel queues add beta`
    assert "beta" not in queues  # within a second of the last read: not read again
    assert broker.reads == 1
    clock.now += 1.0
    assert "beta" in queues
    assert broker.reads == 2
    assert "beta" in queues and broker.reads == 2  # known now: no read
    assert list(queues) == ["default", "alpha", "beta"]


def test_many_unknown_names_read_the_topics_once_a_second() -> None:
    broker, clock = Broker("jw.runs"), Clock()
    queues = directory(broker, clock)
    for i in range(1000):
        assert f"q{i}" not in queues
    assert broker.reads == 1
    clock.now += 1.0
    assert "q0" not in queues
    assert broker.reads == 2


@pytest.mark.parametrize("doubt", [True, False])
def test_a_broker_that_cannot_be_asked(doubt: bool) -> None:
    """A client gives an unknown queue the benefit of the doubt (the scheduler decides); the
    scheduler does not put runs on a topic it has not seen. Declared queues stay known."""
    broker, clock = Broker("jw.runs"), Clock()
    broker.down = True
    queues = directory(broker, clock, benefit_of_doubt=doubt)
    assert ("beta" in queues) is doubt
    assert queues.error is not None and "unreachable" in queues.error
    assert "alpha" in queues
    broker.down = False
    clock.now += 1.0
    assert "beta" not in queues  # asked now: not there
    assert queues.error is None


def test_a_deleted_runs_topic_is_a_queue_forgotten_unless_declared() -> None:
    broker, clock = Broker("jw.runs", "jw.runs.beta"), Clock()
    queues = directory(broker, clock)
    assert queues.names(refresh=True) == ("default", "alpha", "beta")
    broker.topics.discard("jw.runs.beta")
    clock.now += 1.0
    assert queues.names(refresh=True) == ("default", "alpha")
    assert "beta" not in queues
