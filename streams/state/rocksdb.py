"""Stores over a raw ``rocksdict.Rdict``: the per-partition database faust's RocksDB store keeps.

faust-streaming opens one ``Rdict`` per table partition (``table.data._dbs[p]``, raw mode: bytes
in, bytes out, byte-ordered keys). These classes read AND write that object directly; the
scheduler's faust glue subclasses them so that ``put``/``delete`` go through the table (and so
reach the changelog) while ``get``/``scan``/``first`` keep reading the Rdict.

Memory: RocksDB's defaults (and faust's) are a 2 GiB block cache per database plus 3 x 64 MiB
write buffers; with a database per partition per table that is gigabytes of address space per
process. :class:`RocksDBLimits` is the one place the bounds are chosen; use
:meth:`RocksDBLimits.faust_options` for a faust table's ``options=`` and
:meth:`RocksDBLimits.open` (tests, tools) for a standalone database with the same bounds.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rocksdict

from streams.state.base import KeyValueStore, WheelStore


@dataclass(frozen=True)
class RocksDBLimits:
    """Memory bounds for one partition database.

    ``block_cache_bytes`` caps the LRU cache of uncompressed data blocks (reads);
    ``write_buffer_bytes`` is the size of one memtable and ``max_write_buffers`` how many may
    exist before writes stall on a flush, so memtables use at most their product.
    """

    block_cache_bytes: int = 8 * 1024 * 1024
    write_buffer_bytes: int = 4 * 1024 * 1024
    max_write_buffers: int = 2

    def rdict_options(self) -> rocksdict.Options:
        """Options equivalent to faust's (raw mode, block-based table) with these bounds."""
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_write_buffer_size(self.write_buffer_bytes)
        options.set_max_write_buffer_number(self.max_write_buffers)
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(rocksdict.Cache(self.block_cache_bytes))
        options.set_block_based_table_factory(table)
        return options

    def faust_options(self) -> dict[str, Any]:
        """Keyword options for a faust table (``app.Table(..., options=...)``)."""
        return {
            "block_cache_size": self.block_cache_bytes,
            "write_buffer_size": self.write_buffer_bytes,
            "max_write_buffer_number": self.max_write_buffers,
        }

    def open(self, path: Path | str) -> rocksdict.Rdict:
        """Open (creating if needed) a raw-mode database at ``path`` with these bounds."""
        return rocksdict.Rdict(str(path), options=self.rdict_options())


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
        read_opt = rocksdict.ReadOptions()
        read_opt.set_iterate_upper_bound(until_key)
        items = self.db.items(from_key=from_key, read_opt=read_opt)
        return list(itertools.islice(items, limit))

    def first(self, from_key: bytes = b"") -> tuple[bytes, bytes] | None:
        for item in self.db.items(from_key=from_key):
            return item
        return None
