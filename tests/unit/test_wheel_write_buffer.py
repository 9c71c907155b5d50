"""The timing wheel over the transaction's write buffer, as the scheduler uses it: entries
put and removed in an open transaction, read back before it commits or aborts."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobwheel.streams.state.base import WheelStore
from jobwheel.streams.state.buffer import BufferedWheelStore
from jobwheel.streams.state.memory import MemoryWheelStore
from jobwheel.streams.state.rocksdb import RocksDBLimits, RocksDBWheelStore
from jobwheel.streams.wheel import TimingWheel, encode_key
from jobwheel.streams.wheel.entry import decode_due_ms, due_prefix

LIMITS = RocksDBLimits(block_cache_bytes=1 << 20, write_buffer_bytes=1 << 20, max_write_buffers=2)
T0 = 1_780_000_000_000


class _Counting(WheelStore):
    """A store that counts the rows its readers took from it."""

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


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_timers_fired_in_an_open_transaction_are_not_read_again_by_its_later_scans(
    kind: str, tmp_path: Path
) -> None:
    """A scheduler's transaction fires a few hundred timers, and between fires asks the wheel
    what is due next; the fired timers stay in the database, hidden by the write buffer, until
    the commit. Each read must start past them, or every scan of the transaction reads all of
    them again (a fifth of the scheduler's main thread at 5,000 fires a second)."""
    db = LIMITS.open(tmp_path / "wheel.db") if kind == "rocksdb" else None
    inner = _Counting(RocksDBWheelStore(db) if db is not None else MemoryWheelStore())
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
