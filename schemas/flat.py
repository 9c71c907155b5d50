"""Avro binary for *flat* records, several times faster than fastavro's per-message calls:
generated Python, and the same reader and writer in C.

``Run`` and ``StatusEvent`` are flat: every field is a string, int, long, boolean, enum or a
``["null", T]`` union of those. The scheduler encodes four of them per job and decodes one,
workers decode and encode one per run, and the status sink decodes five per job; at those rates
fastavro's per-call set-up (a stream object, schema lookups, a dict per record) costs more than
the encoding itself. :meth:`FlatRecord.compile` turns a parsed schema into Python source with one
straight block per field (no loop over the fields, no dispatch on their kinds), compiled once;
the writer reads the model's attributes directly.

Records whose fields are flat or are other records (a union of records, as the body of a
``JobCommand`` and its trigger) get a reader too (:meth:`FlatRecord.compile_nested`): a nested
record's value is the list of its values, a union's is ``(record full name, values)``. The
scheduler decodes one command per job.

It is a fast path, not a second codec: :class:`jobwheel.schemas.codec.Codec` uses it only for
values and bytes it handles exactly, and falls back to fastavro for anything else (a value of the
wrong type, bytes it refuses), so results and error messages stay fastavro's. Its decoder is the
stricter of the two (int and long ranges, UTF-8, no trailing bytes);
``tests/unit/test_flat_codec.py`` holds it to byte-identical results with fastavro on valid records
and random bytes.

The same reader and writer exist in C (``schemas/_flat.c``, the module ``_flat``), several
times faster again: these records are the per-record CPU of the scheduler, the workers and the
status sink, and what is left of it in the generated Python is the interpreter stepping through
varint bytes and range checks. A :class:`FlatRecord` uses the C when the module is built (a
normal install compiles it; ``FlatRecord.native`` says which one it got) and the generated
Python otherwise. The Python stays the reference: the tests run every check against both and
hold the C to the same accepted and refused inputs, values and bytes as the Python
(``compile(..., native=False)`` forces the Python for one record). Outside what the codec passes
the C is stricter: its reader takes only ``bytes`` and a ``pos`` from 0 to ``len(data)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

try:
    from jobwheel.schemas import _flat
except ImportError:  # not compiled (no C compiler at install): the generated Python serves
    _flat = None  # type: ignore[assignment]

# Field kinds. A union with null adds _NULLABLE; the value's own kind is the low bits.
# The first four start with a zigzag varint.
_STRING, _LONG, _INT, _ENUM, _BOOL, _NULL, _RECORD, _UNION = range(8)
_NULLABLE = 8

_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_PRIMITIVES = {"string": _STRING, "long": _LONG, "int": _INT, "boolean": _BOOL, "null": _NULL}

#: The varint bytes of every value below 2**14 (lengths, counters, enum indexes, small ints).
_SMALL = tuple(bytes([n]) if n < 0x80 else bytes([(n & 0x7F) | 0x80, n >> 7]) for n in range(16384))


class FlatError(ValueError):
    """Bytes or values the fast path does not handle; the caller falls back to fastavro."""


def _kind(schema: Any, nested: bool = False, native: bool = False) -> tuple[int, Any] | None:
    """(kind, enum symbols) of a field type, or None when it is not flat. ``nested``: also a
    record, or a union of records, as (kind, reader) and (kind, ((full name, reader), ...)),
    the readers ``native`` (C) or generated Python."""
    if nested and isinstance(schema, dict) and schema.get("type") == "record":
        reader = _nested_body(schema, native)
        return None if reader is None else (_RECORD, reader)
    records = isinstance(schema, list) and all(
        isinstance(branch, dict) and branch.get("type") == "record" for branch in schema
    )
    if nested and records and 0 < len(schema) < 64:
        branches = []
        for branch in schema:
            reader = _nested_body(branch, native)
            if reader is None:
                return None
            branches.append((branch["name"], reader))
        return _UNION, tuple(branches)
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


#: Varints of recent large values: the events of one scheduler iteration share their event
#: time and most of their deadlines (now + the visibility timeout), so most timestamps come
#: again within a few events. Emptied when full; a dict's get and set are atomic, so threads
#: may share it.
_RECENT: dict[int, bytes] = {}
_RECENT_MAX = 256


def _varint(n: int) -> bytes:
    """The varint of a non-negative ``n`` (the zigzag of a value), unrolled for the sizes of
    millisecond timestamps."""
    if n < 16384:
        return _SMALL[n]
    known = _RECENT.get(n)
    if known is not None:
        return known
    out = _varint_bytes(n)
    if len(_RECENT) >= _RECENT_MAX:
        _RECENT.clear()
    _RECENT[n] = out
    return out


def _varint_bytes(n: int) -> bytes:
    if n < 1 << 21:
        return bytes((n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14))
    if n < 1 << 28:
        return bytes((n & 0x7F | 0x80, n >> 7 & 0x7F | 0x80, n >> 14 & 0x7F | 0x80, n >> 21))
    if n < 1 << 42:  # every millisecond timestamp of this millennium: 6 bytes
        if n < 1 << 35:
            return bytes(
                (
                    n & 0x7F | 0x80,
                    n >> 7 & 0x7F | 0x80,
                    n >> 14 & 0x7F | 0x80,
                    n >> 21 & 0x7F | 0x80,
                    n >> 28,
                )
            )
        return bytes(
            (
                n & 0x7F | 0x80,
                n >> 7 & 0x7F | 0x80,
                n >> 14 & 0x7F | 0x80,
                n >> 21 & 0x7F | 0x80,
                n >> 28 & 0x7F | 0x80,
                n >> 35,
            )
        )
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_varint(data: bytes, pos: int, b: int, kind: int) -> tuple[int, int]:
    """The rest of a varint whose first byte ``b`` (>= 0x80) was read before ``pos``: its
    zigzag-decoded value and the position after it, range-checked for ints and longs."""
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
        low, high = (_INT_MIN, _INT_MAX) if kind != _LONG else (_LONG_MIN, _LONG_MAX)
        if n < low or n > high:
            raise FlatError("integer out of range")
    return n, pos


def _encoder_source(name: str, accessors: Sequence[str], kinds: Sequence[int]) -> list[str]:
    """Python source of an encoder: ``accessors[i]`` is the expression of field ``i``'s value."""
    lines = [f"def {name}(o, head):", "    p = [head]", "    a = p.append"]
    for i, (get, kind) in enumerate(zip(accessors, kinds, strict=True)):
        ind = "    "
        lines.append(f"    x = {get}")
        if kind & _NULLABLE:
            lines += [
                "    if x is None:",
                "        a(b'\\x00')",
                "    else:",
                "        a(b'\\x02')",
            ]
            ind = "        "
            kind &= 7
        if kind == _STRING:
            lines += [
                f"{ind}if type(x) is not str: raise FlatError(NAMES[{i}] + ': not a str')",
                f"{ind}s = x.encode('utf-8')",
                f"{ind}n = len(s) << 1",
                f"{ind}a(SMALL[n] if n < 16384 else varint(n))",
                f"{ind}a(s)",
            ]
        elif kind in (_LONG, _INT):
            low, high = (_LONG_MIN, _LONG_MAX) if kind == _LONG else (_INT_MIN, _INT_MAX)
            lines += [
                f"{ind}if type(x) is not int or x < {low} or x > {high}:",
                f"{ind}    raise FlatError(NAMES[{i}] + ': not an int in range')",
                f"{ind}n = (x << 1) ^ (x >> 63)",
                f"{ind}a(SMALL[n] if n < 16384 else varint(n))",
            ]
        elif kind == _ENUM:  # a str (or a StrEnum member, which hashes as its value)
            lines += [
                f"{ind}b = INDEX[{i}].get(x) if isinstance(x, str) else None",
                f"{ind}if b is None: raise FlatError(NAMES[{i}] + ': not a symbol')",
                f"{ind}a(b)",
            ]
        elif kind == _BOOL:
            lines += [
                f"{ind}if type(x) is not bool: raise FlatError(NAMES[{i}] + ': not a bool')",
                f"{ind}a(b'\\x01' if x else b'\\x00')",
            ]
        else:  # null
            lines.append(f"{ind}if x is not None: raise FlatError(NAMES[{i}] + ': not None')")
    lines.append("    return b''.join(p)")
    return lines


def _decoder_source(kinds: Sequence[int], symbols: Sequence[Any], body: bool = False) -> list[str]:
    """Python source of a reader. ``body``: a nested record's reader,
    ``body(data, pos, size) -> (values, pos)``, leaving the errors and the end to its caller.

    Longer than a function should be, on purpose: it is a template of generated code, one
    branch per field kind, each emitting the lines that read that kind inline (the reader is
    straight-line code with a call only for a nested record or a long varint, which is what
    makes it fast). Split into helpers that each append a few lines, the reader's shape could
    no longer be read in one place."""
    if body:
        lines = ["def body(data, pos, size):", "    if True:"]
    else:
        lines = ["def decode(data, pos=0):", "    size = len(data)", "    try:"]
    for i, kind in enumerate(kinds):
        ind = "        "
        if kind == _RECORD:
            lines.append(f"{ind}f{i}, pos = SYMBOLS[{i}](data, pos, size)")
            continue
        if kind == _UNION:
            count = len(symbols[i])
            lines += [
                f"{ind}b = data[pos]",
                f"{ind}pos += 1",
                f"{ind}if b & 1 or b >= {count * 2}: raise FlatError('union index byte ' + str(b))",
                f"{ind}name, read = SYMBOLS[{i}][b >> 1]",
                f"{ind}values, pos = read(data, pos, size)",
                f"{ind}f{i} = (name, values)",
            ]
            continue
        if kind & _NULLABLE:
            lines += [
                f"{ind}b = data[pos]",
                f"{ind}pos += 1",
                f"{ind}if b == 0:",
                f"{ind}    f{i} = None",
                f"{ind}elif b != 2:",  # zigzag 1: the second branch
                f"{ind}    raise FlatError('union branch byte ' + str(b))",
                f"{ind}else:",
            ]
            ind += "    "
            kind &= 7
        if kind <= _ENUM:  # string, long, int, enum: a zigzag varint first
            lines += [
                f"{ind}b = data[pos]",
                f"{ind}pos += 1",
                f"{ind}if b < 0x80:",
                f"{ind}    n = (b >> 1) ^ -(b & 1)",
                f"{ind}else:",
                f"{ind}    n, pos = read_varint(data, pos, b, {kind})",
            ]
            if kind == _STRING:
                lines += [
                    f"{ind}if n < 0: raise FlatError('negative string length')",
                    f"{ind}end = pos + n",
                    f"{ind}if end > size: raise FlatError('string past the end')",
                    f"{ind}f{i} = data[pos:end].decode('utf-8')",
                    f"{ind}pos = end",
                ]
            elif kind == _ENUM:
                count = len(symbols[i])
                lines += [
                    f"{ind}if n < 0 or n >= {count}: raise FlatError('enum index ' + str(n))",
                    f"{ind}f{i} = SYMBOLS[{i}][n]",
                ]
            else:
                lines.append(f"{ind}f{i} = n")
        elif kind == _BOOL:
            lines += [
                f"{ind}b = data[pos]",
                f"{ind}pos += 1",
                f"{ind}if b > 1: raise FlatError('boolean byte ' + str(b))",
                f"{ind}f{i} = b == 1",
            ]
        else:  # null
            lines.append(f"{ind}f{i} = None")
    values = "[" + ", ".join(f"f{i}" for i in range(len(kinds))) + "]"
    if body:
        return [*lines, "        pass", f"    return {values}, pos"]
    lines += [
        "    except IndexError:",
        "        raise FlatError('truncated') from None",
        "    except UnicodeDecodeError:",
        "        raise FlatError('string is not UTF-8') from None",
        "    if pos != size:",
        "        raise FlatError(str(size - pos) + ' trailing bytes')",
        f"    return {values}",
    ]
    return lines


def _environment(names: Sequence[str], symbols: Sequence[Any], index: Any = ()) -> dict[str, Any]:
    return {
        "FlatError": FlatError,
        "NAMES": tuple(names),
        "SYMBOLS": tuple(symbols),
        "INDEX": index,
        "SMALL": _SMALL,
        "varint": _varint,
        "read_varint": _read_varint,
    }


def _run(lines: list[str], env: dict[str, Any], label: str) -> dict[str, Any]:
    exec(compile("\n".join(lines), f"<flat {label}>", "exec"), env)  # noqa: S102 - our own generated source
    return env


def _fields(
    parsed: Any, nested: bool, native: bool = False
) -> tuple[list[str], list[int], list[Any]] | None:
    """Names, kinds and symbols (or readers) of a record schema's fields; None when one of
    them has no fast path."""
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        return None
    names, kinds, symbols = [], [], []
    for f in parsed["fields"]:
        kind = _kind(f["type"], nested, native)
        if kind is None:
            return None
        names.append(f["name"])
        kinds.append(kind[0])
        symbols.append(kind[1])
    return names, kinds, symbols


def _nested_body(
    parsed: dict[str, Any], native: bool = False
) -> Callable[..., tuple[list[Any], int]] | None:
    """The body reader of a record nested in another (see :func:`_decoder_source`); a C
    ``_flat.Record`` (callable the same way) under a native parent, which reads it in C."""
    fields = _fields(parsed, nested=True, native=native)
    if fields is None:
        return None
    names, kinds, symbols = fields
    if native:
        record: Callable[..., tuple[list[Any], int]] = _flat.Record(
            tuple(names), tuple(kinds), tuple(symbols), None, FlatError
        )
        return record
    env = _run(_decoder_source(kinds, symbols, body=True), _environment(names, symbols), "body")
    body: Callable[..., tuple[list[Any], int]] = env["body"]
    return body


class FlatRecord:
    """Reader and writer of one flat record schema; build with :meth:`compile`.

    ``decode(data, pos=0)`` returns the field values in schema order from the Avro body at
    ``data[pos:]`` (enums as their symbol strings) and raises :class:`FlatError` for anything
    it will not vouch for. ``native``: whether they are the C ones (``_flat``) or the
    generated Python.
    """

    __slots__ = ("names", "native", "_kinds", "_symbols", "_index", "_record", "decode")

    decode: Callable[..., list[Any]]

    def __init__(
        self,
        names: tuple[str, ...],
        kinds: tuple[int, ...],
        symbols: tuple[Any, ...],
        *,
        native: bool = True,
    ) -> None:
        """``native``: use the C module if it is built (nested readers in ``symbols`` must
        then be C ones too: build with :meth:`compile_nested`); False: the generated Python."""
        self.names = names
        self._kinds = kinds
        self._symbols = symbols  # per field: enum symbols, nested readers, or None
        # Per enum field: symbol -> the varint bytes of its index.
        self._index = tuple(
            {name: _SMALL[i << 1] for i, name in enumerate(s)} if kind == _ENUM else None
            for kind, s in ((k & 7, s) for k, s in zip(kinds, symbols, strict=True))
        )
        self.native = native and _flat is not None
        if self.native:
            self._record = _flat.Record(names, kinds, symbols, self._index, FlatError)
            self.decode = self._record.decode
        else:
            self._record = None
            self.decode = self._compile(_decoder_source(kinds, symbols))["decode"]

    def _compile(self, lines: list[str]) -> dict[str, Any]:
        env = _environment(self.names, self._symbols, self._index)
        return _run(lines, env, ",".join(self.names[:2]) + "...")

    @classmethod
    def compile(cls, parsed: Any, *, native: bool = True) -> FlatRecord | None:
        """The codec for a (fastavro-parsed) record schema, or None when it is not flat.
        ``native=False``: the generated Python even where the C module is built (the tests
        compare the two)."""
        fields = _fields(parsed, nested=False)
        return None if fields is None else cls(*map(tuple, fields), native=native)

    @classmethod
    def compile_nested(cls, parsed: Any, *, native: bool = True) -> FlatRecord | None:
        """A reader for a record schema whose fields may also be records or unions of records
        (it has no :meth:`writer`), or None when a field has no fast path."""
        native = native and _flat is not None
        fields = _fields(parsed, nested=True, native=native)
        return None if fields is None else cls(*map(tuple, fields), native=native)

    def writer(self) -> Callable[[Any, bytes], bytes]:
        """``write(obj, head)``: ``head`` + the Avro body of an object with an attribute per
        field (a model), read straight from its attributes (enums as members or symbol
        strings). Raises :class:`FlatError` for a value that is not exactly of its field's
        type."""
        if any(k in (_RECORD, _UNION) for k in self._kinds):
            raise FlatError("a reader of nested records does not write")
        if self._record is not None:
            write: Callable[[Any, bytes], bytes] = self._record.write
            return write
        source = _encoder_source("write", [f"o.{name}" for name in self.names], self._kinds)
        write = self._compile(source)["write"]
        return write


def nested_writer(
    parsed: Any, models: Mapping[str, type], *, native: bool = True
) -> Callable[[Any, bytes], bytes] | None:
    """``write(obj, head)`` for a record whose fields may also be records or unions of records
    (a command: its body, its trigger), or None when a part has no fast path. Each run of flat
    fields is written by a flat writer (C where built), a record field by its record's writer,
    a union of records by the writer of the branch whose model (``models``: full name ->
    model class) is the value's exact type; any other value raises :class:`FlatError`, and the
    codec leaves it to fastavro. fastavro took 10 us a command in the SDK, most of it the
    dicts the conversions build for it."""
    body = _record_writer(parsed, models, native)
    if body is None:
        return None
    write_body = body

    def write(obj: Any, head: bytes) -> bytes:
        return head + write_body(obj)

    return write


def _record_writer(
    parsed: Any, models: Mapping[str, type], native: bool
) -> Callable[[Any], bytes] | None:
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        return None
    model = models.get(parsed["name"])
    if model is None or not hasattr(model, "__dataclass_fields__"):
        return None
    if not {f["name"] for f in parsed["fields"]} <= set(model.__dataclass_fields__):
        return None
    parts: list[Callable[[Any], bytes]] = []
    run: list[dict[str, Any]] = []
    for field in [*parsed["fields"], None]:
        kind = None if field is None else field["type"]
        nested = isinstance(kind, dict) and kind.get("type") == "record"
        union = isinstance(kind, list) and all(
            isinstance(b, dict) and b.get("type") == "record" for b in kind
        )
        if field is not None and not nested and not union:
            run.append(field)
            continue
        if run:  # the flat fields before this one, written in one go
            flat = FlatRecord.compile(
                {"type": "record", "name": "part", "fields": run}, native=native
            )
            if flat is None:
                return None
            parts.append(_headless(flat.writer()))
            run = []
        if field is None:
            break
        branches = [kind] if nested else kind
        writers: dict[type, tuple[bytes, Callable[[Any], bytes]]] = {}
        for i, branch in enumerate(branches):
            writer = _record_writer(branch, models, native)
            branch_model = models.get(branch["name"])
            if writer is None or branch_model is None or branch_model in writers:
                return None
            writers[branch_model] = (b"" if nested else _SMALL[i << 1], writer)
        parts.append(_branch_writer(field["name"], writers))
    if not parts:
        return _empty
    if len(parts) == 1:
        return parts[0]

    def write(obj: Any) -> bytes:
        return b"".join([part(obj) for part in parts])

    return write


def _empty(obj: Any) -> bytes:
    return b""


def _headless(write: Callable[[Any, bytes], bytes]) -> Callable[[Any], bytes]:
    def body(obj: Any) -> bytes:
        return write(obj, b"")

    return body


def _branch_writer(
    name: str, writers: dict[type, tuple[bytes, Callable[[Any], bytes]]]
) -> Callable[[Any], bytes]:
    def write(obj: Any) -> bytes:
        value = getattr(obj, name)
        branch = writers.get(type(value))
        if branch is None:
            raise FlatError(f"{name}: not a model of its union")
        index, body = branch
        return index + body(value)

    return write
