"""Time as an injected dependency (Kafka Streams' ``Time``/``MockTime``).

Pure code (the timing wheel, cron arithmetic, the scheduler processor) takes ``now_ms`` as an
argument; glue code asks a :class:`Clock` for it, so tests drive time with :class:`ManualClock`
instead of patching the time module.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    def __init__(self, start_ms: int = 0) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> int:
        self._now += ms
        return self._now

    def set(self, ms: int) -> None:
        self._now = ms


class BrokerBoundClock:
    """The wall clock, kept within bounds of the broker's clock.

    The broker's clock is known from the broker timestamps (LogAppendTime) of the records
    read at the end of their partition, appended while the reader waited there (fresh: a
    backlog's records, or the last record of a quiet partition that a new owner reads first,
    say when they were written, not what time it is now; the caller passes only fresh ones):
    the latest one seen, advanced since by the monotonic clock, which
    no step of the host's clock moves. That estimate lags the broker by the read's latency, so
    it bounds "now" from below tightly and from above loosely: ``now_ms`` is the wall clock,
    but at most ``ahead_ms`` ahead of the estimate and ``behind_ms`` behind it; before any
    broker time is seen it is the wall clock.

    So a step of this host's clock forward makes at most ``ahead_ms`` of fires due at once
    (the rest come at the broker's pace, none MISSED by the step), a step backward delays them
    by at most ``behind_ms``. Only a later broker time moves the estimate. The broker's own
    clock is the reference; its steps are everyone's.
    """

    def __init__(
        self,
        wall: Clock,
        ahead_ms: int,
        behind_ms: int,
        monotonic_ms: Callable[[], int] | None = None,
    ) -> None:
        self.wall = wall
        self.ahead_ms = ahead_ms
        self.behind_ms = behind_ms
        self._monotonic = monotonic_ms or (lambda: time.monotonic_ns() // 1_000_000)
        self._anchor: tuple[int, int] | None = None  # (broker ms, monotonic ms) when seen

    def observe(self, broker_ms: int) -> None:
        """A broker timestamp just read (the record's LogAppendTime)."""
        if broker_ms <= 0:
            return
        estimate = self.broker_ms()
        if estimate is None or broker_ms > estimate:
            self._anchor = (broker_ms, self._monotonic())

    def broker_ms(self) -> int | None:
        """The broker's clock as estimated now, or None before any broker time was seen."""
        if self._anchor is None:
            return None
        seen, at = self._anchor
        return seen + self._monotonic() - at

    def skew_ms(self) -> int | None:
        """The wall clock minus the broker's estimated clock (positive: this host is ahead)."""
        broker = self.broker_ms()
        return None if broker is None else self.wall.now_ms() - broker

    def now_ms(self) -> int:
        wall = self.wall.now_ms()
        broker = self.broker_ms()
        if broker is None:
            return wall
        return max(broker - self.behind_ms, min(wall, broker + self.ahead_ms))


def clamp_ms(value_ms: int, reference_ms: int, tolerance_ms: int) -> int:
    """``value_ms`` moved into ``[reference_ms - tolerance_ms, reference_ms + tolerance_ms]``."""
    return max(reference_ms - tolerance_ms, min(value_ms, reference_ms + tolerance_ms))
