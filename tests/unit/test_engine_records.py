"""The scheduler's record handlers against anything its topics can hold: random bytes, random
Avro-shaped commands and events (any field value the encoding allows), keys that match or do
not. Nothing may escape a handler; a command either changes a job or is answered with a
REJECTED event, and everything undecodable or invalid is dead-lettered with the reason (a
valid command for a job the scheduler does not know is answered, not dead-lettered).

The handlers are driven without Kafka: an engine that never connects, one ready partition on an
in-memory state, records as the consumer wrapper hands them over.
"""

from __future__ import annotations

import io
from typing import Any

from fastavro import schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobwheel.schemas.codec import SchemaCatalogue, default_codec
from jobwheel.schemas.deadletter import REPLAYED_FROM_HEADER
from jobwheel.schemas.models import After, JobCommand, Now, ScheduleJob, State, StatusEvent
from jobwheel.schemas.partitioning import partition_for
from jobwheel.schemas.topics import DISPATCHED_HEADER, ERROR_HEADER, STATE_HEADER
from jobwheel.settings import Settings
from jobwheel.streams.engine import Phase, SchedulerEngine, _Out
from jobwheel.streams.kafka import Record
from jobwheel.streams.processor import SchedulerProcessor
from jobwheel.streams.state.partition import MemoryBackend, PartitionState

T0 = 1_800_000_000_000
SETTINGS = Settings(_env_file=None, topic_prefix="p", partitions=1)  # type: ignore[call-arg]
TOPICS = SETTINGS.topics
CATALOGUE = SchemaCatalogue.load()
CODEC = default_codec()


def ready_engine() -> SchedulerEngine:
    engine = SchedulerEngine(SETTINGS)
    state = PartitionState(MemoryBackend())
    from jobwheel.streams.engine import PartitionTask

    task = PartitionTask(0, state.backend, state, phase=Phase.READY)  # type: ignore[arg-type]
    task.processor = SchedulerProcessor(0, state, fencing_token=1)
    engine.tasks[0] = task
    return engine


def value_for(avro_type: Any, draw: st.DrawFn, depth: int = 0) -> Any:
    """A value the Avro encoding of ``avro_type`` accepts, drawn wide (huge and negative
    numbers, odd text)."""
    if isinstance(avro_type, list):
        return value_for(draw(st.sampled_from(avro_type)), draw, depth)
    if isinstance(avro_type, dict):
        kind = avro_type.get("type")
        if kind == "enum":
            return draw(st.sampled_from(avro_type["symbols"]))
        if kind == "record":
            fields = avro_type["fields"]
            if depth > 3:
                raise ValueError("too deep")
            return {f["name"]: value_for(f["type"], draw, depth + 1) for f in fields}
        return value_for(kind, draw, depth)
    if isinstance(avro_type, str) and "." in avro_type:
        raise ValueError("named type reference")
    return {
        "null": None,
        "string": draw(st.text(max_size=40) | st.sampled_from(["", " ", "a\nb", "x" * 300])),
        "int": draw(st.integers(-(2**31), 2**31 - 1)),
        "long": draw(st.integers(-(2**63), 2**63 - 1) | st.integers(-5, 10**13)),
        "boolean": draw(st.booleans()),
    }[avro_type]


@st.composite
def avro_keyed(draw: st.DrawFn, full_name: str) -> tuple[bytes | None, bytes]:
    """A record of a real schema version, every field drawn wide, framed as the SDK frames;
    keyed by its job id most of the time (so the rules behind the key check are reached)."""
    versions = [v for v in CATALOGUE.versions if v.full_name == full_name]
    version = draw(st.sampled_from(versions))
    try:
        record = value_for(version.parsed, draw)
    except ValueError:
        return None, b"\xc3\x01" + version.fingerprint
    body = io.BytesIO()
    try:
        schemaless_writer(body, version.parsed, record)
    except (ValueError, TypeError, OverflowError):
        return None, b"\xc3\x01" + version.fingerprint + draw(st.binary(max_size=40))
    job_id = record.get("job_id")
    key = job_id.encode("utf-8", "surrogatepass") if isinstance(job_id, str) else None
    if draw(st.integers(0, 9)) < 3:
        key = draw(st.none() | st.binary(max_size=20))
    return key, b"\xc3\x01" + version.fingerprint + body.getvalue()


def good_command(job_id: str) -> bytes:
    body = ScheduleJob("demo.echo", After(5_000))
    return CODEC.encode(JobCommand(f"c-{job_id}", job_id, T0, body))


keys = st.one_of(st.none(), st.binary(max_size=40), st.text(max_size=40).map(str.encode))
#: Headers as the consumer hands them over: any name, and a value that may be None (a header
#: without a value), any bytes, or what the engine reads there (digits, an ack state).
header_values = st.one_of(
    st.none(),
    st.binary(max_size=30),
    st.integers(-(10**25), 10**25).map(lambda n: str(n).encode()),
    st.sampled_from([b"STALE", b"SUCCEEDED", b"", b"\xff", "١٢٣".encode()]),
)
header_names = st.sampled_from(
    [STATE_HEADER, DISPATCHED_HEADER, REPLAYED_FROM_HEADER, ERROR_HEADER]
) | st.text(max_size=12)
headers = st.none() | st.lists(st.tuples(header_names, header_values), max_size=4)
keyed = st.one_of(
    st.tuples(keys, st.none() | st.binary(max_size=120)),
    avro_keyed("io.jobwheel.JobCommand"),
    avro_keyed("io.jobwheel.StatusEvent"),
    avro_keyed("io.jobwheel.Run"),
    st.text(min_size=1, max_size=30).map(lambda j: (j.encode(), good_command(j))),
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=keyed, offset=st.integers(0, 10**6), headers=headers)
def test_any_request_record_changes_a_job_or_is_rejected_and_dead_lettered(
    record: tuple[bytes | None, bytes | None], offset: int, headers: Any
) -> None:
    key, value = record
    engine = ready_engine()
    out: list[_Out] = []
    request = Record(TOPICS.requests, 0, offset, key, value, headers, T0)
    engine._on_request(request, T0, out, set())
    events = [CODEC.decode(r.value) for r in out if r.topic == TOPICS.status]
    dead = [r for r in out if r.topic == TOPICS.dead_letter]
    rejected = [e for e in events if e.state is State.REJECTED]
    if rejected:
        assert all(e.reason for e in rejected)
        if dead:  # bad input: the record itself is kept with the reason
            assert len(dead) == 1 and dict(dead[0].headers or [])[ERROR_HEADER]
        else:  # a valid command that does not apply (a job it does not know) is only answered
            assert all("unknown job" in (e.reason or "") for e in rejected), rejected
    elif dead:
        raise AssertionError(f"dead-lettered without a REJECTED event: {dead}")
    else:  # accepted: a valid command for this partition changed (or repeated) a job
        cmd = CODEC.decode(value or b"")
        assert isinstance(cmd, JobCommand) and key == cmd.job_id.encode()
        assert partition_for(cmd.job_id, SETTINGS.partitions) == 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=keyed, headers=headers)
def test_any_ack_record_is_applied_or_dead_lettered_and_never_escapes(
    record: tuple[bytes | None, bytes | None], headers: Any
) -> None:
    key, value = record
    engine = ready_engine()
    engine._on_request(
        Record(TOPICS.requests, 0, 0, b"j", good_command("j"), None, T0), T0, [], set()
    )
    out: list[_Out] = []
    engine._on_ack(Record(TOPICS.acks, 0, 1, key, value, headers, T0), T0, out, set())
    for r in out:
        if r.topic == TOPICS.dead_letter:
            assert dict(r.headers or [])[ERROR_HEADER]


def ack_for(run: Any, state: State, **kw: Any) -> bytes:
    return CODEC.encode(
        StatusEvent(
            event_id=f"{run.run_id}:{run.attempt}:{state.value}",
            job_id=run.job_id,
            state=state,
            event_time_ms=T0 + 10,
            source="worker",
            run_id=run.run_id,
            seq=run.seq + 1,
            attempt=kw.pop("attempt", run.attempt),
            **kw,
        )
    )


def test_ack_headers_without_a_value_or_with_garbage_are_ignored_and_the_ack_applied():
    """A header with no value (None, as the consumer hands it over) or bytes no worker writes
    crashed the loop (``None.isdigit()``), and again on every restart: nothing past the record
    ever committed. Now such a header is ignored with a log line and the ack is applied; a
    record that is no ack is dead-lettered."""
    engine = ready_engine()
    now_job = CODEC.encode(JobCommand("c-n", "n", T0, ScheduleJob("demo.echo", Now())))
    engine._on_request(Record(TOPICS.requests, 0, 0, b"n", now_job, None, T0), T0, [], set())
    task = engine.tasks[0]
    out: list[_Out] = []
    engine._punctuate(task, T0, out, set())
    [run] = [CODEC.decode(r.value) for r in out if r.topic == TOPICS.runs]

    out = []
    garbage = [
        (DISPATCHED_HEADER, None),
        (STATE_HEADER, None),
        (DISPATCHED_HEADER, b"\xff\x00 not digits"),
        (DISPATCHED_HEADER, b"9" * 30),  # more digits than an int64 holds
    ]
    engine._on_ack(Record(TOPICS.acks, 0, 0, b"nulhdr", b"x", garbage, T0), T0, out, set())
    [dead] = out
    assert dead.topic == TOPICS.dead_letter and dead.value == b"x"
    assert b"undecodable ack" in dict(dead.headers or [])[ERROR_HEADER]
    assert task.reached_ms is None and task.acks_next == 1

    out = []
    started = ack_for(run, State.STARTED)
    engine._on_ack(Record(TOPICS.acks, 0, 1, b"n", started, garbage, T0 + 10), T0, out, set())
    assert out == [] and task.acks_next == 2
    assert task.processor.load("n").active[run.run_id].due_ms == T0 + 10 + 30_000

    out = []
    headers = [(DISPATCHED_HEADER, None), (DISPATCHED_HEADER, str(T0).encode())]
    succeeded = ack_for(run, State.SUCCEEDED)
    engine._on_ack(Record(TOPICS.acks, 0, 2, b"n", succeeded, headers, T0 + 20), T0, out, set())
    events = [CODEC.decode(r.value) for r in out if r.topic == TOPICS.status]
    assert [e.state for e in events] == [State.COMPLETED]
    assert task.reached_ms == T0


def test_an_ack_naming_an_impossible_attempt_is_dead_lettered_with_the_reason():
    engine = ready_engine()
    now_job = CODEC.encode(JobCommand("c-f", "forge", T0, ScheduleJob("demo.echo", Now())))
    engine._on_request(Record(TOPICS.requests, 0, 0, b"forge", now_job, None, T0), T0, [], set())
    task = engine.tasks[0]
    out: list[_Out] = []
    engine._punctuate(task, T0, out, set())
    [run] = [CODEC.decode(r.value) for r in out if r.topic == TOPICS.runs]
    out = []
    forged = ack_for(run, State.SUCCEEDED, attempt=-7)
    engine._on_ack(Record(TOPICS.acks, 0, 0, b"forge", forged, None, T0 + 5), T0, out, set())
    [dead] = out
    assert dead.topic == TOPICS.dead_letter and dead.value == forged
    reason = dict(dead.headers or [])[ERROR_HEADER].decode()
    assert reason.startswith("invalid ack:") and "attempt -7" in reason
    assert run.run_id in task.processor.load("forge").active  # still running
