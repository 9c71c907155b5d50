"""Time as an injected dependency (Kafka Streams' ``Time``/``MockTime``).

Pure code (the timing wheel, cron arithmetic, the scheduler processor) takes ``now_ms`` as an
argument; glue code asks a :class:`Clock` for it, so tests drive time with :class:`ManualClock`
instead of patching the time module.
"""

from __future__ import annotations

import time
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
