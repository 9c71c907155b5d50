"""The timing wheel: a time-ordered index of upcoming fires kept in a :class:`WheelStore`.

"Wheel" in the Kafka Streams / Netty sense of "what is due next", but stored as one sorted
key range on disk instead of in-memory slots: a job due in a year costs a RocksDB key, not RAM.
The scheduler keeps it as an index derived from its job records (see
:mod:`jobwheel.streams.state.partition`), rebuilt from them after a restore.

Pure: no clock, no Kafka. The punctuator passes ``now_ms`` in (wall-clock punctuation),
so tests drive it with :class:`jobwheel.clock.ManualClock`.

:meth:`TimingWheel.due` only reads; entries leave the wheel when the caller removes them (or,
in the scheduler, when the record that derives them changes).
"""

from __future__ import annotations

import bisect
import logging

from jobwheel.errors import StateError
from jobwheel.streams.state.base import WheelStore
from jobwheel.streams.wheel.entry import (
    WheelEntry,
    decode_due_ms,
    decode_entry,
    due_prefix,
    encode_key,
    encode_value,
)

log = logging.getLogger(__name__)


class TimingWheel:
    """Schedule, cancel and collect due entries of ONE partition's wheel store.

    The wheel remembers a *floor*: a key below which it knows the store holds nothing. Every
    scan starts there. Without it, each tick would seek from the very first key and, on RocksDB,
    step over every tombstone left by fires removed since the last compaction (measured: ~50 ms
    per scan after 200k removals, ~50 us with the floor). Beside the floor it keeps the live
    keys a read found above it, in order, so the earliest is known without a read, and
    removing it moves the floor past it. The floor is only correct if every
    write to the store goes through this object and stays written. Call :meth:`reset_floor`
    after the store changed some other way: changelog recovery into an existing store, or a
    write buffer discarded after :meth:`due`/:meth:`next_due_ms` already saw its deletions
    (the "deleted" entries are back but may lie below the floor).
    """

    def __init__(self, store: WheelStore) -> None:
        self.store = store
        self._floor = b""
        #: The live keys from the floor up, as far as a read found them and the writes since
        #: kept them: ``_ahead[_ahead_at:]``, in order, nothing live between the floor and the
        #: first nor between one and the next. So the earliest entry is known without a read
        #: (the engine asks every partition's two wheels on every loop iteration, and opening
        #: a database iterator costs more than what it reads), and removing the first moves
        #: the floor past it: the fires of an open transaction stay in the store, hidden by
        #: its write buffer, until the commit, and each read would step over them again.
        self._ahead: list[bytes] = []
        self._ahead_at = 0

    def schedule(self, due_ms: int, job_id: str, tag: str, payload: bytes = b"") -> bytes:
        """Add (or replace) the entry ``(due_ms, job_id, tag)``; returns its key."""
        key = encode_key(due_ms, job_id, tag)
        self.insert(key, payload)
        return key

    def insert(self, key: bytes, payload: bytes = b"") -> None:
        """Add an entry by its encoded key (:func:`~jobwheel.streams.wheel.entry.entry_key`)."""
        self.store.put(key, encode_value(payload))
        ahead = self._ahead
        at = self._ahead_at
        if at < len(ahead) and key <= ahead[-1]:  # among the known: it joins them
            i = bisect.bisect_left(ahead, key, at)
            if ahead[i] != key:
                ahead.insert(i, key)
        if key < self._floor:
            self._floor = key

    def discard(self, key: bytes) -> None:
        """Remove an entry by its encoded key, if present."""
        self.store.delete(key)
        ahead = self._ahead
        at = self._ahead_at
        if at < len(ahead) and key <= ahead[-1]:
            i = bisect.bisect_left(ahead, key, at)
            if ahead[i] != key:
                return
            if i == at:  # the earliest is gone: nothing is live up to and with it
                self._floor = key + b"\x00"
                self._ahead_at = at + 1
            else:
                del ahead[i]

    def cancel(self, due_ms: int, job_id: str, tag: str) -> None:
        """Remove the entry if present. The caller must know its due time (keep it in job state)."""
        self.discard(encode_key(due_ms, job_id, tag))

    def remove(self, entry: WheelEntry) -> None:
        """Remove an entry returned by :meth:`due`, once it has been dispatched."""
        self.discard(entry.key)

    def due(self, now_ms: int, limit: int) -> list[WheelEntry]:
        """Up to ``limit`` entries with ``due_ms <= now_ms``, earliest first. Nothing is removed.

        Records this build cannot read (unknown version, malformed key) are logged and skipped,
        not deleted: a newer release may still need them, and one bad record must not stall the
        partition.
        """
        if limit <= 0:
            return []
        until = due_prefix(now_ms + 1) if now_ms >= 0 else b""
        if self._ahead_at < len(self._ahead) and self._ahead[self._ahead_at] >= until:
            return []  # the earliest entry is not due yet
        entries: list[WheelEntry] = []
        start = self._floor
        seen: list[bytes] = []
        while len(entries) < limit:
            wanted = limit - len(entries)
            batch = self.store.scan(until, wanted, from_key=start)
            if not batch:
                break
            for key, value in batch:
                seen.append(key)
                try:
                    entries.append(decode_entry(key, value))
                except StateError as exc:
                    log.error("unreadable wheel entry skipped", extra={"error": str(exc)})
            if len(batch) < wanted:
                break
            start = batch[-1][0] + b"\x00"
        # Nothing lives below the first key we saw (or below ``until`` if we saw none), and
        # the keys seen are the live ones from there, in order.
        if seen:
            self._floor = seen[0]
            self._ahead, self._ahead_at = seen, 0
        else:
            self._floor = max(self._floor, until)
            self._ahead, self._ahead_at = [], 0
        return entries

    def next_due_ms(self) -> int | None:
        """The due time of the earliest entry, or None if the wheel is empty."""
        if self._ahead_at < len(self._ahead):
            return decode_due_ms(self._ahead[self._ahead_at])
        first = self.store.first(from_key=self._floor)
        if first is None:
            return None
        key = first[0]
        self._floor = key
        self._ahead, self._ahead_at = [key], 0
        return decode_due_ms(key)

    def reset_floor(self) -> None:
        """Forget what is known to be empty (after the store was written behind our back)."""
        self._floor = b""
        self._ahead, self._ahead_at = [], 0
