"""The scheduler's "now" against steps of its host's clock, and a command's issue time against
a client's clock: both held within a tolerance of the broker's time as read (LogAppendTime),
advanced by the monotonic clock. Driven by manual clocks; the processor is the pure one."""

from __future__ import annotations

import pytest

from jobwheel.clock import BrokerBoundClock, ManualClock, clamp_ms
from jobwheel.schemas.models import Every, JobCommand, ScheduleJob, State
from jobwheel.streams.processor import SchedulerProcessor
from jobwheel.streams.state.partition import MemoryBackend, PartitionState

T0 = 1_800_000_000_000
HOUR = 3_600_000
TOLERANCE = 2_000  # how far behind the broker's time "now" may be, and an issue time off
AHEAD = 10_000  # how far ahead of it "now" may be (the broker time read lags a little)


class Clocks:
    """A host: its wall clock (which can be stepped) and its monotonic clock (which cannot),
    under a BrokerBoundClock; ``elapse`` moves real time for both."""

    def __init__(self) -> None:
        self.wall = ManualClock(T0)
        self.mono = ManualClock(0)
        self.bound = BrokerBoundClock(self.wall, AHEAD, TOLERANCE, self.mono.now_ms)

    def elapse(self, ms: int) -> None:
        self.wall.advance(ms)
        self.mono.advance(ms)


@pytest.fixture
def host() -> Clocks:
    return Clocks()


def test_before_any_broker_time_now_is_the_wall_clock(host):
    host.wall.advance(HOUR)
    assert host.bound.now_ms() == T0 + HOUR
    assert host.bound.skew_ms() is None


def test_a_forward_step_moves_now_by_the_ahead_bound_at_most(host):
    host.bound.observe(T0)
    host.elapse(500)
    assert host.bound.now_ms() == T0 + 500
    host.wall.advance(HOUR)  # the step
    assert host.bound.now_ms() == T0 + 500 + AHEAD
    assert host.bound.skew_ms() == HOUR
    host.elapse(1_000)  # time goes on at the broker's pace
    assert host.bound.now_ms() == T0 + 1_500 + AHEAD


def test_a_backward_step_moves_now_by_the_tolerance_at_most(host):
    host.bound.observe(T0)
    host.wall.advance(-HOUR)
    assert host.bound.now_ms() == T0 - TOLERANCE
    assert host.bound.skew_ms() == -HOUR


def test_old_broker_times_of_a_backlog_do_not_pull_the_estimate_back(host):
    host.bound.observe(T0)
    host.elapse(10_000)
    host.bound.observe(T0 - HOUR)  # a lagging reader's old acks
    assert host.bound.broker_ms() == T0 + 10_000
    host.bound.observe(T0 + 20_000)  # a later one moves it (the host's clock is behind)
    assert host.bound.broker_ms() == T0 + 20_000
    assert host.bound.now_ms() == T0 + 20_000 - TOLERANCE


def test_a_forward_step_misses_the_ahead_bounds_worth_of_fires_not_the_step(host):
    """An every-second job; the host's clock jumps an hour ahead before its first fire. On
    the wall clock the punctuation marks the hour's fires MISSED for good and runs one. On
    the bounded clock "now" jumps by the ahead bound only: the missed-run rule takes the fires
    of those 10 s (the earlier MISSED, the latest runs), then they come one a second at the
    broker's pace."""
    wall_only = SchedulerProcessor(0, PartitionState(MemoryBackend()), 1)
    bounded = SchedulerProcessor(0, PartitionState(MemoryBackend()), 1)
    for proc in (wall_only, bounded):
        command = JobCommand("c1", "tick", T0, ScheduleJob("demo.echo", Every(1000)))
        proc.on_command(command, T0)
    host.bound.observe(T0)
    host.wall.advance(HOUR)  # the step

    stepped, _ = wall_only.punctuate(host.wall.now_ms(), 10_000)
    [run] = stepped.runs
    assert run.scheduled_time_ms == T0 + HOUR
    assert [e for e in stepped.status if e.state is State.MISSED]

    fired: list[int] = []
    missed: list[int] = []
    for _ in range(5):
        host.elapse(1000)
        out, _ = bounded.punctuate(host.bound.now_ms(), 10_000)
        fired += [r.scheduled_time_ms for r in out.runs]
        missed += [e.scheduled_time_ms for e in out.status if e.state is State.MISSED]
    assert missed == [T0 + 1000 * i for i in range(1, 11)]
    assert fired == [T0 + 1000 * i for i in range(11, 16)]


@pytest.mark.parametrize(
    ("issued", "broker", "held"),
    [
        (T0, T0, T0),
        (T0 + TOLERANCE, T0, T0 + TOLERANCE),
        (T0 + HOUR, T0, T0 + TOLERANCE),  # a client clock an hour fast
        (T0 - HOUR, T0, T0 - TOLERANCE),  # an hour slow
    ],
)
def test_an_issue_time_is_held_within_the_tolerance_of_the_broker_time(issued, broker, held):
    assert clamp_ms(issued, broker, TOLERANCE) == held
