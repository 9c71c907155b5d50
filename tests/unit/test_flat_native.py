"""The C reader and writer of flat records (``schemas/_flat.c``) against the generated Python
of ``schemas/flat.py``, which is the reference: for every input, the same verdict (a value, or
the same exception class: :class:`FlatError` for every body refused), the same values with the
same types, the same bytes. Random bytes, valid records cut, flipped and extended, hand-made
edge cases for each field kind, objects with values of every wrong type; then the C module's
own arguments, and that it leaks nothing.

The first test fails when the module could have been built and was not (a broken build would
otherwise pass everything here on the Python alone, the rest being skipped).
"""

from __future__ import annotations

import enum
import gc
import io
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobwheel.schemas import flat
from jobwheel.schemas.codec import Codec, SchemaCatalogue
from jobwheel.schemas.flat import FlatError, FlatRecord
from jobwheel.schemas.models import ConcurrencyPolicy, Run, State, StatusEvent
from tests.support import built_c_module

REPO = Path(__file__).resolve().parents[2]
CATALOGUE = SchemaCatalogue.load()

needs_c = pytest.mark.skipif(flat._flat is None, reason="schemas/_flat.c is not built")

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1


def test_the_c_module_is_built_and_is_what_the_codec_uses() -> None:
    module = built_c_module("jobwheel.schemas._flat", REPO / "schemas" / "_flat.c")
    assert flat._flat is module
    codec = Codec()
    for model in (Run, StatusEvent):
        write = codec._writers[model].write
        assert isinstance(getattr(write, "__self__", None), module.Record), model
    for name in ("io.jobwheel.Run", "io.jobwheel.StatusEvent", "io.jobwheel.JobCommand"):
        reader = codec._readers[CATALOGUE.current(name).fingerprint].fast
        assert reader is not None and reader.native, name
    assert FlatRecord.compile(CATALOGUE.current("io.jobwheel.Run").parsed).native  # type: ignore[union-attr]


# --- the two implementations side by side ----------------------------------------------


def compiled(parsed: Any, native: bool) -> FlatRecord:
    record = FlatRecord.compile(parsed, native=native) or FlatRecord.compile_nested(
        parsed, native=native
    )
    assert record is not None and record.native is (native and flat._flat is not None)
    return record


def pair(parsed: Any) -> tuple[FlatRecord, FlatRecord]:
    """(C, Python) of one schema."""
    return compiled(parsed, True), compiled(parsed, False)


def typed(value: Any) -> Any:
    """``value`` with the exact type of every part (True is not 1, a str subclass not a str)."""
    if type(value) in (list, tuple):
        return type(value), [typed(v) for v in value]
    return type(value), value


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "value", typed(call())
    except Exception as exc:  # the class is the contract; the messages may differ
        return "raises", type(exc)


def same_decode(c: FlatRecord, py: FlatRecord, data: bytes, pos: int = 0) -> tuple[str, Any]:
    """Both readers' verdict on ``data[pos:]``, asserted equal; a refusal is a FlatError."""
    got = outcome(lambda: c.decode(data, pos))
    want = outcome(lambda: py.decode(data, pos))
    assert got == want, (data.hex(), pos, got, want)
    assert got[0] == "value" or got[1] is FlatError, got
    return got


def same_write(c: FlatRecord, py: FlatRecord, obj: Any, head: Any = b"") -> tuple[str, Any]:
    got = outcome(lambda: c.writer()(obj, head))
    want = outcome(lambda: py.writer()(obj, head))
    assert got == want, (vars(obj), head, got, want)
    return got


#: Every version but the StatusBatch's (an array of messages: the flat codec does not take
#: arrays, and a batch is read with fastavro, once per transaction and partition).
VERSIONS = {
    v.label(): (v.parsed, *pair(v.parsed))
    for v in CATALOGUE.versions
    if v.full_name != "io.jobwheel.StatusBatch"
}
FLAT_LABELS = [label for label in VERSIONS if not label.startswith("job_")]
LABELS = sorted(VERSIONS)


# --- strategies ----------------------------------------------------------------------------

#: Short text, and now and then a long one (beyond 8,192 UTF-8 bytes the length takes a
#: three-byte varint, beyond 64 characters two).
TEXT = st.text(max_size=20) | st.builds(
    lambda s, n: s * n, st.text(min_size=1, max_size=3), st.integers(20, 9000)
)
LONG_EDGES = [LONG_MIN, LONG_MIN + 1, -1, 0, 1, 63, 64, 8191, 8192, LONG_MAX - 1, LONG_MAX]
INT_EDGES = [INT_MIN, INT_MIN + 1, -65, -64, -1, 0, 1, 8191, 8192, INT_MAX - 1, INT_MAX]
LONGS = st.integers(LONG_MIN, LONG_MAX) | st.sampled_from(LONG_EDGES)
INTS = st.integers(INT_MIN, INT_MAX) | st.sampled_from(INT_EDGES)


def avro_value(schema: Any) -> st.SearchStrategy[Any]:
    """Values fastavro writes for a (parsed) schema; unions of records in tuple notation."""
    if isinstance(schema, list):
        if schema[0] == "null":
            return st.none() | avro_value(schema[1])
        return st.one_of(*(st.tuples(st.just(b["name"]), avro_value(b)) for b in schema))
    if isinstance(schema, dict):
        if schema["type"] == "enum":
            return st.sampled_from(schema["symbols"])
        if schema["type"] == "record":
            fields = {f["name"]: avro_value(f["type"]) for f in schema["fields"]}
            return st.fixed_dictionaries(fields)
        return avro_value(schema["type"])
    primitives = {
        "string": TEXT,
        "long": LONGS,
        "int": INTS,
        "boolean": st.booleans(),
        "null": st.none(),
    }
    return primitives[schema]


def avro_body(schema: Any, record: Any) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, schema, record)
    return out.getvalue()


class Text(str):
    """A str subclass: the writer's string fields refuse it, its enum fields look it up."""


class Number(int):
    """An int subclass: the writer's int and long fields refuse it, as they refuse a bool."""


class Letter(enum.StrEnum):
    A = "A"
    Z = "Z"  # not a symbol of LETTERS


class Plain(enum.Enum):
    A = "A"  # not a str: refused


#: A value of any type, for a field of any kind.
ANYTHING = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.binary(max_size=3),
    st.text(max_size=3),
    st.sampled_from(["\ud800", "a\udfffb", "SUCCEEDED", "FORBID"]),
    st.builds(Text, st.sampled_from(["", "a", "SCHEDULED"])),
    st.builds(Number, st.integers(-3, 3)),
    st.sampled_from([*State, *ConcurrencyPolicy, *Letter, Plain.A]),
)


def good_value(kind: int, symbols: Any) -> st.SearchStrategy[Any]:
    """A value the writer takes for a field of ``kind``, or one on its edge."""
    nullable, kind = kind & flat._NULLABLE, kind & 7
    if kind == flat._STRING:
        inner = TEXT | st.text(alphabet=st.characters(codec=None, categories=["Cs", "Ll"]))
    elif kind == flat._LONG:
        beyond = st.sampled_from([LONG_MIN - 1, LONG_MAX + 1, 2**64, -(2**64)])
        inner = LONGS | beyond
    elif kind == flat._INT:
        inner = INTS | st.sampled_from([INT_MIN - 1, INT_MAX + 1, LONG_MAX])
    elif kind == flat._ENUM:
        members = [m for m in (*State, *ConcurrencyPolicy) if m.value in symbols]
        inner = st.sampled_from([*symbols, *members]) | st.builds(Text, st.sampled_from(symbols))
    elif kind == flat._BOOL:
        inner = st.booleans()
    else:
        inner = st.none()
    return st.none() | inner if nullable else inner


# --- the reader ----------------------------------------------------------------------------


@needs_c
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(label=st.sampled_from(LABELS), body=st.binary(max_size=200), prefix=st.binary(max_size=12))
def test_random_bytes_are_read_or_refused_alike(label: str, body: bytes, prefix: bytes) -> None:
    _, c, py = VERSIONS[label]
    same_decode(c, py, body)
    same_decode(c, py, prefix + body, len(prefix))


@needs_c
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(label=st.sampled_from(LABELS), data=st.data())
def test_valid_records_cut_flipped_and_extended_are_read_or_refused_alike(
    label: str, data: st.DataObject
) -> None:
    parsed, c, py = VERSIONS[label]
    record = data.draw(avro_value(parsed), label="record")
    body = avro_body(parsed, record)
    verdict, values = same_decode(c, py, body)
    assert verdict == "value"
    expected = schemaless_reader(io.BytesIO(body), parsed, None, return_record_name=True)
    assert values == typed(as_values(expected))  # and they are fastavro's
    # Every cut is refused (a few hundred, not all 27,000 of a long string).
    cuts = set(range(min(len(body), 40))) | set(range(max(0, len(body) - 16), len(body)))
    cuts |= set(data.draw(st.lists(st.integers(0, len(body)), max_size=20), label="cuts"))
    for cut in sorted(cuts):
        if cut < len(body):
            assert same_decode(c, py, body[:cut])[0] == "raises"
    # Bit flips anywhere: some still read (a flipped character), most are refused.
    if body:
        flips = st.tuples(st.integers(0, len(body) - 1), st.integers(1, 255))
        mutated = bytearray(body)
        for at, mask in data.draw(st.lists(flips, min_size=1, max_size=4), label="flips"):
            mutated[at] ^= mask
        same_decode(c, py, bytes(mutated))
        at = data.draw(st.integers(0, len(body) - 1), label="deleted")
        same_decode(c, py, body[:at] + body[at + 1 :])
    extra = data.draw(st.binary(min_size=1, max_size=4), label="extra")
    assert same_decode(c, py, body + extra)[0] == "raises"
    same_decode(c, py, extra + body, len(extra))


def as_values(record: Any) -> Any:
    """fastavro's record as the fast path gives it: a record as the list of its values, a
    union of records as (full name, values)."""
    if isinstance(record, dict):
        return [as_values(v) for v in record.values()]
    if isinstance(record, tuple):
        return record[0], as_values(record[1])
    return record


def record_of(*types: Any) -> dict[str, Any]:
    """A parsed record schema of fields f0, f1, ... of these types."""
    fields = [{"name": f"f{i}", "type": t} for i, t in enumerate(types)]
    parsed: dict[str, Any] = parse_schema({"type": "record", "name": "t.T", "fields": fields})
    return parsed


def zigzag(n: int) -> bytes:
    """The zigzag varint of any int (also of those beyond 64 bits)."""
    z = n * 2 if n >= 0 else -n * 2 - 1
    out = bytearray()
    while z > 0x7F:
        out.append(z & 0x7F | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


LETTERS = {"type": "enum", "name": "t.Letters", "symbols": ["A", "B", "C"]}
NESTED = {"type": "record", "name": "t.N", "fields": [{"name": "s", "type": "string"}]}
BRANCHES = [
    {"type": "record", "name": "t.A", "fields": [{"name": "x", "type": "int"}]},
    {"type": "record", "name": "t.B", "fields": []},
]
REFUSED = FlatError

#: (field types, body, the values read or REFUSED), each read by both implementations.
READS: list[tuple[list[Any], bytes, Any]] = [
    (["long"], b"\x00", [0]),
    (["long"], b"\x01", [-1]),
    (["long"], b"\x7f", [-64]),
    (["long"], b"\x80\x01", [64]),
    (["long"], zigzag(LONG_MAX), [LONG_MAX]),
    (["long"], zigzag(LONG_MIN), [LONG_MIN]),
    (["long"], b"\xff" * 9 + b"\x01", [LONG_MIN]),
    (["long"], b"\x80" * 9 + b"\x01", [2**62]),  # the 10th byte's one bit
    (["long"], b"\x80" * 9 + b"\x00", [0]),  # not the shortest form: read all the same
    (["long"], b"\xff" * 9 + b"\x02", REFUSED),  # beyond 64 bits
    (["long"], b"\xff" * 9 + b"\x7f", REFUSED),
    (["long"], b"\x80" * 10 + b"\x00", REFUSED),  # an 11th byte
    (["long"], b"\x80", REFUSED),
    (["long"], b"", REFUSED),
    (["long"], b"\x00\x00", REFUSED),  # trailing
    (["int"], zigzag(INT_MAX), [INT_MAX]),
    (["int"], zigzag(INT_MIN), [INT_MIN]),
    (["int"], zigzag(INT_MAX + 1), REFUSED),
    (["int"], zigzag(INT_MIN - 1), REFUSED),
    (["int"], zigzag(LONG_MAX), REFUSED),
    (["int"], b"\x80" * 9 + b"\x00", [0]),
    (["int"], b"\xfe\xff\xff\xff\x0f", [INT_MAX]),
    (["int"], b"\x80\x80\x80\x80\x10", REFUSED),  # 2**31
    (["string"], b"\x00", [""]),
    (["string"], b"\x02a", ["a"]),
    (["string"], b"\x82\x80\x80\x80\x80\x80\x80\x80\x80\x00a", ["a"]),  # a 10-byte length
    (["string"], b"\x01", REFUSED),  # length -1
    (["string"], b"\x04a", REFUSED),  # past the end
    (["string"], zigzag(LONG_MAX) + b"a", REFUSED),
    (["string"], b"\xff" * 9 + b"\x02a", REFUSED),
    (["string"], b"\x02\xff", REFUSED),  # not UTF-8
    (["string"], b"\x06\xed\xa0\x80", REFUSED),  # an encoded surrogate
    (["string"], b"\x04\xc0\x80", REFUSED),  # an overlong form
    (["string"], b"\x08\xf4\x90\x80\x80", REFUSED),  # beyond U+10FFFF
    (["string"], b"\x06\xe2\x82\xac", ["\u20ac"]),
    (["string"], zigzag(20_000) + b"a" * 20_000, ["a" * 20_000]),
    (["string"], zigzag(20_000) + "é".encode() * 10_000, ["é" * 10_000]),
    (["string"], zigzag(20_000) + b"a" * 19_999, REFUSED),
    ([LETTERS], b"\x00", ["A"]),
    ([LETTERS], b"\x04", ["C"]),
    ([LETTERS], b"\x06", REFUSED),
    ([LETTERS], b"\x01", REFUSED),
    ([LETTERS], b"\x80\x80\x80\x80\x10", REFUSED),
    ([LETTERS], b"\x80" * 9 + b"\x00", ["A"]),
    (["boolean"], b"\x00", [False]),
    (["boolean"], b"\x01", [True]),
    (["boolean"], b"\x02", REFUSED),
    (["boolean"], b"\xff", REFUSED),
    (["boolean"], b"", REFUSED),
    (["null"], b"", [None]),
    (["null"], b"\x00", REFUSED),
    ([["null", "long"]], b"\x00", [None]),
    ([["null", "long"]], b"\x02\x02", [1]),
    ([["null", "long"]], b"\x01", REFUSED),
    ([["null", "long"]], b"\x04\x02", REFUSED),
    ([["null", "long"]], b"\x80\x00", REFUSED),
    ([["null", "long"]], b"\x02", REFUSED),
    ([["null", "string"]], b"\x02\x00", [""]),
    ([["null", LETTERS]], b"\x02\x02", ["B"]),
    ([["null", "boolean"]], b"\x02\x01", [True]),
    ([["null", "int"]], b"\x02" + zigzag(INT_MAX + 1), REFUSED),
    ([NESTED, "long"], b"\x02a\x04", [["a"], 2]),
    ([NESTED, "long"], b"\x02a", REFUSED),
    ([BRANCHES], b"\x00\x02", [("t.A", [1])]),
    ([BRANCHES], b"\x02", [("t.B", [])]),
    ([BRANCHES], b"\x01", REFUSED),
    ([BRANCHES], b"\x04", REFUSED),
    ([BRANCHES], b"\x00", REFUSED),
    ([BRANCHES], b"\x02\x00", REFUSED),
    (["string", "long", "boolean"], b"\x02a\x03\x01", ["a", -2, True]),
]


@needs_c
@pytest.mark.parametrize(("types", "body", "expected"), READS)
def test_edge_cases_are_read_or_refused_alike(types: list[Any], body: bytes, expected: Any) -> None:
    c, py = pair(record_of(*types))
    got = same_decode(c, py, body)
    if expected is REFUSED:
        assert got == ("raises", FlatError)
    else:
        assert got == ("value", typed(expected))
        # and at an offset, as the codec reads after the header
        assert same_decode(c, py, b"\xc3\x01" + bytes(8) + body, 10) == got


@needs_c
def test_the_position_is_checked_and_keywords_are_taken() -> None:
    c, py = pair(record_of("long"))
    for impl in (c, py):
        assert impl.decode(data=b"\x00\x04", pos=1) == [2]
        with pytest.raises(FlatError):
            impl.decode(b"\x04", 2)  # beyond the end
        with pytest.raises(TypeError):
            impl.decode(b"\x04", 0, 1)  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            impl.decode(b"\x04", position=0)  # type: ignore[call-arg]
    # Only the C refuses a negative position (the Python would index from the end); the codec
    # passes 0 or the header's length.
    with pytest.raises(FlatError):
        c.decode(b"\x04", -1)
    # Only bytes: the codec passes exact bytes (decode turns the others into bytes first).
    with pytest.raises(TypeError):
        c.decode(bytearray(b"\x04"))  # type: ignore[arg-type]
    # A record of no fields (the generated Python has no reader for one: no Avro record of the
    # contract is empty at the top).
    assert flat._flat is not None
    empty = flat._flat.Record((), (), (), (), FlatError)
    assert empty.decode(b"xy", 2) == [] and empty.decode(b"") == []
    assert empty.write(SimpleNamespace(), b"h") == b"h"
    with pytest.raises(FlatError):
        empty.decode(b"xy", 1)


@needs_c
def test_a_nested_reader_reads_a_body_as_the_python_one_does() -> None:
    parsed = record_of(NESTED, BRANCHES)
    c, py = pair(parsed)
    c_body, py_body = c._symbols[1][0][1], py._symbols[1][0][1]
    data = b"xx\x02a\x00\x06"
    assert c.decode(data, 2) == py.decode(data, 2) == [["a"], ("t.A", [3])]
    assert c_body(data, 5, len(data)) == py_body(data, 5, len(data)) == ([3], 6)
    assert c._symbols[0](data, 2, len(data)) == py._symbols[0](data, 2, len(data)) == (["a"], 4)
    with pytest.raises(FlatError):
        c_body(data, 5, 5)  # the bytes end at size


# --- the writer ----------------------------------------------------------------------------


HEADS = st.one_of(
    st.sampled_from([b"", b"\xc3\x01" + bytes(range(8))]),
    st.binary(max_size=12),
    st.builds(bytearray, st.binary(max_size=3)),
    st.builds(memoryview, st.binary(max_size=3)),
    st.sampled_from(["c3", None, 7]),  # not bytes-like: TypeError, after any field's error
)


@needs_c
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(label=st.sampled_from(FLAT_LABELS), data=st.data())
def test_writers_write_the_same_bytes_and_refuse_the_same_values(
    label: str, data: st.DataObject
) -> None:
    parsed, c, py = VERSIONS[label]
    names, kinds, symbols = c.names, c._kinds, c._symbols
    # Mostly good values, and up to two of any type: the first refused one decides.
    odd = data.draw(st.sets(st.integers(0, len(names) - 1), max_size=2), label="odd fields")
    values = {
        name: data.draw(ANYTHING if i in odd else good_value(kinds[i], symbols[i]), label=name)
        for i, name in enumerate(names)
    }
    head = data.draw(HEADS, label="head")
    verdict, result = same_write(c, py, SimpleNamespace(**values), head)
    if verdict == "value":
        written = result[1]
        body = written[len(bytes(head)) :]
        assert written[: len(bytes(head))] == bytes(head)
        record = {n: v.value if isinstance(v, enum.Enum) else v for n, v in values.items()}
        assert body == avro_body(parsed, record)  # fastavro's bytes
        assert same_decode(c, py, body)[0] == "value"


#: (field type, value, the body written or the exception class), each by both writers.
WRITES: list[tuple[Any, Any, Any]] = [
    ("long", LONG_MAX, zigzag(LONG_MAX)),
    ("long", LONG_MIN, zigzag(LONG_MIN)),
    ("long", LONG_MAX + 1, FlatError),
    ("long", LONG_MIN - 1, FlatError),
    ("long", 2**64, FlatError),
    ("long", True, FlatError),  # a bool is an int subclass: refused like any other
    ("long", Number(1), FlatError),
    ("long", 1.0, FlatError),
    ("long", "1", FlatError),
    ("long", None, FlatError),
    ("int", INT_MAX, zigzag(INT_MAX)),
    ("int", INT_MIN, zigzag(INT_MIN)),
    ("int", INT_MAX + 1, FlatError),
    ("int", INT_MIN - 1, FlatError),
    ("int", False, FlatError),
    ("int", State.SCHEDULED, FlatError),
    ("string", "", b"\x00"),
    ("string", "a" * 8191, zigzag(8191) + b"a" * 8191),  # length: two bytes
    ("string", "a" * 8192, zigzag(8192) + b"a" * 8192),  # three
    ("string", "é" * 10_000, zigzag(20_000) + "é".encode() * 10_000),
    ("string", "\U0001f600", b"\x08\xf0\x9f\x98\x80"),
    ("string", "\ud800", UnicodeEncodeError),  # str.encode refuses a lone surrogate
    ("string", "a\udfff", UnicodeEncodeError),
    ("string", Text("a"), FlatError),
    ("string", b"a", FlatError),
    ("string", None, FlatError),
    (LETTERS, "A", b"\x00"),
    (LETTERS, "C", b"\x04"),
    (LETTERS, Letter.A, b"\x00"),  # a StrEnum member: looked up as its value
    (LETTERS, Text("B"), b"\x02"),
    (LETTERS, Letter.Z, FlatError),
    (LETTERS, "Z", FlatError),
    (LETTERS, "\ud800", FlatError),
    (LETTERS, Plain.A, FlatError),  # an Enum that is not a str
    (LETTERS, 0, FlatError),
    (LETTERS, None, FlatError),
    ("boolean", True, b"\x01"),
    ("boolean", False, b"\x00"),
    ("boolean", 1, FlatError),
    ("boolean", 0, FlatError),
    ("boolean", None, FlatError),
    ("null", None, b""),
    ("null", 0, FlatError),
    ("null", False, FlatError),
    (["null", "long"], None, b"\x00"),
    (["null", "long"], 5, b"\x02\x0a"),
    (["null", "long"], True, FlatError),
    (["null", "string"], "", b"\x02\x00"),
    (["null", "string"], Text(""), FlatError),
    (["null", LETTERS], Letter.A, b"\x02\x00"),
    (["null", "boolean"], 0, FlatError),
]


@needs_c
@pytest.mark.parametrize(("type_", "value", "expected"), WRITES)
def test_edge_values_are_written_or_refused_alike(type_: Any, value: Any, expected: Any) -> None:
    c, py = pair(record_of("long", type_))
    obj = SimpleNamespace(f0=1, f1=value)
    got = same_write(c, py, obj, b"H")
    if isinstance(expected, bytes):
        assert got == ("value", (bytes, b"H\x02" + expected))
        assert got[1][1][1:] == avro_body(
            record_of("long", type_), {"f0": 1, "f1": getattr(value, "value", value)}
        )
    else:
        assert got == ("raises", expected)


@needs_c
def test_attribute_errors_and_bad_heads_are_raised_alike() -> None:
    c, py = pair(record_of("long", "string"))

    class Raising:
        f0 = 1

        @property
        def f1(self) -> str:
            raise KeyError("f1")

    assert same_write(c, py, SimpleNamespace(f0=1)) == ("raises", AttributeError)
    assert same_write(c, py, Raising()) == ("raises", KeyError)
    assert same_write(c, py, SimpleNamespace(f0=1, f1="a"), "head") == ("raises", TypeError)
    # A field's own error comes first, as in the Python (its join comes last).
    assert same_write(c, py, SimpleNamespace(f0=None, f1="a"), "head") == ("raises", FlatError)
    assert same_write(c, py, SimpleNamespace(f0=1, f1="a"), bytearray(b"h")) == (
        "value",
        (bytes, b"h\x02\x02a"),
    )
    for impl in (c, py):
        assert impl.writer()(o=SimpleNamespace(f0=1, f1=""), head=b"") == b"\x02\x00"
        with pytest.raises(TypeError):
            impl.writer()(SimpleNamespace(f0=1, f1=""))  # type: ignore[call-arg]


@needs_c
def test_a_nested_reader_does_not_write() -> None:
    c, _ = pair(record_of(NESTED))
    with pytest.raises(FlatError):
        c.writer()
    with pytest.raises(FlatError):
        c._record.write(SimpleNamespace(f0=[]), b"")  # type: ignore[union-attr]


# --- the C module's own arguments and memory ----------------------------------------------


@needs_c
@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((("a",), (0, 1), (None,), None, FlatError), ValueError),  # lengths differ
        ((("a",), (0,), (None,), (None, None), FlatError), ValueError),
        ((("a",), (99,), (None,), None, FlatError), ValueError),
        ((("a",), (-8,), (None,), None, FlatError), ValueError),
        ((("a",), (13,), (None,), None, FlatError), ValueError),  # nullable null: flat.py has none
        ((("a",), (14,), (None,), None, FlatError), ValueError),  # nullable record
        ((("a",), ("0",), (None,), None, FlatError), ValueError),
        (((1,), (0,), (None,), None, FlatError), TypeError),
        ((("a",), (3,), (["A"],), None, FlatError), TypeError),  # enum symbols: a tuple
        ((("a",), (3,), ((1,),), None, FlatError), TypeError),
        ((("a",), (3,), (("A",),), ({"A": 0},), FlatError), TypeError),  # index: bytes
        ((("a",), (3,), (("A",),), (None,), FlatError), TypeError),  # a writer needs it
        ((("a",), (6,), (None,), None, FlatError), TypeError),  # a record needs a Record
        ((("a",), (6,), (lambda *a: a,), None, FlatError), TypeError),
        ((("a",), (7,), ((),), None, FlatError), TypeError),  # a union needs branches
        ((("a",), (7,), ((("t.A", None),),), None, FlatError), TypeError),
        ((("a",), (7,), (((1, None),),), None, FlatError), TypeError),
        ((("a",), (0,), (None,), None, ValueError()), TypeError),  # error: a class
        ((("a",), (0,), (None,), None, int), TypeError),
        ((["a"], (0,), (None,), None, FlatError), TypeError),
    ],
)
def test_the_record_refuses_arguments_it_cannot_use(args: tuple[Any, ...], error: type) -> None:
    assert flat._flat is not None
    with pytest.raises(error):
        flat._flat.Record(*args)


@needs_c
def test_records_nest_only_so_deep() -> None:
    """Deeper than flat.py's own recursion over a schema reaches, not so deep that the C reader
    (one call per level) could run out of stack."""
    assert flat._flat is not None
    record = flat._flat.Record((), (), (), None, FlatError)
    levels = 0
    with pytest.raises(ValueError, match="deep"):
        while levels < 5000:
            record = flat._flat.Record(("r",), (flat._RECORD,), (record,), None, FlatError)
            levels += 1
    assert levels > sys.getrecursionlimit() // 3  # _kind, _nested_body, _fields per level
    values, end = record(b"", 0, 0)
    for _ in range(levels):
        (values,) = values
    assert values == [] and end == 0


def _exercise(records: list[tuple[FlatRecord, list[bytes], list[Any]]]) -> None:
    for record, inputs, objs in records:
        for data in inputs:
            try:
                record.decode(data)
            except FlatError:
                pass
        if objs:
            write = record.writer()
            for obj in objs:
                try:
                    write(obj, b"\xc3\x01")
                except (FlatError, UnicodeEncodeError, AttributeError):
                    pass


@needs_c
def test_reading_and_writing_leak_nothing() -> None:
    """Every path, the refusals' too, gives back what it takes: memory stays flat over
    thousands of calls, and the reference counts of what the records hand out (enum symbols,
    union names) are where they were."""
    status = compiled(CATALOGUE.current("io.jobwheel.StatusEvent").parsed, True)
    good = StatusEvent("e", "j", State.SUCCEEDED, 1, "w", run_id="r", task="é" * 100)
    body = Codec().encode(good)[10:]
    inputs = [body, body[:-1], body + b"\x00", b"\xff" * 30, body[:5] + b"\xff" + body[6:]]
    inputs += [body[:cut] for cut in range(0, len(body), 7)]
    objs: list[Any] = [good, SimpleNamespace(**{**vars_of(good), "seq": True})]
    objs += [SimpleNamespace(**{**vars_of(good), "task": "\ud800"}), SimpleNamespace()]
    # Symbols and names made here (not interned, not shared): only the records hold them.
    symbol, name = "".join(["SY", "M"]), "".join(["t.", "Only"])
    letters = {"type": "enum", "name": "t.L", "symbols": [symbol, "OTHER"]}
    branches = [{"type": "record", "name": name, "fields": [{"name": "e", "type": letters}]}]
    nested = compiled(record_of(branches, NESTED, "long"), True)
    valid = b"\x00\x00\x02a\x04"
    nested_inputs = [
        valid,
        valid[:-1],
        valid + b"\x00",
        b"\x00\x04",
        b"\x02",
        b"\x00\x00\x02\xff\x04",
    ]
    flat_letters = compiled(record_of(letters, "string"), True)
    letter_objs = [SimpleNamespace(f0=symbol, f1="a"), SimpleNamespace(f0="NO", f1="a")]
    records = [
        (status, inputs, objs),
        (nested, nested_inputs, []),
        (flat_letters, [b"\x00\x02a", b"\x04\x02a", b"\x00"], letter_objs),
    ]
    assert nested.decode(valid) == [(name, [symbol]), ["a"], 2]
    _exercise(records)  # warm: interned names, free lists
    gc.collect()
    before = sys.getrefcount(symbol), sys.getrefcount(name)
    tracemalloc.start()
    try:
        _exercise(records)
        gc.collect()
        start = tracemalloc.get_traced_memory()[0]
        for _ in range(2000):
            _exercise(records)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, grown  # one object kept per call would be ~1 MB per kind of call
    assert (sys.getrefcount(symbol), sys.getrefcount(name)) == before


def vars_of(value: Any) -> dict[str, Any]:
    return {name: getattr(value, name) for name in value.__slots__}
