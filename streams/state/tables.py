"""faust table-backed stores: writes through the table (so they reach the changelog), reads from
the partition's own RocksDB database.

faust has no public per-partition API. Its RocksDB store keeps one ``rocksdict.Rdict`` per
partition in the private ``table.data._dbs`` and opens it with ``_db_for_partition``; this module
is the only place that touches those private names (checked by
``tests/integration/test_scheduler*.py`` on every faust upgrade).

Writes must happen inside stream processing of an event from the same partition: faust writes
the changelog record to ``current_event().message.partition``. :func:`check_partition` makes a
wrong-partition write fail loudly instead of corrupting another partition's changelog.
"""

from __future__ import annotations

from typing import Any

import rocksdict
from faust import current_event

from jobwheel.errors import StateError
from streams.state.rocksdb import RocksDBKeyValueStore, RocksDBWheelStore


def partition_db(table: Any, partition: int) -> rocksdict.Rdict:
    """The RocksDB database faust keeps for ``partition`` of ``table`` (opened if needed)."""
    return table.data._db_for_partition(partition)


def check_partition(partition: int) -> None:
    event = current_event()
    if event is None or event.message.partition != partition:
        got = None if event is None else event.message.partition
        raise StateError(
            f"state write for partition {partition} outside its stream (current event partition "
            f"{got}); writes must happen while processing a record of that partition"
        )


class _WritesThroughTable:
    """Writes go through the faust table (and so reach the changelog); reads stay on the Rdict."""

    db: rocksdict.Rdict

    def __init__(self, table: Any, partition: int) -> None:
        self.db = partition_db(table, partition)
        self.table = table
        self.partition = partition

    def put(self, key: bytes, value: bytes) -> None:
        check_partition(self.partition)
        self.table[key] = value

    def delete(self, key: bytes) -> None:
        check_partition(self.partition)
        if self.db.get(key) is not None:  # no tombstone for a key that is not there
            del self.table[key]


class TableKeyValueStore(_WritesThroughTable, RocksDBKeyValueStore):
    """The ``jobs`` table of one partition."""


class TableWheelStore(_WritesThroughTable, RocksDBWheelStore):
    """The ``wheel`` table of one partition."""
