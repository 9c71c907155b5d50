"""The fast path for flat records (``schemas/flat.py``) must be fastavro, only quicker: the same
bytes for every value it encodes, the same values for every body it decodes, and a fall back
to fastavro (its result or its error) for everything else."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import pytest
from fastavro import schemaless_reader, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobwheel.errors import SchemaDecodeError, ValidationError
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

CODEC = Codec()
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


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(value=runs | events)
def test_encodes_exactly_as_fastavro_and_round_trips(value: Run | StatusEvent) -> None:
    version = RUN_V1 if isinstance(value, Run) else STATUS
    data = CODEC.encode(value)
    assert data == b"\xc3\x01" + version.fingerprint + fastavro_body(value, version.parsed)
    assert CODEC.decode(data) == value


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(value=events, times=st.lists(longs, min_size=1, max_size=40))
def test_timestamps_seen_before_encode_as_the_first_time(
    value: StatusEvent, times: list[int]
) -> None:
    """The encoder keeps the varints of recent large values (see ``flat._RECENT``): an event
    written again after others, and after that memory was emptied, gives the same bytes."""
    first = CODEC.encode(value)
    for t in times * 10:  # more distinct values than the memory holds: it is emptied
        CODEC.encode(dataclasses.replace(value, event_time_ms=t, deadline_ms=t // 2))
    assert CODEC.encode(value) == first
    assert first == b"\xc3\x01" + STATUS.fingerprint + fastavro_body(value, STATUS.parsed)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.binary(max_size=120), which=st.sampled_from([RUN_V1, STATUS, STATUS_V1]))
def test_random_bodies_decode_as_fastavro_says_or_not_at_all(body: bytes, which: Any) -> None:
    flat = FlatRecord.compile(which.parsed)
    assert flat is not None
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
        CODEC.decode(data)
    except SchemaDecodeError:
        assert values is None


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(event=events)
def test_a_v1_body_is_read_as_v2_by_both_paths(event: StatusEvent) -> None:
    old = dataclasses.replace(event, started_ms=None)
    data = b"\xc3\x01" + STATUS_V1.fingerprint + fastavro_body(old, STATUS_V1.parsed)
    assert CODEC.decode(data) == old
    decoded = CODEC.decode_fields(data)
    assert decoded is not None
    name, names, values = decoded
    assert name == "io.jobwheel.StatusEvent" and "started_ms" not in names
    assert values[names.index("event_id")] == old.event_id


def test_values_of_the_wrong_type_are_left_to_fastavro() -> None:
    good = StatusEvent("e", "j", State.SCHEDULED, 1, "scheduler")
    with pytest.raises(ValidationError, match="does not fit"):
        CODEC.encode(dataclasses.replace(good, seq="7"))  # type: ignore[arg-type]
    # fastavro writes an "int" beyond 32 bits; the fast path leaves that to it, and reads it
    # back through fastavro as well.
    wide = dataclasses.replace(good, attempt=2**40)
    assert CODEC.encode(wide)[10:] == fastavro_body(wide, STATUS.parsed)
    assert CODEC.decode(CODEC.encode(wide)) == wide
    assert CODEC.decode_fields(CODEC.encode(wide)) is None
    # A bool is an int to fastavro; whatever it writes, the fast path did not write it.
    flat = FlatRecord.compile(STATUS.parsed)
    assert flat is not None
    with pytest.raises(FlatError):
        flat.writer()(dataclasses.replace(good, seq=True), b"")


def test_non_flat_schemas_get_no_flat_codec() -> None:
    command = CATALOGUE.current("io.jobwheel.JobCommand")
    assert FlatRecord.compile(command.parsed) is None


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


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(command=commands)
def test_commands_decode_as_fastavro_reads_them(command: JobCommand) -> None:
    """A command (records nested in it: the body, the trigger) read by the fast path is the
    command fastavro reads, and the command that was written."""
    data = CODEC.encode(command)
    assert CODEC._readers[data[2:10]].make is not None  # the fast path is the one taken
    decoded = CODEC.decode(data)
    assert decoded == fastavro_command(data) == command
    assert type(decoded.body) is type(command.body)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.binary(max_size=120))
def test_random_command_bodies_decode_as_fastavro_says_or_not_at_all(body: bytes) -> None:
    reader = FlatRecord.compile_nested(COMMAND.parsed)
    assert reader is not None
    data = b"\xc3\x01" + COMMAND.fingerprint + body
    try:
        values = reader.decode(body)
    except FlatError:
        values = None
    if values is not None:  # the fast path vouches for it: fastavro must read the same
        stream = io.BytesIO(body)
        schemaless_reader(stream, COMMAND.parsed, None)
        assert stream.tell() == len(body)
        assert CODEC.decode(data) == fastavro_command(data)
    try:
        CODEC.decode(data)
    except SchemaDecodeError:
        assert values is None


def test_a_nested_reader_does_not_encode() -> None:
    reader = FlatRecord.compile_nested(COMMAND.parsed)
    assert reader is not None and FlatRecord.compile(COMMAND.parsed) is None
    with pytest.raises(FlatError):
        reader.writer()
