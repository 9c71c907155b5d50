"""Write buffers over the state stores: the scheduler's "dispatch first, then state" rule.

A punctuation decides a batch of fires and changes job state as it goes (reading what it just
wrote). Those writes must not reach the store, and so the changelog, until the runs they
describe are committed on the runs topic: if the dispatch fails (a broker error, or this owner
was fenced by a newer one) the batch is discarded and the same due entries are found again on
the next punctuation. If the process dies after the dispatch but before the writes, the new
owner fires the same runs again with the same run ids (at-least-once; workers and the status
sink dedupe by run id and attempt).
"""

from __future__ import annotations

from streams.state.base import KeyValueStore, WheelStore

_DELETED = None


class BufferedKeyValueStore(KeyValueStore):
    """Reads see buffered writes; :meth:`commit` applies them to the inner store in order."""

    def __init__(self, inner: KeyValueStore) -> None:
        self.inner = inner
        self._pending: dict[bytes, bytes | None] = {}

    def get(self, key: bytes) -> bytes | None:
        if key in self._pending:
            return self._pending[key]
        return self.inner.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self._pending[key] = value

    def delete(self, key: bytes) -> None:
        self._pending[key] = _DELETED

    def commit(self) -> int:
        n = len(self._pending)
        for key, value in self._pending.items():
            if value is None:
                self.inner.delete(key)
            else:
                self.inner.put(key, value)
        self._pending.clear()
        return n

    def discard(self) -> None:
        self._pending.clear()


class BufferedWheelStore(WheelStore):
    """The wheel's counterpart: scans merge the inner store with the buffered puts/deletes."""

    def __init__(self, inner: WheelStore) -> None:
        self.inner = inner
        self._pending: dict[bytes, bytes | None] = {}

    def put(self, key: bytes, value: bytes) -> None:
        self._pending[key] = value

    def delete(self, key: bytes) -> None:
        self._pending[key] = _DELETED

    def scan(
        self, until_key: bytes, limit: int, from_key: bytes = b""
    ) -> list[tuple[bytes, bytes]]:
        if not self._pending:
            return self.inner.scan(until_key, limit, from_key)
        deleted = sum(1 for v in self._pending.values() if v is None)
        base = self.inner.scan(until_key, limit + deleted, from_key)
        merged = {k: v for k, v in base if k not in self._pending}
        for key, value in self._pending.items():
            if value is not None and from_key <= key < until_key:
                merged[key] = value
        keys = sorted(merged)[:limit]
        return [(k, merged[k]) for k in keys]

    def first(self, from_key: bytes = b"") -> tuple[bytes, bytes] | None:
        found = self.scan(b"\xff" * 9, 1, from_key)
        return found[0] if found else None

    def commit(self) -> int:
        n = len(self._pending)
        for key in sorted(self._pending):
            value = self._pending[key]
            if value is None:
                self.inner.delete(key)
            else:
                self.inner.put(key, value)
        self._pending.clear()
        return n

    def discard(self) -> None:
        self._pending.clear()
