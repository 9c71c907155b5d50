"""Avro binary for *flat* records, in plain Python, several times faster than fastavro's
per-message calls.

``Run`` and ``StatusEvent`` are flat: every field is a string, int, long, boolean, enum or a
``["null", T]`` union of those. Workers encode and decode one of them per run and the status sink
decodes five per job, and at those rates fastavro's per-call set-up (a stream object, schema
lookups, a dict per record) costs more than the encoding itself. :class:`FlatRecord` is compiled
once from a parsed schema and reads or writes a list of field values directly.

It is a fast path, not a second codec: :class:`jobwheel.schemas.codec.Codec` uses it only for
values and bytes it handles exactly, and falls back to fastavro for anything else (a value of the
wrong type, bytes it refuses), so results and error messages stay fastavro's. Its decoder is the
stricter of the two (int and long ranges, UTF-8, no trailing bytes);
``tests/unit/test_flat_codec.py`` holds it to byte-identical results with fastavro on valid records
and random bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Field kinds. A union with null adds _NULLABLE; the value's own kind is the low bits.
# The first four start with a zigzag varint.
_STRING, _LONG, _INT, _ENUM, _BOOL, _NULL = range(6)
_NULLABLE = 8

_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_LONG_RANGE = (_LONG_MIN, _LONG_MAX)
_PRIMITIVES = {"string": _STRING, "long": _LONG, "int": _INT, "boolean": _BOOL, "null": _NULL}


class FlatError(ValueError):
    """Bytes or values the fast path does not handle; the caller falls back to fastavro."""


def _kind(schema: Any) -> tuple[int, tuple[str, ...] | None] | None:
    """(kind, enum symbols) of a field type, or None when it is not flat."""
    if isinstance(schema, str):
        kind = _PRIMITIVES.get(schema)
        return None if kind is None else (kind, None)
    if isinstance(schema, dict):
        if schema.get("type") == "enum":
            return _ENUM, tuple(schema["symbols"])
        if schema.get("type") in _PRIMITIVES and len(schema) == 1:
            return _PRIMITIVES[schema["type"]], None
        return None
    if isinstance(schema, list) and len(schema) == 2 and schema[0] == "null":
        inner = _kind(schema[1])
        if inner is None or inner[0] == _NULL:
            return None
        return inner[0] | _NULLABLE, inner[1]
    return None


class FlatRecord:
    """Reader and writer of one flat record schema; build with :meth:`compile`."""

    __slots__ = ("names", "_kinds", "_symbols", "_index", "_fields")

    def __init__(
        self, names: tuple[str, ...], kinds: tuple[int, ...], symbols: tuple[Any, ...]
    ) -> None:
        self.names = names
        self._kinds = kinds
        self._symbols = symbols  # per field: enum symbols or None
        self._index = tuple(
            None if s is None else {name: i for i, name in enumerate(s)} for s in symbols
        )
        self._fields = tuple(zip(kinds, symbols, strict=True))

    @classmethod
    def compile(cls, parsed: Any) -> FlatRecord | None:
        """The codec for a (fastavro-parsed) record schema, or None when it is not flat."""
        if not isinstance(parsed, dict) or parsed.get("type") != "record":
            return None
        names, kinds, symbols = [], [], []
        for f in parsed["fields"]:
            kind = _kind(f["type"])
            if kind is None:
                return None
            names.append(f["name"])
            kinds.append(kind[0])
            symbols.append(kind[1])
        return cls(tuple(names), tuple(kinds), tuple(symbols))

    # --- decode ---------------------------------------------------------------------------

    def decode(self, data: bytes, pos: int = 0) -> list[Any]:
        """Field values in schema order from the Avro body at ``data[pos:]`` (enums as their
        symbol strings). Raises :class:`FlatError` for anything it will not vouch for."""
        out: list[Any] = []
        append = out.append
        size = len(data)
        try:
            for kind, syms in self._fields:
                if kind >= _NULLABLE:
                    b = data[pos]
                    pos += 1
                    if b == 0:
                        append(None)
                        continue
                    if b != 2:  # zigzag 1: the second branch
                        raise FlatError(f"union branch byte {b}")
                    kind -= _NULLABLE
                if kind <= _ENUM:  # string, long, int, enum: a zigzag varint first
                    b = data[pos]
                    pos += 1
                    if b < 0x80:
                        n = (b >> 1) ^ -(b & 1)
                    else:
                        n = b & 0x7F
                        shift = 7
                        while True:
                            b = data[pos]
                            pos += 1
                            n |= (b & 0x7F) << shift
                            if b < 0x80:
                                break
                            shift += 7
                            if shift > 63:
                                raise FlatError("varint longer than 10 bytes")
                        n = (n >> 1) ^ -(n & 1)
                        if shift >= 28 and kind != _STRING:  # only long varints can overflow
                            low, high = (_INT_MIN, _INT_MAX) if kind != _LONG else _LONG_RANGE
                            if n < low or n > high:
                                raise FlatError("integer out of range")
                    if kind == _STRING:
                        if n < 0:
                            raise FlatError("negative string length")
                        end = pos + n
                        if end > size:
                            raise FlatError("string past the end")
                        append(data[pos:end].decode("utf-8"))
                        pos = end
                    elif kind == _ENUM:
                        if n < 0 or n >= len(syms):
                            raise FlatError(f"enum index {n}")
                        append(syms[n])
                    else:
                        append(n)
                elif kind == _BOOL:
                    b = data[pos]
                    pos += 1
                    if b > 1:
                        raise FlatError(f"boolean byte {b}")
                    append(b == 1)
                else:  # null
                    append(None)
        except IndexError:
            raise FlatError("truncated") from None
        except UnicodeDecodeError:
            raise FlatError("string is not UTF-8") from None
        if pos != size:
            raise FlatError(f"{size - pos} trailing bytes")
        return out

    # --- encode ---------------------------------------------------------------------------

    def encode(self, values: Sequence[Any], out: bytearray) -> None:
        """Append the Avro body of ``values`` (schema order; enums as symbol strings) to ``out``.
        Raises :class:`FlatError` for a value that is not exactly of its field's type."""
        index = self._index
        append = out.append
        for i, kind in enumerate(self._kinds):
            v = values[i]
            if kind & _NULLABLE:
                if v is None:
                    append(0)
                    continue
                append(2)
                kind &= 7
            if kind == _STRING:
                if type(v) is not str:
                    raise FlatError(f"{self.names[i]}: not a str")
                raw = v.encode("utf-8")
                n = len(raw) << 1
            elif kind == _LONG or kind == _INT:
                if type(v) is not int:
                    raise FlatError(f"{self.names[i]}: not an int")
                if kind == _LONG:
                    if v < _LONG_MIN or v > _LONG_MAX:
                        raise FlatError(f"{self.names[i]}: long out of range")
                elif v < _INT_MIN or v > _INT_MAX:
                    raise FlatError(f"{self.names[i]}: int out of range")
                n = (v << 1) ^ (v >> 63)
            elif kind == _ENUM:  # a str (or a StrEnum member, which hashes as its value)
                n = index[i].get(v) if isinstance(v, str) else None  # type: ignore[union-attr]
                if n is None:
                    raise FlatError(f"{self.names[i]}: not a symbol")
                n <<= 1
            elif kind == _BOOL:
                if type(v) is not bool:
                    raise FlatError(f"{self.names[i]}: not a bool")
                append(1 if v else 0)
                continue
            else:  # null
                if v is not None:
                    raise FlatError(f"{self.names[i]}: not None")
                continue
            while n > 0x7F:  # the varint of n
                append((n & 0x7F) | 0x80)
                n >>= 7
            append(n)
            if kind == _STRING:
                out += raw
