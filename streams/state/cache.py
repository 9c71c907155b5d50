"""The decoded job records a partition keeps in memory, and which of them to let go.

A one-off job's record is written when it is scheduled, read and written when it fires, and
again when its verdict comes; decoding it from RocksDB's bytes each time was a tenth of the
scheduler's CPU per job. So :class:`~jobwheel.streams.state.partition.PartitionState` keeps
the records it saved decoded, up to a bound, and this module decides which ones.

**What is kept.** The records that will be read again soon: those with a run in flight (the
verdict comes within seconds) and those waiting for a fire. A record that waits only for its
expiry (a finished job kept for the retention) or for a resume (a paused job) is not kept: it
is read again by a command or a day later, if at all, and in the cache it would push out the
records about to fire.

**What leaves first.** The record whose next fire is the furthest away (the one needed last),
then, with none waiting, the oldest record with a run in flight. Letting the oldest saved leave
first, as a plain FIFO or LRU does, fails the scheduler's most common pattern: jobs scheduled
in a burst and fired in the same order. With one more job than the cache holds, the first fire
misses, its save pushes out the next job to fire, whose fire misses in turn, and so on through
the whole burst. Measured at 5,000 jobs/s, jobs due 5 to 15 s after they were scheduled: 84 %
of the fires missed the FIFO cache (a RocksDB read and a decode, about 11 us each); ordered by
next fire, only the jobs beyond the bound miss.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

from jobwheel.streams.jobstate import JobRecord, JobStatus, Timers


class RecordCache:
    """Up to ``size`` decoded records by key, each with the timers it was saved with.

    :meth:`take` hands a record *out* (it leaves the cache; the caller changes it in place)
    and :meth:`keep` takes it back once saved, so the cache never holds a record that differs
    from what was last saved."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._records: dict[bytes, tuple[JobRecord, Timers]] = {}
        #: Keys of the kept records with a run in flight, oldest kept first.
        self._in_flight: OrderedDict[bytes, None] = OrderedDict()
        #: ``(-next fire ms, key)`` of the kept records waiting for a fire: the top is the one
        #: needed last. Entries of records taken or kept again since are skipped when met.
        self._waiting: list[tuple[int, bytes]] = []

    def __len__(self) -> int:
        return len(self._records)

    def take(self, key: bytes) -> tuple[JobRecord, Timers] | None:
        """The record and its timers, now the caller's (None: not kept)."""
        found = self._records.pop(key, None)
        if found is not None:
            self._in_flight.pop(key, None)
        return found

    def keep(self, key: bytes, job: JobRecord, timers: Timers) -> None:
        """``job`` was just saved with ``timers``: keep it if it will be read again soon."""
        self.take(key)
        if job.active:
            self._in_flight[key] = None
        elif job.status is JobStatus.ACTIVE and job.next_fire_ms is not None:
            heapq.heappush(self._waiting, (-job.next_fire_ms, key))
        else:
            return  # finished or paused: read again late, if at all
        self._records[key] = (job, timers)
        if len(self._waiting) > 2 * len(self._records) + 64:
            self._compact()
        if len(self._records) > self.size:
            self._evict()

    def clear(self) -> None:
        self._records.clear()
        self._in_flight.clear()
        self._waiting.clear()

    def _evict(self) -> None:
        """Let one record go: the one whose fire is furthest away, else the oldest in flight."""
        waiting = self._waiting
        while waiting:
            due, key = heapq.heappop(waiting)
            found = self._records.get(key)
            if found is not None and key not in self._in_flight and found[0].next_fire_ms == -due:
                del self._records[key]
                return
        if self._in_flight:
            key, _ = self._in_flight.popitem(last=False)
            del self._records[key]

    def _compact(self) -> None:
        """Drop the entries of records no longer waiting as they were kept (each take leaves
        one behind), so the heap stays within twice the records kept."""
        self._waiting = [
            (-job.next_fire_ms, key)
            for key, (job, _) in self._records.items()
            if key not in self._in_flight and job.next_fire_ms is not None
        ]
        heapq.heapify(self._waiting)
