"""Contract tests: every store implementation behaves the same (memory and real RocksDB).

The RocksDB databases are opened with small, explicit memory bounds (:class:`RocksDBLimits`:
1 MiB block cache, 1 MiB write buffers x 2) instead of RocksDB's 2 GiB-cache defaults, so many
tests running side by side stay small.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwheel.streams.state.base import KeyValueStore, WheelStore
from jobwheel.streams.state.memory import MemoryKeyValueStore, MemoryWheelStore
from jobwheel.streams.state.rocksdb import RocksDBKeyValueStore, RocksDBLimits, RocksDBWheelStore

LIMITS = RocksDBLimits(block_cache_bytes=1 << 20, write_buffer_bytes=1 << 20, max_write_buffers=2)


@pytest.fixture(params=["memory", "rocksdb"])
def kv(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KeyValueStore]:
    if request.param == "memory":
        yield MemoryKeyValueStore()
        return
    db = LIMITS.open(tmp_path / "kv.db")
    yield RocksDBKeyValueStore(db)
    db.close()


@pytest.fixture(params=["memory", "rocksdb"])
def wheel_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[WheelStore]:
    if request.param == "memory":
        yield MemoryWheelStore()
        return
    db = LIMITS.open(tmp_path / "wheel.db")
    yield RocksDBWheelStore(db)
    db.close()


def test_kv_get_put_delete(kv: KeyValueStore) -> None:
    assert kv.get(b"job-1") is None
    kv.put(b"job-1", b"v1")
    kv.put(b"job-1", b"v2")
    kv.put(b"job-2", b"\x00\xff")
    assert kv.get(b"job-1") == b"v2"
    assert kv.get(b"job-2") == b"\x00\xff"
    kv.delete(b"job-1")
    kv.delete(b"job-1")  # deleting twice (or a missing key) is fine
    kv.delete(b"never")
    assert kv.get(b"job-1") is None
    assert kv.get(b"job-2") == b"\x00\xff"


def test_wheel_store_scans_in_byte_order_below_the_bound(wheel_store: WheelStore) -> None:
    keys = [bytes([a, b]) for a in (3, 1, 2, 0) for b in (0xFF, 0x00, 0x80)]
    for key in keys:
        wheel_store.put(key, b"v" + key)
    got = wheel_store.scan(until_key=b"\x02\x80", limit=100)
    assert [k for k, _ in got] == sorted(k for k in keys if k < b"\x02\x80")
    assert all(v == b"v" + k for k, v in got)


def test_wheel_store_scan_limit_and_from_key(wheel_store: WheelStore) -> None:
    for i in range(10):
        wheel_store.put(bytes([i]), b"x")
    assert [k for k, _ in wheel_store.scan(b"\xff", 3)] == [b"\x00", b"\x01", b"\x02"]
    assert [k for k, _ in wheel_store.scan(b"\x06", 10, from_key=b"\x04")] == [b"\x04", b"\x05"]
    assert wheel_store.scan(b"\xff", 0) == []
    assert wheel_store.scan(b"\x03", 10, from_key=b"\x05") == []
    assert wheel_store.scan(b"\x00", 10) == []


def test_wheel_store_first_put_replace_delete(wheel_store: WheelStore) -> None:
    assert wheel_store.first() is None
    wheel_store.put(b"b", b"1")
    wheel_store.put(b"a", b"1")
    wheel_store.put(b"a", b"2")
    assert wheel_store.first() == (b"a", b"2")
    assert wheel_store.first(from_key=b"a\x00") == (b"b", b"1")
    assert wheel_store.first(from_key=b"c") is None
    wheel_store.delete(b"a")
    wheel_store.delete(b"a")
    wheel_store.delete(b"zzz")
    assert wheel_store.first() == (b"b", b"1")
    assert wheel_store.scan(b"z", 10) == [(b"b", b"1")]


def test_wheel_store_scan_result_survives_deleting_while_iterating(
    wheel_store: WheelStore,
) -> None:
    for i in range(5):
        wheel_store.put(bytes([i]), b"x")
    batch = wheel_store.scan(b"\xff", 10)
    for key, _ in batch:
        wheel_store.delete(key)
    assert len(batch) == 5
    assert wheel_store.first() is None


def test_rocksdb_store_is_durable_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "wheel.db"
    db = LIMITS.open(path)
    RocksDBWheelStore(db).put(b"\x00\x01", b"kept")
    RocksDBKeyValueStore(db).put(b"job", b"state")
    db.close()
    db = LIMITS.open(path)
    assert RocksDBWheelStore(db).first() == (b"\x00\x01", b"kept")
    assert RocksDBKeyValueStore(db).get(b"job") == b"state"
    db.close()


def test_memory_outside_the_block_cache_does_not_grow_with_the_state(tmp_path: Path) -> None:
    """The tables' index and filter blocks live in the bounded block cache: what the open
    tables hold beside it (RocksDB's own estimate) stays small as the records pile up, as a
    day of retained jobs does in a scheduler (on the heap they grew with it: 0.7 MiB at
    200,000 records, 7 MiB at 2 M)."""
    db = RocksDBLimits().open(tmp_path / "big.db")
    value = bytes(300)
    outside = []
    try:
        for round_ in range(2):
            for i in range(round_ * 100_000, (round_ + 1) * 100_000):
                db.put(f"job-{i:012d}".encode(), value)
            db.flush()
            outside.append(db.property_int_value("rocksdb.estimate-table-readers-mem"))
        assert db.get(b"job-000000199999") == value  # the records are there, and read
    finally:
        db.close()
    assert outside[1] < 128 * 1024, f"table readers hold {outside} bytes outside the cache"
