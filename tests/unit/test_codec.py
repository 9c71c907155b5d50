"""The codec's framing is what other services (and other languages) rely on to read our records."""

from __future__ import annotations

import io
import json
import struct

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

from jobwheel.errors import SchemaDecodeError, ValidationError
from jobwheel.schemas import flat
from jobwheel.schemas.codec import Codec, SchemaCatalogue, crc64_avro, default_codec
from jobwheel.schemas.models import (
    After,
    CancelJob,
    ConcurrencyPolicy,
    Cron,
    JobCommand,
    Run,
    ScheduleJob,
    State,
    StatusEvent,
)

COMMAND = JobCommand(
    command_id="c-1",
    job_id="job-1",
    issued_at_ms=1_700_000_000_000,
    body=ScheduleJob(
        task="demo.echo",
        trigger=Cron("30 2 * * *", "Europe/Berlin"),
        args_json='{"x": 1}',
        starting_deadline_ms=60_000,
        concurrency_policy=ConcurrencyPolicy.FORBID,
        idempotency_key="k-1",
    ),
)


#: The default codec (the C fast path where it is built) and one on the generated Python.
CODECS = {True: default_codec(), False: Codec(native=False)}


@pytest.fixture(
    params=[
        pytest.param(
            True,
            id="c",
            marks=pytest.mark.skipif(flat._flat is None, reason="schemas/_flat.c is not built"),
        ),
        pytest.param(False, id="python"),
    ]
)
def native(request: pytest.FixtureRequest) -> bool:
    """Which implementation of the fast path (schemas/flat.py) a test's codecs use."""
    return bool(request.param)


@pytest.fixture
def codec(native: bool) -> Codec:
    return CODECS[native]


class FakeRegistry:
    """In-process stand-in for a Schema Registry: ids are global, subjects keep their ids."""

    def __init__(self) -> None:
        self.schemas: dict[int, str] = {}
        self.subjects: dict[tuple[str, str], int] = {}
        self.register_calls = 0
        self.lookup_calls = 0

    def register(self, subject: str, schema_str: str) -> int:
        self.register_calls += 1
        key = (subject, schema_str)
        if key not in self.subjects:
            self.subjects[key] = 100 + len(self.schemas)
            self.schemas[self.subjects[key]] = schema_str
        return self.subjects[key]

    def lookup(self, schema_id: int) -> str | None:
        self.lookup_calls += 1
        return self.schemas.get(schema_id)


def test_crc64_avro_matches_the_spec_and_fastavro() -> None:
    # The Avro spec's test vector for the schema "null".
    assert crc64_avro(b'"null"') == 7195948357588979594
    for v in SchemaCatalogue.load().versions:
        assert v.fingerprint.hex() == fingerprint(v.canonical, "CRC-64-AVRO")


def test_single_object_framing_is_readable_with_plain_avro(native: bool) -> None:
    codec = Codec(native=native)
    data = codec.encode(COMMAND)
    current = codec.catalogue.current("io.jobwheel.JobCommand")  # what encode writes
    assert current.label() == "job_command.v4"
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == current.fingerprint
    # What a service in another language does: parse the schema file, skip the header.
    schema = parse_schema(json.loads(json.dumps(current.source)))
    record = schemaless_reader(io.BytesIO(data[10:]), schema, None, return_record_name=True)
    assert record["job_id"] == "job-1"
    assert record["body"][0] == "io.jobwheel.ScheduleJob"
    assert record["body"][1]["trigger"] == (
        "io.jobwheel.Cron",
        {"expression": "30 2 * * *", "timezone": "Europe/Berlin"},
    )
    assert codec.decode(data) == COMMAND


def test_decode_accepts_bytearray_and_memoryview(codec: Codec) -> None:
    data = codec.encode(COMMAND)
    assert codec.decode(bytearray(data)) == COMMAND
    assert codec.decode(memoryview(data)) == COMMAND
    run = _run_bytes(codec)
    assert codec.decode(bytearray(run)) == codec.decode(memoryview(run)) == codec.decode(run)


def _run_bytes(codec: Codec) -> bytes:
    run = Run("job-1@1", "job-1", "demo.echo", "{}", 1, 1, 2, 1, 3, None, 30_000, 30_002, 0, 7)
    return codec.encode(run)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"", "starts with nothing"),
        (b"hello world", "not a jobwheel message"),
        (b"\xc3\x01\x00\x01", "truncated header"),
        (b"\xc3\x01" + b"\x00" * 8 + b"\x02a", "unknown schema fingerprint"),
        (b"\x00\x00\x00\x00\x05\x02a", "no Schema Registry"),
    ],
)
def test_undecodable_bytes_raise_schema_decode_error_keeping_the_bytes(
    codec: Codec, data: bytes, needle: str
) -> None:
    with pytest.raises(SchemaDecodeError, match=needle) as info:
        codec.decode(data)
    assert info.value.raw == data


def test_truncated_body_keeps_bytes_and_cause(codec: Codec) -> None:
    data = _run_bytes(codec)
    for cut in (11, len(data) // 2, len(data) - 1):
        with pytest.raises(SchemaDecodeError, match="does not decode as run.v2") as info:
            codec.decode(data[:cut])
        assert info.value.raw == data[:cut]
        assert info.value.__cause__ is not None
        assert codec.decode_fields(data[:cut]) is None


def test_trailing_bytes_are_rejected(codec: Codec) -> None:
    data = _run_bytes(codec) + b"\x00"
    with pytest.raises(SchemaDecodeError, match="trailing"):
        codec.decode(data)
    assert codec.decode_fields(data) is None


def test_garbage_body_with_a_valid_header_is_a_decode_error(codec: Codec) -> None:
    header = _run_bytes(codec)[:10]
    with pytest.raises(SchemaDecodeError) as info:
        codec.decode(header + b"\xff" * 40)
    assert info.value.raw == header + b"\xff" * 40


def test_non_bytes_is_a_decode_error(codec: Codec) -> None:
    with pytest.raises(SchemaDecodeError):
        codec.decode("c301")  # type: ignore[arg-type]
    assert codec.decode_fields(bytearray(_run_bytes(codec))) is None  # type: ignore[arg-type]


def test_encode_refuses_other_types_and_ill_typed_fields(codec: Codec) -> None:
    with pytest.raises(ValidationError):
        codec.encode(ScheduleJob("t", After(1)))  # type: ignore[arg-type]
    bad = JobCommand("c", "j", "not-a-number", CancelJob())  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        codec.encode(bad)
    run = Run("r", "j", "t", "{}", 1, 1, 2, None, 3, None, 30_000, 30_002, 0, 7)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        codec.encode(run)  # None for an int: the fast path leaves it to fastavro, which refuses


def test_a_string_utf8_cannot_encode_is_a_validation_error(codec: Codec) -> None:
    """A lone surrogate (an undecodable byte of a file name, as os.fsdecode gives it) cannot
    be UTF-8: a clear ValidationError naming the field's text, not a UnicodeEncodeError from
    the fast path that a caller does not expect."""
    event = StatusEvent("e", "j", State.FAILED, 1, "worker", "r", error="no file report-\udcff")
    with pytest.raises(ValidationError, match="surrogates not allowed"):
        codec.encode(event)


def test_confluent_framing_with_a_registry(native: bool) -> None:
    registry = FakeRegistry()
    codec = Codec(registry=registry, native=native)
    first = codec.encode(COMMAND)
    codec.encode(COMMAND)
    assert registry.register_calls == 1  # the id is cached per model type
    ((subject, schema_str),) = registry.subjects
    assert subject == "io.jobwheel.JobCommand"
    assert to_parsing_canonical_form(parse_schema(json.loads(schema_str))) == (
        codec.catalogue.current("io.jobwheel.JobCommand").canonical
    )
    schema_id = registry.subjects[(subject, schema_str)]
    assert first[0] == 0
    assert struct.unpack(">I", first[1:5]) == (schema_id,)
    assert codec.decode(first) == COMMAND

    # Another process with the same registry decodes it by looking the id up once.
    reader = Codec(registry=registry, native=native)
    assert reader.decode(first) == COMMAND
    assert reader.decode(first) == COMMAND
    assert registry.lookup_calls == 1

    # A registry-configured reader still reads single-object records (switching framing).
    assert reader.decode(Codec().encode(COMMAND)) == COMMAND


def test_registry_resolves_an_older_writer_version_to_the_current(native: bool) -> None:
    registry = FakeRegistry()
    v1 = next(v for v in SchemaCatalogue.load().versions if v.label() == "job_command.v1")
    schema_id = registry.register("io.jobwheel.JobCommand", json.dumps(v1.source))
    body = io.BytesIO()
    schemaless_writer(
        body,
        v1.parsed,
        {
            "command_id": "c",
            "job_id": "j",
            "issued_at_ms": 5,
            "body": ("io.jobwheel.ScheduleJob", {"task": "t", "trigger": ("io.jobwheel.Now", {})}),
        },
    )
    data = struct.pack(">bI", 0, schema_id) + body.getvalue()
    decoded = Codec(registry=registry, native=native).decode(data)
    assert isinstance(decoded.body, ScheduleJob)
    assert decoded.body.concurrency_policy is ConcurrencyPolicy.ALLOW
    assert decoded.body.starting_deadline_ms is None


def test_registry_unknown_id_and_foreign_schema_are_decode_errors() -> None:
    registry = FakeRegistry()
    codec = Codec(registry=registry)
    with pytest.raises(SchemaDecodeError, match="unknown to the registry"):
        codec.decode(b"\x00\x00\x00\x03\xe7\x02")
    foreign = registry.register("other", json.dumps({"type": "record", "name": "X", "fields": []}))
    with pytest.raises(SchemaDecodeError, match="not a jobwheel record"):
        codec.decode(struct.pack(">bI", 0, foreign))
    with pytest.raises(SchemaDecodeError, match="truncated header"):
        codec.decode(b"\x00\x00\x01")


def test_an_unreachable_registry_is_a_registry_error_not_a_bad_record() -> None:
    """The real registry client against a closed loopback port: a transient failure the caller
    retries, never a SchemaDecodeError that would dead-letter a good record."""
    from jobwheel.errors import SchemaRegistryError

    codec = Codec("http://127.0.0.1:1")
    event = StatusEvent("e-1", "job-1", State.SUCCEEDED, 10, "worker")
    with pytest.raises(SchemaRegistryError, match="Connection refused"):
        codec.encode(event)


def test_status_event_state_is_an_enum_after_decode(codec: Codec) -> None:
    event = StatusEvent("e-1", "job-1", State.SUCCEEDED, 10, "worker", duration_ms=5)
    decoded = codec.decode(codec.encode(event))
    assert decoded == event
    assert decoded.state is State.SUCCEEDED


def test_readme_lists_the_current_fingerprints_and_partition_vectors() -> None:
    """Other-language services copy these numbers from schemas/README.md; keep them true."""
    from pathlib import Path

    from jobwheel.schemas.partitioning import murmur2, partition_for

    readme = (Path(__file__).resolve().parents[2] / "schemas" / "README.md").read_text()
    for v in SchemaCatalogue.load().versions:
        signed = struct.unpack("<q", v.fingerprint)[0]
        assert f"| `{v.label()}.avsc" in readme
        assert f"| {signed} | `{v.fingerprint.hex(' ')}` |" in readme, v.label()
    for job_id in ("job-1", "nightly-report", "3f2a9c0e7b6d4e1f8a9b0c1d2e3f4a5b"):
        h = murmur2(job_id.encode())
        row = f"| `{job_id}` | {h} | {h & 0x7FFFFFFF} | {partition_for(job_id, 12)} |"
        assert row in readme, job_id
