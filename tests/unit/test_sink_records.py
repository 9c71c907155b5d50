"""The status sink's record handler against anything a topic can hold: random bytes, random
Avro-shaped records, valid events. Nothing may escape it, every bad record is skipped with a
reason and counted, and every row it keeps can be inserted (one row out of range would fail
its whole batch forever). Quick runs' STARTED rows come from their verdicts."""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest
from fastavro import schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobwheel.consumers.status.sink import StatusSink
from jobwheel.consumers.status.store import EVENT_COLUMNS, event_row, row_fits
from jobwheel.schemas.codec import Codec, SchemaCatalogue
from jobwheel.schemas.models import Run, State, StatusBatch, StatusEvent
from jobwheel.settings import Settings

CODEC = Codec()
CATALOGUE = SchemaCatalogue.load()
VERSIONS = [v for v in CATALOGUE.versions]
STATUS_VERSIONS = [v for v in VERSIONS if v.full_name == "io.jobwheel.StatusEvent"]
SETTINGS = Settings(_env_file=None, topic_prefix="p")  # type: ignore[call-arg]
TOPICS = [SETTINGS.topics.status, SETTINGS.topics.acks]


def new_sink() -> StatusSink:
    """The handler needs no store and no consumer: it only fills the batch."""
    return StatusSink(SETTINGS, store=None)  # type: ignore[arg-type]


def fields_of(version: Any) -> list[tuple[str, Any]]:
    return [(f["name"], f["type"]) for f in version.parsed["fields"]]


# Values that fit each Avro type, and some that only fit its encoding (wide ints).
def value_for(avro_type: Any) -> st.SearchStrategy[Any]:
    if isinstance(avro_type, list):
        return st.one_of(*[value_for(t) for t in avro_type])
    if isinstance(avro_type, dict) and avro_type.get("type") == "enum":
        return st.sampled_from(avro_type["symbols"])
    return {
        "null": st.none(),
        "string": st.text(max_size=30),
        "int": st.integers(-(2**40), 2**40),  # fastavro writes "int" beyond 32 bits
        "long": st.integers(-(2**63), 2**63 - 1),
        "boolean": st.booleans(),
    }[avro_type]


@st.composite
def avro_records(draw: st.DrawFn) -> bytes:
    """A record body written by fastavro with a known schema, framed with its fingerprint,
    then perhaps cut or padded."""
    version = draw(st.sampled_from(VERSIONS))
    if version.full_name != "io.jobwheel.StatusEvent":
        return version.fingerprint  # the header of another record type, nothing else
    record = {name: draw(value_for(t)) for name, t in fields_of(version)}
    body = io.BytesIO()
    schemaless_writer(body, version.parsed, record)
    data = b"\xc3\x01" + version.fingerprint + body.getvalue()
    cut = draw(st.integers(0, 3))
    if cut == 1:
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif cut == 2:
        data += draw(st.binary(min_size=1, max_size=4))
    return data


records = st.one_of(
    st.binary(max_size=80),
    st.binary(max_size=80).map(lambda b: b"\xc3\x01" + STATUS_VERSIONS[-1].fingerprint + b),
    avro_records(),
    st.none(),
)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(st.tuples(st.sampled_from(TOPICS), records), max_size=8))
def test_no_record_escapes_the_handler_and_every_kept_row_fits(
    batch: list[tuple[str, bytes | None]],
) -> None:
    sink = new_sink()
    for offset, (topic, value) in enumerate(batch):
        before = (sink.stats.undecodable, sink.stats.seq_refused, len(sink._batch.rows))
        sink.handle(topic, 0, offset, value)  # must not raise
        undecodable = sink.stats.undecodable - before[0]
        skipped = undecodable + sink.stats.seq_refused - before[1]
        kept = len(sink._batch.rows) - before[2]
        assert (skipped, kept) in ((1, 0), (0, 1), (0, 2))
        if undecodable:
            assert sink.stats.last_undecodable  # with a reason
    assert sink.stats.consumed == len(batch)
    for row in sink._batch.rows:
        assert len(row) == len(EVENT_COLUMNS)
        assert row_fits(row) is None, row


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    state=st.sampled_from(list(State)),
    started=st.none() | st.integers(0, 2**45),
    attempt=st.integers(0, 2**31 - 1),
    topic=st.sampled_from(TOPICS),
)
def test_a_valid_event_becomes_its_row_and_a_quick_verdict_its_started_row(
    state: State, started: int | None, attempt: int, topic: str
) -> None:
    event = StatusEvent(
        f"r@1:{attempt}:{state}",
        "job",
        state,
        2**41,
        "claimed-by-the-writer",
        run_id="r@1",
        seq=4,
        attempt=attempt,
        task="t",
        scheduled_time_ms=2**40,
        worker="w:1",
        duration_ms=3,
        started_ms=started,
        queue="reports",
    )
    sink = new_sink()
    sink.handle(topic, 2, 17, CODEC.encode(event))
    source = "worker" if topic == SETTINGS.topics.acks else "scheduler"
    row, *more = sink._batch.rows
    assert row == event_row(event, 2, 17, source=source)  # the source is the topic's word
    if started is not None and state in (State.SUCCEEDED, State.FAILED):
        (started_row,) = more
        as_dict = dict(zip(EVENT_COLUMNS, started_row, strict=True))
        assert as_dict["event_id"] == f"r@1:{attempt}:STARTED"
        assert (as_dict["state"], as_dict["event_time_ms"]) == ("STARTED", started)
        assert (as_dict["run_id"], as_dict["attempt"], as_dict["worker"]) == ("r@1", attempt, "w:1")
        assert as_dict["queue"] == "reports"  # the verdict's pool, for the runs by queue
    else:
        assert more == []


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(records.filter(lambda r: r is not None), min_size=2, max_size=6))
def test_each_event_of_a_status_batch_is_kept_or_skipped_as_a_record_of_its_own(
    items: list[bytes],
) -> None:
    """A StatusBatch (the scheduler's events of one transaction and partition) gives the rows
    its events would give as records of their own, in order; a bad event is skipped and
    counted on its own, its neighbours kept."""
    status = SETTINGS.topics.status
    one_by_one = new_sink()
    for item in items:
        one_by_one.handle(status, 3, 9, item)
    batched = new_sink()
    batched.handle(status, 3, 9, CODEC.encode(StatusBatch(tuple(items))))
    assert batched._batch.rows == one_by_one._batch.rows
    assert batched.stats.undecodable == one_by_one.stats.undecodable
    assert batched.stats.seq_refused == one_by_one.stats.seq_refused
    assert batched.stats.consumed == 1


def test_a_damaged_status_batch_is_one_undecodable_record() -> None:
    good = CODEC.encode(StatusEvent("e", "j", State.SCHEDULED, 1, "scheduler", seq=1))
    whole = CODEC.encode(StatusBatch((good, good)))
    sink = new_sink()
    sink.handle(SETTINGS.topics.status, 0, 1, whole)
    assert len(sink._batch.rows) == 2  # it can see a batch's rows ...
    for cut in (whole[:-1], whole[:12], whole + b"\x00"):
        sink = new_sink()
        sink.handle(SETTINGS.topics.status, 0, 1, cut)  # ... and none of a damaged one
        assert (sink.stats.undecodable, sink._batch.rows) == (1, [])
        assert "StatusBatch" in sink.stats.last_undecodable or "status_batch" in (
            sink.stats.last_undecodable or ""
        )


def test_a_batch_of_many_bad_events_is_counted_in_full_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good = CODEC.encode(StatusEvent("e", "j", State.SCHEDULED, 1, "scheduler", seq=1))
    hostile = CODEC.encode(StatusBatch((good, *([b""] * 100_000))))  # 100 KB of empty events
    sink = new_sink()
    with caplog.at_level(logging.WARNING):
        sink.handle(SETTINGS.topics.status, 0, 7, hostile)
    assert len(sink._batch.rows) == 1  # the good event is kept
    assert sink.stats.undecodable == 100_000
    (line,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.getMessage() == "status events of a batch skipped"
    assert (line.skipped, line.events, line.offset) == (100_000, 100_001, 7)  # type: ignore[attr-defined]


def test_bad_records_are_logged_with_the_reason(caplog: pytest.LogCaptureFixture) -> None:
    sink = new_sink()
    wide = StatusEvent("e", "j", State.SCHEDULED, 1, "scheduler", attempt=2**40)
    run = Run("r@1", "r", "t", "{}", 1, 1, 1, 1, 3, None, 30_000, 30_001, 0, 1)
    with caplog.at_level(logging.WARNING):
        for offset, value in enumerate([b"garbage", None, CODEC.encode(wide), CODEC.encode(run)]):
            sink.handle(SETTINGS.topics.status, 0, offset, value)
    assert sink.stats.undecodable == 4 and sink._batch.rows == []
    reasons = [r.error for r in caplog.records if r.getMessage().startswith("undecodable")]
    assert len(reasons) == 4
    assert "not a jobwheel message" in reasons[0]
    assert "no value" in reasons[1]
    assert "attempt" in reasons[2] and "range" in reasons[2]
    assert "Run" in reasons[3]


def test_failing_inserts_make_the_sink_unready_until_one_succeeds() -> None:
    """Readiness follows the inserts: the API's data gets older while ClickHouse refuses
    them; the metrics count the failure and, once through, the batch and its latency."""
    from prometheus_client import CollectorRegistry

    from jobwheel.consumers.status.metrics import SinkCollector
    from jobwheel.consumers.status.sink import _Batch
    from jobwheel.errors import StoreError

    class FlakyStore:
        """Refuses the first insert; on the retry, records what readiness said meanwhile."""

        def __init__(self) -> None:
            self.calls = 0
            self.readiness_on_retry: tuple[bool, str] | None = None

        def insert_events(self, rows: list[list[Any]], dedup_token: str) -> None:
            self.calls += 1
            if self.calls == 1:
                raise StoreError("ClickHouse is down")
            self.readiness_on_retry = collector._ready()

    store = FlakyStore()
    sink = StatusSink(SETTINGS, store=store)  # type: ignore[arg-type]
    collector = SinkCollector(sink)
    sink.stats.running, sink.joined = True, True
    assert collector._ready()[0]
    batch = _Batch()
    batch.rows = [["row"]] * 3
    batch.add_offset(TOPICS[0], 0, 7)
    assert sink._insert(batch)  # fails once, retries after 0.2 s, then goes through
    assert store.calls == 2 and store.readiness_on_retry is not None
    ok, detail = store.readiness_on_retry
    assert not ok and "inserts into ClickHouse have failed" in detail and "is down" in detail
    assert collector._ready()[0]
    registry = CollectorRegistry()
    registry.register(collector)
    got = {s.name: s.value for f in registry.collect() for s in f.samples if not s.labels}
    assert got["jobwheel_sink_insert_failures_total"] == 1
    assert got["jobwheel_sink_rows_total"] == 3
    assert got["jobwheel_sink_batch_rows_count"] == 1 and got["jobwheel_sink_batch_rows_sum"] == 3
    assert got["jobwheel_sink_insert_seconds_count"] == 1
