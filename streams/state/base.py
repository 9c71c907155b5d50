"""The scheduler's persistence seams: a key-value store and a sorted wheel store, per partition.

Why two small ABCs instead of talking to faust tables directly:

- **Per partition.** One instance serves exactly ONE partition of a table. Kafka assigns the
  scheduler partitions, faust keeps one RocksDB database per partition (``<table>-<p>.db``) and
  writes the changelog to the partition of the event being processed, so a store that spans
  partitions would scan work this process does not own (or a standby's copy) and could not tell
  which changelog partition a write belongs to.
- **Writes go through the faust table, reads may not.** A write must reach the table's changelog
  topic, or a new owner restoring the partition after a rebalance would not see it; so the
  production implementation writes with ``table[key] = value`` / ``del table[key]`` inside the
  stream. faust has no public range scan per partition, but its RocksDB store keeps one
  ``rocksdict.Rdict`` per partition, so reads (``get``, the time-ordered ``scan``) may go straight
  to that database. :mod:`jobwheel.streams.state.rocksdb` implements both over a raw ``Rdict``;
  :mod:`jobwheel.streams.state.memory` is the test double with the same contract.
- **Raw bytes.** Keys and values are bytes so the on-disk order is the byte order: the wheel's
  keys start with an 8-byte big-endian due time, which makes "everything due by now" one prefix
  range scan on disk, and future jobs cost disk rather than RAM.

Both ABCs are synchronous: RocksDB calls are microseconds and faust agents call them inline.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


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
