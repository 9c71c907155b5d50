"""Stores over RocksDB (rocksdict, raw mode: bytes in, bytes out, byte-ordered keys).

Each owned partition has one database with a column family per concern (see
:mod:`jobwheel.streams.state.partition`); these classes read and write one column family.

Memory: RocksDB's defaults are a 2 GiB block cache per database plus 3 x 64 MiB memtables per
column family; with a database per partition that is gigabytes of address space per process and
an RSS that grows with the number of partitions and jobs. :class:`RocksDBLimits` is the one place
the bounds are chosen, and :class:`RocksDBResources` shares ONE block cache and ONE memtable
budget (a write buffer manager charged to that cache) between every database of the process, so
memory stays flat whatever the number of partitions or pending jobs.

Durability: no write-ahead log. The changelog is the state's log and the database a cache of
it with a checkpoint, so RocksDB's own log only made every commit's batch be written twice
(Kafka Streams' stores write none either): a third of committing the state, measured
(``load.processor_bench --commit-every 25``). A process killed loses what RocksDB had not
flushed from its memtables yet, however old: a quiet partition flushes rarely, and the claim
rebuilds a state too old to catch up (``recovery.MAX_CHECKPOINT_AGE_MS``). Flushes are atomic
across the column families (``atomic_flush``), so what survives is the database as an earlier
batch left it, records, wheel entries and checkpoint together, and the next claim restores the
rest from the changelog. Without atomic flushes a column family could survive newer than
another (the records past the checkpoint, the wheels behind the records). A clean close flushes
everything. A manual flush would not keep that promise (it flushes one column family): none is
made.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import rocksdict

from jobwheel.streams.state.base import KeyValueStore, WheelStore

#: Every write of a database opened here: no write-ahead log (see the module doc).
_NO_LOG = rocksdict.WriteOptions()
_NO_LOG.disable_wal = True


@dataclass(frozen=True)
class RocksDBLimits:
    """Memory bounds for the scheduler's local state, per process.

    ``block_cache_bytes`` caps the LRU cache of uncompressed data blocks (reads), and of the
    tables' index and filter blocks, shared by every partition database; memtables are charged
    to the same cache and capped in total by ``total_write_buffer_bytes``;
    ``write_buffer_bytes`` is one memtable and ``max_write_buffers`` how many one column family
    may hold before writes wait for a flush.
    """

    block_cache_bytes: int = 64 * 1024 * 1024
    write_buffer_bytes: int = 4 * 1024 * 1024
    max_write_buffers: int = 2
    total_write_buffer_bytes: int = 32 * 1024 * 1024

    def resources(self) -> RocksDBResources:
        return RocksDBResources(self)

    def open(self, path: Path | str) -> rocksdict.Rdict:
        """A standalone raw-mode database with these bounds (tests, tools)."""
        return self.resources().open(path)


class RocksDBResources:
    """The block cache and memtable budget every database of a process shares."""

    def __init__(self, limits: RocksDBLimits) -> None:
        self.limits = limits
        self.cache = rocksdict.Cache(limits.block_cache_bytes)
        self.write_buffers = rocksdict.WriteBufferManager.new_write_buffer_manager_with_cache(
            limits.total_write_buffer_bytes, False, self.cache
        )

    def options(self, point_lookups: bool = False) -> rocksdict.Options:
        """Options of one column family. ``point_lookups``: keys are looked up one by one
        (the job records), and most lookups of a new job's id find nothing: whole-key bloom
        filters in the tables and the memtable let a miss skip them instead of searching
        each. Measured in a running scheduler without them: 10 us of CPU per lookup.
        """
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        options.set_atomic_flush(True)  # a database-wide option: see the module doc
        options.set_write_buffer_size(self.limits.write_buffer_bytes)
        options.set_max_write_buffer_number(self.limits.max_write_buffers)
        options.set_write_buffer_manager(self.write_buffers)
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(self.cache)
        # Index and filter blocks in the block cache, not on the heap beside it: held by each
        # open table they grow with the state (a day of retained jobs), unbounded by the
        # cache. Measured: 7.0 MiB outside the cache at 2 M records, 0.3 MiB with this; a
        # scheduler's RSS rose about 20 MiB over the last half of an hour at 2,000 jobs/s
        # with 1.46 GiB of state. Level 0's stay pinned (the hot, newest tables); a lookup
        # costs the same within noise (load/state_bench.py; BENCHMARKS.md).
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        if point_lookups:
            table.set_bloom_filter(10, False)  # ~1% false positives, full (not per block)
            options.set_memtable_prefix_bloom_ratio(0.02)
            options.set_memtable_whole_key_filtering(True)
        options.set_block_based_table_factory(table)
        return options

    def open(self, path: Path | str, column_families: Iterable[str] = ()) -> rocksdict.Rdict:
        """Open (creating if needed) a database and its column families; the default family
        holds point-looked-up records, the others are scanned."""
        families = {name: self.options() for name in column_families}
        db = rocksdict.Rdict(
            str(path), options=self.options(point_lookups=True), column_families=families or None
        )
        db.set_write_options(_NO_LOG)  # before its column families are taken: they inherit it
        return db


class RocksDBKeyValueStore(KeyValueStore):
    def __init__(self, db: rocksdict.Rdict) -> None:
        self.db = db

    def get(self, key: bytes) -> bytes | None:
        return self.db.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self.db.put(key, value)

    def delete(self, key: bytes) -> None:
        self.db.delete(key)


class RocksDBWheelStore(WheelStore):
    """Range scans with a RocksDB iterator bounded above by ``until_key``.

    The upper bound is set on the iterator itself (``iterate_upper_bound``), so RocksDB stops at
    the bound instead of stepping to the next live key past it (possibly across many tombstones).
    """

    def __init__(self, db: rocksdict.Rdict) -> None:
        self.db = db

    def put(self, key: bytes, value: bytes) -> None:
        self.db.put(key, value)

    def delete(self, key: bytes) -> None:
        self.db.delete(key)

    def scan(
        self, until_key: bytes, limit: int, from_key: bytes = b""
    ) -> list[tuple[bytes, bytes]]:
        if limit <= 0 or from_key >= until_key:
            return []
        return list(itertools.islice(self.items(until_key, from_key), limit))

    def first(self, from_key: bytes = b"") -> tuple[bytes, bytes] | None:
        for item in self.db.items(from_key=from_key):
            return item
        return None

    def items(self, until_key: bytes, from_key: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        read_opt = rocksdict.ReadOptions()
        read_opt.set_iterate_upper_bound(until_key)
        return self.db.items(from_key=from_key, read_opt=read_opt)  # type: ignore[no-any-return]
