"""The timing wheel over the memory store and a real RocksDB database, driven by a manual clock;
and over the transaction's write buffer, as the scheduler uses it: entries put and removed in an
open transaction, read back before it commits or aborts."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import rocksdict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobwheel.clock import ManualClock
from jobwheel.errors import ValidationError
from jobwheel.streams.state.base import WheelStore
from jobwheel.streams.state.buffer import BufferedWheelStore
from jobwheel.streams.state.memory import MemoryWheelStore
from jobwheel.streams.state.rocksdb import RocksDBLimits, RocksDBWheelStore
from jobwheel.streams.wheel import ENTRY_VERSION, TimingWheel, WheelEntry, encode_key
from jobwheel.streams.wheel.entry import decode_due_ms, due_prefix

LIMITS = RocksDBLimits(block_cache_bytes=1 << 20, write_buffer_bytes=1 << 20, max_write_buffers=2)
T0 = 1_780_000_000_000  # 2026-05-28T20:26:40Z


@pytest.fixture(params=["memory", "rocksdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[WheelStore]:
    if request.param == "memory":
        yield MemoryWheelStore()
        return
    db = LIMITS.open(tmp_path / "wheel.db")
    yield RocksDBWheelStore(db)
    db.close()


@pytest.fixture
def wheel(store: WheelStore) -> TimingWheel:
    return TimingWheel(store)


def ids(entries: list[WheelEntry]) -> list[tuple[int, str, str]]:
    return [(e.due_ms - T0, e.job_id, e.tag) for e in entries]


def test_due_returns_entries_up_to_now_inclusive_in_time_order(wheel: TimingWheel) -> None:
    wheel.schedule(T0 + 300, "c", "fire")
    wheel.schedule(T0 + 100, "a", "fire")
    wheel.schedule(T0 + 200, "b", "fire")
    wheel.schedule(T0 + 201, "late", "fire")
    assert ids(wheel.due(T0 + 99, 10)) == []
    assert ids(wheel.due(T0 + 200, 10)) == [(100, "a", "fire"), (200, "b", "fire")]


def test_same_millisecond_entries_are_all_due_ordered_by_job_then_tag(
    wheel: TimingWheel,
) -> None:
    for job, tag in [("job-2", "fire"), ("job-1", "retry"), ("job-1", "fire"), ("job-10", "x")]:
        wheel.schedule(T0, job, tag)
    wheel.schedule(T0, "job-1", "visibility:1", b"attempt-1")
    assert ids(wheel.due(T0, 10)) == [
        (0, "job-1", "fire"),
        (0, "job-1", "retry"),
        (0, "job-1", "visibility:1"),
        (0, "job-10", "x"),
        (0, "job-2", "fire"),
    ]


def test_entry_carries_payload_and_key(wheel: TimingWheel) -> None:
    key = wheel.schedule(T0, "job-ü", "tag:with\x00nul", b"\x00\x01payload")
    [entry] = wheel.due(T0, 1)
    assert entry == WheelEntry(T0, "job-ü", "tag:with\x00nul", b"\x00\x01payload", key)
    assert key == encode_key(T0, "job-ü", "tag:with\x00nul")
    assert wheel.store.first() == (key, bytes([ENTRY_VERSION]) + b"\x00\x01payload")


def test_scheduling_the_same_entry_again_replaces_it(wheel: TimingWheel) -> None:
    wheel.schedule(T0, "job", "fire", b"old")
    wheel.schedule(T0, "job", "fire", b"new")
    assert [e.payload for e in wheel.due(T0, 10)] == [b"new"]


def test_cancel_removes_only_the_exact_entry(wheel: TimingWheel) -> None:
    wheel.schedule(T0 + 10, "job", "fire")
    wheel.schedule(T0 + 10, "job", "retry")
    wheel.schedule(T0 + 20, "job", "fire")
    wheel.cancel(T0 + 10, "job", "fire")
    wheel.cancel(T0 + 10, "other", "fire")  # not there: no error
    wheel.cancel(T0 + 99, "job", "fire")
    assert ids(wheel.due(T0 + 100, 10)) == [(10, "job", "retry"), (20, "job", "fire")]


def test_due_does_not_remove_until_the_caller_does(wheel: TimingWheel) -> None:
    for i in range(25):
        wheel.schedule(T0 + i, f"job-{i:02d}", "fire")
    first = wheel.due(T0 + 100, 10)
    assert [e.job_id for e in first] == [f"job-{i:02d}" for i in range(10)]
    # Not removed (the dispatch may have failed): the same batch comes back.
    assert wheel.due(T0 + 100, 10) == first
    for entry in first:
        wheel.remove(entry)
    second = wheel.due(T0 + 100, 10)
    assert [e.job_id for e in second] == [f"job-{i:02d}" for i in range(10, 20)]
    for entry in second:
        wheel.remove(entry)
    assert [e.job_id for e in wheel.due(T0 + 100, 10)] == [f"job-{i:02d}" for i in range(20, 25)]
    assert wheel.due(T0 + 100, 0) == []


def test_next_due_ms(wheel: TimingWheel) -> None:
    assert wheel.next_due_ms() is None
    wheel.schedule(T0 + 50, "b", "fire")
    wheel.schedule(T0 + 20, "a", "fire")
    assert wheel.next_due_ms() == T0 + 20
    wheel.cancel(T0 + 20, "a", "fire")
    assert wheel.next_due_ms() == T0 + 50
    wheel.cancel(T0 + 50, "b", "fire")
    assert wheel.next_due_ms() is None


def test_punctuating_with_a_manual_clock_fires_each_entry_once_in_order(
    wheel: TimingWheel,
) -> None:
    clock = ManualClock(T0)
    schedule = {"a": 120, "b": 50, "c": 50, "d": 1_000, "e": 0}
    for job, offset in schedule.items():
        wheel.schedule(T0 + offset, job, "fire")
    fired: list[tuple[int, str]] = []
    for _ in range(30):  # 30 punctuations of 50 ms, batches of at most 2
        for entry in wheel.due(clock.now_ms(), 2):
            fired.append((clock.now_ms() - T0, entry.job_id))
            wheel.remove(entry)
        clock.advance(50)
    assert fired == [(0, "e"), (50, "b"), (50, "c"), (150, "a"), (1000, "d")]


def test_entry_scheduled_in_the_past_is_found_after_later_scans(wheel: TimingWheel) -> None:
    # Scans remember where the wheel is empty; a late write below that point must still fire.
    wheel.schedule(T0 + 500, "later", "fire")
    assert wheel.due(T0 + 400, 10) == []
    assert wheel.next_due_ms() == T0 + 500
    wheel.schedule(T0 + 5, "retry-now", "retry")
    assert ids(wheel.due(T0 + 400, 10)) == [(5, "retry-now", "retry")]
    assert wheel.next_due_ms() == T0 + 5


def test_reset_floor_sees_entries_written_behind_the_wheels_back(store: WheelStore) -> None:
    wheel = TimingWheel(store)
    wheel.schedule(T0 + 100, "a", "fire")
    assert wheel.due(T0 + 50, 10) == []
    store.put(encode_key(T0 + 1, "restored", "fire"), bytes([ENTRY_VERSION]))
    wheel.reset_floor()
    assert ids(wheel.due(T0 + 50, 10)) == [(1, "restored", "fire")]


def test_unreadable_entries_are_skipped_not_deleted_and_do_not_stall(
    wheel: TimingWheel, caplog: pytest.LogCaptureFixture
) -> None:
    future = encode_key(T0 + 1, "from-a-newer-release", "fire")
    wheel.store.put(future, bytes([ENTRY_VERSION + 1]) + b"?")
    wheel.store.put(encode_key(T0 + 2, "no-version", "fire"), b"")
    wheel.store.put((T0 + 3).to_bytes(8, "big") + b"no-separator", bytes([ENTRY_VERSION]))
    wheel.schedule(T0 + 4, "good", "fire")
    with caplog.at_level(logging.ERROR):
        assert ids(wheel.due(T0 + 10, 1)) == [(4, "good", "fire")]
    assert "unreadable wheel entry" in caplog.text
    assert wheel.store.first() == (future, bytes([ENTRY_VERSION + 1]) + b"?")


def test_invalid_job_id_or_due_time_is_a_validation_error(wheel: TimingWheel) -> None:
    with pytest.raises(ValidationError) as err:
        wheel.schedule(T0, "bad\x00id", "fire")
    assert err.value.field == "job_id"
    with pytest.raises(ValidationError) as err:
        wheel.schedule(-1, "job", "fire")
    assert err.value.field == "due_ms"


def test_rocksdb_wheel_survives_reopen(tmp_path: Path) -> None:
    db = LIMITS.open(tmp_path / "wheel.db")
    TimingWheel(RocksDBWheelStore(db)).schedule(T0, "job", "fire", b"p")
    db.close()
    db = LIMITS.open(tmp_path / "wheel.db")
    assert ids(TimingWheel(RocksDBWheelStore(db)).due(T0, 10)) == [(0, "job", "fire")]
    db.close()


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


class _CountingStore(WheelStore):
    """Counts the rows the wheel (or a write buffer over the store) pulls out of it."""

    def __init__(self, inner: WheelStore) -> None:
        self.inner = inner
        self.rows = 0

    def put(self, key: bytes, value: bytes) -> None:
        self.inner.put(key, value)

    def delete(self, key: bytes) -> None:
        self.inner.delete(key)

    def scan(
        self, until_key: bytes, limit: int, from_key: bytes = b""
    ) -> list[tuple[bytes, bytes]]:
        rows = self.inner.scan(until_key, limit, from_key)
        self.rows += len(rows)
        return rows

    def first(self, from_key: bytes = b"") -> tuple[bytes, bytes] | None:
        row = self.inner.first(from_key)
        self.rows += row is not None
        return row

    def items(self, until_key: bytes, from_key: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        for row in self.inner.items(until_key, from_key):
            self.rows += 1
            yield row


def test_a_million_entries_live_on_disk_and_due_reads_only_the_batch(tmp_path: Path) -> None:
    db = LIMITS.open(tmp_path / "wheel.db")
    rss_before = _rss_mib()
    batch = rocksdict.WriteBatch(raw_mode=True)
    value = bytes([ENTRY_VERSION])
    for i in range(1_000_000):
        batch.put(encode_key(T0 + i * 10, f"job-{i:07d}", "fire"), value)
        if i % 50_000 == 49_999:
            db.write(batch)
            batch = rocksdict.WriteBatch(raw_mode=True)
    db.write(batch)
    store = _CountingStore(RocksDBWheelStore(db))
    wheel = TimingWheel(store)

    due = wheel.due(T0 + 10 * 199, 100)
    assert [e.job_id for e in due] == [f"job-{i:07d}" for i in range(100)]
    for entry in due:
        wheel.remove(entry)
    due = wheel.due(T0 + 10 * 199, 1000)
    assert [e.job_id for e in due] == [f"job-{i:07d}" for i in range(100, 200)]
    assert store.rows == 200  # never more than what was due
    assert wheel.next_due_ms() == T0 + 1000
    assert ids(wheel.due(T0 + 10 * 999_999, 1)) == [(1000, "job-0000100", "fire")]

    # The keys alone would take > 60 MiB as Python bytes objects; RocksDB with 1 MiB cache and
    # write buffers keeps the process far below that (measured: ~11 MiB of growth).
    grown = _rss_mib() - rss_before
    assert grown < 48, f"RSS grew {grown:.0f} MiB for a million on-disk entries"
    db.close()


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_timers_fired_in_an_open_transaction_are_not_read_again_by_its_later_scans(
    kind: str, tmp_path: Path
) -> None:
    """A scheduler's transaction fires a few hundred timers, and between fires asks the wheel
    what is due next; the fired timers stay in the database, hidden by the write buffer, until
    the commit. Each read must start past them, or every scan of the transaction reads all of
    them again (a fifth of the scheduler's main thread at 5,000 fires a second)."""
    db = LIMITS.open(tmp_path / "wheel.db") if kind == "rocksdb" else None
    inner = _CountingStore(RocksDBWheelStore(db) if db is not None else MemoryWheelStore())
    for i in range(2000):
        TimingWheel(inner).schedule(T0 + i, f"job-{i:04d}", "fire")
    inner.rows = 0
    wheel = TimingWheel(BufferedWheelStore(inner))

    fired: list[str] = []
    for step in range(100):
        now = T0 + 10 * step + 9
        due = wheel.due(now, 1000)
        assert [e.due_ms for e in due] == list(range(now - 9, now + 1))
        for entry in due:
            wheel.remove(entry)
            fired.append(entry.job_id)
        assert wheel.next_due_ms() == now + 1  # asked once per loop iteration

    assert fired == [f"job-{i:04d}" for i in range(1000)]
    # Each iteration read its 10 due rows (the scan's upper bound ends it there) and the one
    # next_due_ms found: 11 rows, not the transaction's fired timers again.
    assert inner.rows == 100 * 11
    left = [key for key, _ in wheel.store.items(b"\xff" * 9)]  # read in chunks of 256
    assert left == [encode_key(T0 + i, f"job-{i:04d}", "fire") for i in range(1000, 2000)]
    if db is not None:
        db.close()


def test_an_entry_put_between_entries_already_read_is_not_skipped_when_they_are_removed() -> None:
    """A scan read A, B and C; a command then schedules X between A and B, and the fires of
    A and B are removed. The wheel may move its floor past each removed entry only while
    nothing live lies before it: X must still come due (a job scheduled while its neighbours
    fire would otherwise never run)."""
    wheel = TimingWheel(BufferedWheelStore(MemoryWheelStore()))
    for due in (1, 3, 5):
        wheel.schedule(T0 + due, "job", "fire")
    assert [e.due_ms - T0 for e in wheel.due(T0 + 10, 10)] == [1, 3, 5]

    wheel.schedule(T0 + 2, "job", "fire")
    wheel.cancel(T0 + 1, "job", "fire")
    wheel.cancel(T0 + 3, "job", "fire")

    assert wheel.next_due_ms() == T0 + 2
    assert [e.due_ms - T0 for e in wheel.due(T0 + 10, 10)] == [2, 5]


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 12), st.integers(0, 2)),
        st.tuples(st.just("remove"), st.integers(0, 12), st.integers(0, 2)),
        st.tuples(st.just("remove_nth"), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("due"), st.integers(0, 12), st.integers(1, 6)),
        st.tuples(st.just("fire"), st.integers(0, 12), st.integers(1, 6)),
        st.tuples(st.just("next"), st.just(0), st.just(0)),
        st.tuples(st.just("commit"), st.just(0), st.just(0)),
        st.tuples(st.just("abort"), st.just(0), st.just(0)),
    ),
    max_size=80,
)


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS)
def test_the_wheel_over_its_write_buffer_reads_what_was_written_whatever_the_order(
    kind: str, ops: list[tuple[str, int, int]]
) -> None:
    """Any mix of puts, removals (of any key, or of one of the earliest), scans, fires (a scan
    whose entries are then removed, as a punctuation does), commits and aborts reads exactly
    what a plain sorted map says: nothing due is skipped and nothing removed comes back,
    however the floor moved in between."""
    with tempfile.TemporaryDirectory() as tmp:
        db = LIMITS.open(Path(tmp) / "wheel.db") if kind == "rocksdb" else None
        inner = RocksDBWheelStore(db) if db is not None else MemoryWheelStore()
        buffer = BufferedWheelStore(inner)
        wheel = TimingWheel(buffer)
        committed: set[bytes] = set()
        live: set[bytes] = set()

        def key(due: int, job: int) -> bytes:
            return encode_key(T0 + due, f"job-{job}", "fire")

        for op, a, b in ops:
            if op == "put":
                wheel.insert(key(a, b))
                live.add(key(a, b))
            elif op == "remove":
                wheel.discard(key(a, b))
                live.discard(key(a, b))
            elif op == "remove_nth":  # the a-th earliest: how fired timers leave
                ordered = sorted(live)
                if a < len(ordered):
                    wheel.discard(ordered[a])
                    live.discard(ordered[a])
            elif op in ("due", "fire"):
                until = due_prefix(T0 + a + 1)
                expected = sorted(k for k in live if k < until)[:b]
                got = wheel.due(T0 + a, b)
                assert [e.key for e in got] == expected
                if op == "fire":
                    for entry in got:
                        wheel.remove(entry)
                        live.discard(entry.key)
            elif op == "next":
                want = decode_due_ms(min(live)) if live else None
                assert wheel.next_due_ms() == want
            elif op == "commit":
                buffer.commit()
                committed = set(live)
            else:  # abort: the partition's discard
                buffer.discard()
                wheel.reset_floor()
                live = set(committed)
        assert [k for k, _ in buffer.scan(b"\xff" * 9, 1000)] == sorted(live)
        assert [k for k, _ in buffer.items(b"\xff" * 9)] == sorted(live)
        if db is not None:
            db.close()
