"""The scheduler's persistence seams: a key-value store and a sorted wheel store, per partition.

Why two small ABCs instead of RocksDB calls in the rules:

- **Per partition.** One instance serves exactly ONE partition: Kafka assigns partitions, each
  has its own RocksDB database (column families ``jobs``, ``timers``, ``deadlines``, ``meta``)
  and its own changelog partition, so a store never scans work this process does not own, and
  a partition moves, restores or becomes a standby copy on its own.
- **Writes are buffered, then applied after the commit.** The rules read and write through
  :mod:`jobwheel.streams.state.buffer`; the engine puts each change on the changelog inside the
  iteration's Kafka transaction and applies the buffer to RocksDB in one write batch only once
  that transaction committed (an abort discards it). :mod:`jobwheel.streams.state.rocksdb`
  implements both ABCs over a column family; :mod:`jobwheel.streams.state.memory` is the test
  double with the same contract.
- **Raw bytes.** Keys and values are bytes so the on-disk order is the byte order: the wheel's
  keys start with an 8-byte big-endian due time, which makes "everything due by now" one prefix
  range scan on disk, and future jobs cost disk rather than RAM.

Both ABCs are synchronous: RocksDB calls take microseconds and the engine's loop calls them
inline.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator


class KeyValueStore(ABC):
    """Point lookups for one partition (the ``jobs`` table: job id -> versioned job state)."""

    @abstractmethod
    def get(self, key: bytes) -> bytes | None:
        """The value stored under ``key``, or None."""

    @abstractmethod
    def put(self, key: bytes, value: bytes) -> None:
        """Store ``value`` under ``key`` (replacing any previous value)."""

    @abstractmethod
    def delete(self, key: bytes) -> None:
        """Remove ``key``; removing a missing key is not an error (tombstones are idempotent)."""


class WheelStore(ABC):
    """A byte-ordered map for one partition, read in ascending key order.

    The timing wheel keeps its entries here; the key order IS the schedule order. ``from_key``
    lets the caller skip a prefix it knows is empty: on RocksDB, deleted keys stay as tombstones
    until compaction and a scan that starts at the very beginning walks over all of them (tens of
    milliseconds after a few hundred thousand fires), while a seek past them costs microseconds.
    """

    @abstractmethod
    def put(self, key: bytes, value: bytes) -> None:
        """Store ``value`` under ``key`` (replacing any previous value)."""

    @abstractmethod
    def delete(self, key: bytes) -> None:
        """Remove ``key``; removing a missing key is not an error."""

    @abstractmethod
    def scan(
        self, until_key: bytes, limit: int, from_key: bytes = b""
    ) -> list[tuple[bytes, bytes]]:
        """At most ``limit`` pairs with ``from_key <= key < until_key``, ascending by key.

        Returns a list (not an iterator) so that the caller may delete what it read while it
        works through the batch without invalidating a live database iterator.
        """

    @abstractmethod
    def first(self, from_key: bytes = b"") -> tuple[bytes, bytes] | None:
        """The smallest pair with ``key >= from_key``, or None when there is none."""

    @abstractmethod
    def items(self, until_key: bytes, from_key: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """The pairs with ``from_key <= key < until_key``, ascending, read as they are asked
        for: a caller that skips keys (a write buffer's) stops as soon as it has enough,
        where :meth:`scan` must guess a limit. Not to be held across writes to the store."""
