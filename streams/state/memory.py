"""In-memory stores with the same contract as the RocksDB ones, for unit tests and tools.

Not for production: a process restart loses everything, and a dict-per-table is exactly what
the research notes warn about for faust's own memory store (standby data lands in it too).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from jobwheel.streams.state.base import KeyValueStore, WheelStore


class MemoryKeyValueStore(KeyValueStore):
    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self._data[bytes(key)] = bytes(value)

    def delete(self, key: bytes) -> None:
        self._data.pop(key, None)

    def __len__(self) -> int:
        return len(self._data)

    def items(self) -> list[tuple[bytes, bytes]]:
        return list(self._data.items())

    def clear(self) -> None:
        self._data.clear()


class MemoryWheelStore(WheelStore):
    """A sorted key list (bisect) beside a dict: O(log n) seek, O(n) insert, fine for tests."""

    def __init__(self) -> None:
        self._keys: list[bytes] = []
        self._values: dict[bytes, bytes] = {}

    def put(self, key: bytes, value: bytes) -> None:
        key = bytes(key)
        if key not in self._values:
            bisect.insort(self._keys, key)
        self._values[key] = bytes(value)

    def delete(self, key: bytes) -> None:
        if self._values.pop(key, None) is not None:
            index = bisect.bisect_left(self._keys, key)
            del self._keys[index]

    def scan(
        self, until_key: bytes, limit: int, from_key: bytes = b""
    ) -> list[tuple[bytes, bytes]]:
        if limit <= 0:
            return []
        start = bisect.bisect_left(self._keys, from_key)
        stop = bisect.bisect_left(self._keys, until_key, lo=start)
        return [(k, self._values[k]) for k in self._keys[start : min(stop, start + limit)]]

    def first(self, from_key: bytes = b"") -> tuple[bytes, bytes] | None:
        index = bisect.bisect_left(self._keys, from_key)
        if index == len(self._keys):
            return None
        key = self._keys[index]
        return key, self._values[key]

    def items(self, until_key: bytes, from_key: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        start = bisect.bisect_left(self._keys, from_key)
        stop = bisect.bisect_left(self._keys, until_key, lo=start)
        for key in self._keys[start:stop]:
            yield key, self._values[key]

    def __len__(self) -> int:
        return len(self._keys)

    def clear(self) -> None:
        self._keys.clear()
        self._values.clear()
