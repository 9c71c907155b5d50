"""Write buffers over the state stores: the uncommitted changes of the current transaction.

The scheduler handles a batch of records and punctuations, reading what it just wrote, and
commits the state changes together with the output records and the consumed offsets in one
Kafka transaction. Until that transaction commits, the changes live only here: if it aborts,
:meth:`discard` forgets them and the batch is processed again from the committed state; once it
commits, the partition writes :attr:`pending` to its local database in one atomic batch.
"""

from __future__ import annotations

from jobwheel.streams.state.base import KeyValueStore, WheelStore

_DELETED = None


class BufferedKeyValueStore(KeyValueStore):
    """Reads see buffered writes; :attr:`pending` is what changed (None: deleted)."""

    def __init__(self, inner: KeyValueStore) -> None:
        self.inner = inner
        self.pending: dict[bytes, bytes | None] = {}

    def get(self, key: bytes) -> bytes | None:
        if key in self.pending:
            return self.pending[key]
        return self.inner.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self.pending[key] = value

    def delete(self, key: bytes) -> None:
        self.pending[key] = _DELETED

    def commit(self) -> int:
        """Apply the changes to the inner store one by one (stores without atomic batches)."""
        n = len(self.pending)
        for key, value in self.pending.items():
            if value is None:
                self.inner.delete(key)
            else:
                self.inner.put(key, value)
        self.pending.clear()
        return n

    def discard(self) -> None:
        self.pending.clear()


class BufferedWheelStore(WheelStore):
    """The wheel's counterpart: scans merge the inner store with the buffered puts/deletes."""

    def __init__(self, inner: WheelStore) -> None:
        self.inner = inner
        self.pending: dict[bytes, bytes | None] = {}

    def put(self, key: bytes, value: bytes) -> None:
        self.pending[key] = value

    def delete(self, key: bytes) -> None:
        self.pending[key] = _DELETED

    def scan(
        self, until_key: bytes, limit: int, from_key: bytes = b""
    ) -> list[tuple[bytes, bytes]]:
        if not self.pending:
            return self.inner.scan(until_key, limit, from_key)
        deleted = sum(1 for v in self.pending.values() if v is None)
        base = self.inner.scan(until_key, limit + deleted, from_key)
        merged = {k: v for k, v in base if k not in self.pending}
        for key, value in self.pending.items():
            if value is not None and from_key <= key < until_key:
                merged[key] = value
        keys = sorted(merged)[:limit]
        return [(k, merged[k]) for k in keys]

    def first(self, from_key: bytes = b"") -> tuple[bytes, bytes] | None:
        found = self.scan(b"\xff" * 9, 1, from_key)
        return found[0] if found else None

    def commit(self) -> int:
        n = len(self.pending)
        for key in sorted(self.pending):
            value = self.pending[key]
            if value is None:
                self.inner.delete(key)
            else:
                self.inner.put(key, value)
        self.pending.clear()
        return n

    def discard(self) -> None:
        self.pending.clear()
