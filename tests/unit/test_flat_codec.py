"""The fast path for flat records (``schemas/flat.py``) must be fastavro, only quicker: the same
bytes for every value it encodes, the same values for every body it decodes, and a fall back
to fastavro (its result or its error) for everything else.

Every test runs twice: on the C reader and writer (``schemas/_flat.c``, what a built install
uses) and on the generated Python (the fallback and the reference). The two held to each other,
input for input, are tests/unit/test_flat_native.py."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import pytest
from fastavro import schemaless_reader, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobwheel.errors import SchemaDecodeError, ValidationError
from jobwheel.schemas import flat as flat_module
from jobwheel.schemas.codec import Codec, SchemaCatalogue
from jobwheel.schemas.conversions import KINDS
from jobwheel.schemas.flat import FlatError, FlatRecord
from jobwheel.schemas.models import (
    After,
    At,
    CancelJob,
    ConcurrencyPolicy,
    Cron,
    Every,
    JobCommand,
    Now,
    PauseJob,
    ReplayRun,
    ResumeJob,
    Run,
    ScheduleJob,
    State,
    StatusEvent,
    TriggerJob,
)

#: The codec on each implementation of the fast path; a test takes ``native`` (True: the C).
CODECS = {True: Codec(), False: Codec(native=False)}
implementations = pytest.mark.parametrize(
    "native",
    [
        pytest.param(
            True,
            id="c",
            marks=pytest.mark.skipif(
                flat_module._flat is None,
                reason="schemas/_flat.c is not built (test_flat_native.py: should it be?)",
            ),
        ),
        pytest.param(False, id="python"),
    ],
)
CATALOGUE = SchemaCatalogue.load()
RUN_V1 = CATALOGUE.current("io.jobwheel.Run")
STATUS = CATALOGUE.current("io.jobwheel.StatusEvent")
STATUS_V1 = next(v for v in CATALOGUE.versions if v.label() == "status_event.v1")

text = st.text(max_size=40)
longs = st.integers(-(2**63), 2**63 - 1)
ints = st.integers(-(2**31), 2**31 - 1)


def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


runs = st.builds(
    Run,
    run_id=text,
    job_id=text,
    task=text,
    args_json=text,
    seq=longs,
    scheduled_time_ms=longs,
    dispatched_at_ms=longs,
    attempt=ints,
    max_attempts=ints,
    timeout_ms=optional(longs),
    visibility_timeout_ms=longs,
    deadline_ms=longs,
    partition=ints,
    fencing_token=longs,
)
events = st.builds(
    StatusEvent,
    event_id=text,
    job_id=text,
    state=st.sampled_from(list(State)),
    event_time_ms=longs,
    source=text,
    run_id=optional(text),
    seq=longs,
    attempt=ints,
    task=optional(text),
    scheduled_time_ms=optional(longs),
    worker=optional(text),
    error=optional(text),
    reason=optional(text),
    result_json=optional(text),
    duration_ms=optional(longs),
    next_fire_ms=optional(longs),
    deadline_ms=optional(longs),
    retry_delay_ms=optional(longs),
    started_ms=optional(longs),
)


def fastavro_body(value: Run | StatusEvent, schema: dict[str, Any]) -> bytes:
    record = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, StatusEvent):
        record["state"] = str(value.state)
    out = io.BytesIO()
    schemaless_writer(out, schema, record)
    return out.getvalue()


def test_each_codec_runs_on_its_implementation() -> None:
    """So that the ``c`` tests do not run the Python twice without a word."""
    for native, codec in CODECS.items():
        expected = native and flat_module._flat is not None
        for reader in codec._readers.values():
            assert reader.fast is None or reader.fast.native is expected
        writer = codec._writers[Run].write
        assert writer is not None and (getattr(writer, "__self__", None) is not None) is expected


@implementations
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(value=runs | events)
def test_encodes_exactly_as_fastavro_and_round_trips(
    native: bool, value: Run | StatusEvent
) -> None:
    codec = CODECS[native]
    version = RUN_V1 if isinstance(value, Run) else STATUS
    data = codec.encode(value)
    assert data == b"\xc3\x01" + version.fingerprint + fastavro_body(value, version.parsed)
    assert codec.decode(data) == value


@implementations
@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(value=events, times=st.lists(longs, min_size=1, max_size=40))
def test_timestamps_seen_before_encode_as_the_first_time(
    native: bool, value: StatusEvent, times: list[int]
) -> None:
    """The Python encoder keeps the varints of recent large values (see ``flat._RECENT``): an
    event written again after others, and after that memory was emptied, gives the same bytes."""
    codec = CODECS[native]
    first = codec.encode(value)
    for t in times * 10:  # more distinct values than the memory holds: it is emptied
        codec.encode(dataclasses.replace(value, event_time_ms=t, deadline_ms=t // 2))
    assert codec.encode(value) == first
    assert first == b"\xc3\x01" + STATUS.fingerprint + fastavro_body(value, STATUS.parsed)


@implementations
@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.binary(max_size=120), which=st.sampled_from([RUN_V1, STATUS, STATUS_V1]))
def test_random_bodies_decode_as_fastavro_says_or_not_at_all(
    native: bool, body: bytes, which: Any
) -> None:
    flat = FlatRecord.compile(which.parsed, native=native)
    assert flat is not None and flat.native is native
    try:
        values = flat.decode(body)
    except FlatError:
        values = None
    if values is not None:  # the fast path vouches for it: fastavro must agree exactly
        stream = io.BytesIO(body)
        expected = schemaless_reader(stream, which.parsed, None)
        assert stream.tell() == len(body)
        assert dict(zip(flat.names, values, strict=True)) == expected
    # And the codec never fails differently from fastavro's own verdict.
    data = b"\xc3\x01" + which.fingerprint + body
    try:
        CODECS[native].decode(data)
    except SchemaDecodeError:
        assert values is None


@implementations
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(event=events)
def test_a_v1_body_is_read_as_v2_by_both_paths(native: bool, event: StatusEvent) -> None:
    codec = CODECS[native]
    old = dataclasses.replace(event, started_ms=None)
    data = b"\xc3\x01" + STATUS_V1.fingerprint + fastavro_body(old, STATUS_V1.parsed)
    assert codec.decode(data) == old
    decoded = codec.decode_fields(data)
    assert decoded is not None
    name, names, values = decoded
    assert name == "io.jobwheel.StatusEvent" and "started_ms" not in names
    assert values[names.index("event_id")] == old.event_id


@implementations
def test_values_of_the_wrong_type_are_left_to_fastavro(native: bool) -> None:
    codec = CODECS[native]
    good = StatusEvent("e", "j", State.SCHEDULED, 1, "scheduler")
    with pytest.raises(ValidationError, match="does not fit"):
        codec.encode(dataclasses.replace(good, seq="7"))  # type: ignore[arg-type]
    # fastavro writes an "int" beyond 32 bits; the fast path leaves that to it, and reads it
    # back through fastavro as well.
    wide = dataclasses.replace(good, attempt=2**40)
    assert codec.encode(wide)[10:] == fastavro_body(wide, STATUS.parsed)
    assert codec.decode(codec.encode(wide)) == wide
    assert codec.decode_fields(codec.encode(wide)) is None
    # A bool is an int to fastavro; whatever it writes, the fast path did not write it.
    flat = FlatRecord.compile(STATUS.parsed, native=native)
    assert flat is not None
    with pytest.raises(FlatError):
        flat.writer()(dataclasses.replace(good, seq=True), b"")


@implementations
def test_non_flat_schemas_get_no_flat_codec(native: bool) -> None:
    command = CATALOGUE.current("io.jobwheel.JobCommand")
    assert FlatRecord.compile(command.parsed, native=native) is None


COMMAND = CATALOGUE.current("io.jobwheel.JobCommand")
maybe_text = optional(text)
triggers = (
    st.builds(Now)
    | st.builds(At, longs)
    | st.builds(After, longs)
    | st.builds(Every, longs, optional(longs))
    | st.builds(Cron, text, text)
)
bodies = (
    st.builds(
        ScheduleJob,
        task=text,
        trigger=triggers,
        args_json=text,
        max_attempts=ints,
        timeout_ms=optional(longs),
        visibility_timeout_ms=longs,
        starting_deadline_ms=optional(longs),
        concurrency_policy=st.sampled_from(list(ConcurrencyPolicy)),
        idempotency_key=maybe_text,
    )
    | st.builds(CancelJob, maybe_text)
    | st.builds(PauseJob, maybe_text)
    | st.builds(ResumeJob, maybe_text)
    | st.builds(TriggerJob, maybe_text)
    | st.builds(
        ReplayRun,
        run_id=text,
        scheduled_time_ms=longs,
        attempt=ints,
        task=text,
        args_json=text,
        max_attempts=ints,
        timeout_ms=optional(longs),
        visibility_timeout_ms=longs,
        reason=maybe_text,
    )
)
commands = st.builds(JobCommand, command_id=text, job_id=text, issued_at_ms=longs, body=bodies)


def fastavro_command(data: bytes) -> JobCommand:
    """What the codec decoded before the fast path: fastavro, then the conversions."""
    stream = io.BytesIO(data)
    stream.seek(10)
    record = schemaless_reader(stream, COMMAND.parsed, None, return_record_name=True)
    return KINDS["io.jobwheel.JobCommand"].from_avro(record)


@implementations
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(command=commands)
def test_commands_decode_as_fastavro_reads_them(native: bool, command: JobCommand) -> None:
    """A command (records nested in it: the body, the trigger) read by the fast path is the
    command fastavro reads, and the command that was written."""
    codec = CODECS[native]
    data = codec.encode(command)
    reader = codec._readers[data[2:10]]
    assert reader.make is not None and reader.fast is not None  # the fast path is the one taken
    assert reader.fast.native is native
    decoded = codec.decode(data)
    assert decoded == fastavro_command(data) == command
    assert type(decoded.body) is type(command.body)


@implementations
@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.binary(max_size=120))
def test_random_command_bodies_decode_as_fastavro_says_or_not_at_all(
    native: bool, body: bytes
) -> None:
    codec = CODECS[native]
    reader = FlatRecord.compile_nested(COMMAND.parsed, native=native)
    assert reader is not None and reader.native is native
    data = b"\xc3\x01" + COMMAND.fingerprint + body
    try:
        values = reader.decode(body)
    except FlatError:
        values = None
    if values is not None:  # the fast path vouches for it: fastavro must read the same
        stream = io.BytesIO(body)
        schemaless_reader(stream, COMMAND.parsed, None)
        assert stream.tell() == len(body)
        assert codec.decode(data) == fastavro_command(data)
    try:
        codec.decode(data)
    except SchemaDecodeError:
        assert values is None


@implementations
def test_a_nested_reader_does_not_encode(native: bool) -> None:
    reader = FlatRecord.compile_nested(COMMAND.parsed, native=native)
    assert reader is not None and FlatRecord.compile(COMMAND.parsed, native=native) is None
    with pytest.raises(FlatError):
        reader.writer()


def fastavro_command_bytes(command: JobCommand) -> bytes:
    """What the codec wrote before the fast path: the conversions' dicts, then fastavro."""
    out = io.BytesIO()
    out.write(b"\xc3\x01" + COMMAND.fingerprint)
    schemaless_writer(out, COMMAND.parsed, KINDS["io.jobwheel.JobCommand"].to_avro(command))
    return out.getvalue()


@implementations
@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(command=commands)
def test_commands_encode_exactly_as_fastavro(native: bool, command: JobCommand) -> None:
    """A command (its body and trigger records nested in it) written by the fast path is
    byte for byte what fastavro writes; a value fastavro refuses is refused the same way."""
    codec = CODECS[native]
    assert codec._writers[JobCommand].write is not None  # the fast path is the one taken
    try:
        expected: bytes | None = fastavro_command_bytes(command)
    except (TypeError, ValueError, OverflowError):
        expected = None
    if expected is None:
        with pytest.raises(ValidationError):
            codec.encode(command)
        return
    assert codec.encode(command) == expected
    assert codec._writers[JobCommand].write(command, b"") == expected[10:]


@implementations
def test_a_command_the_fast_writer_cannot_vouch_for_is_left_to_fastavro(native: bool) -> None:
    codec = CODECS[native]
    write = codec._writers[JobCommand].write
    assert write is not None
    odd = JobCommand("c", "j", 1, CancelJob(reason="\ud800"))  # a lone surrogate
    with pytest.raises((FlatError, UnicodeEncodeError)):
        write(odd, b"")
    with pytest.raises(ValidationError):
        codec.encode(odd)  # fastavro's verdict, as before the fast path
    wrong = JobCommand("c", "j", 1, "not a body")  # type: ignore[arg-type]
    with pytest.raises(FlatError):
        write(wrong, b"")
    with pytest.raises(ValidationError):
        codec.encode(wrong)
    schedule = ScheduleJob(task="t", trigger=At(2**63), args_json="{}")  # past a long
    with pytest.raises(FlatError):
        write(JobCommand("c", "j", 1, schedule), b"")
    with pytest.raises(ValidationError):
        codec.encode(JobCommand("c", "j", 1, schedule))
