"""The scheduler's transaction carries each partition's status events as StatusBatch records
(schemas/README.md, "Status batches"): driven without Kafka, on an engine that never connects."""

from __future__ import annotations

from jobwheel.schemas.codec import default_codec
from jobwheel.schemas.models import State, StatusEvent
from jobwheel.settings import Settings
from jobwheel.streams.engine import SchedulerEngine, _Out

SETTINGS = Settings(_env_file=None, topic_prefix="p", partitions=3)  # type: ignore[call-arg]
TOPICS = SETTINGS.topics
CODEC = default_codec()


def status(partition: int, job: str, seq: int) -> _Out:
    event = StatusEvent(f"{job}:{seq}", job, State.SCHEDULED, seq, "scheduler", seq=seq)
    return _Out(TOPICS.status, partition, job.encode(), CODEC.encode(event))


def events_of(record: _Out) -> list[tuple[str, int]]:
    return [(e.job_id, e.seq) for e in CODEC.decode_events(record.value or b"")]  # type: ignore[union-attr]


def test_a_partitions_events_go_in_one_batch_in_order_and_a_lone_event_stays_a_record() -> None:
    run = _Out(TOPICS.runs, 0, b"a", b"run bytes", [("jobwheel.run", b"1")])
    out = [status(0, "a", 1), run, status(1, "b", 1), status(0, "c", 1), status(0, "a", 2)]
    framed = SchedulerEngine(SETTINGS)._batched(out)

    assert run in framed  # other topics' records as they were
    on_status = [r for r in framed if r.topic == TOPICS.status]
    (lone,) = [r for r in on_status if r.partition == 1]
    assert lone == out[2]  # one event: its own record, keyed by its job id
    (batch,) = [r for r in on_status if r.partition == 0]
    assert batch.key is None  # a batch holds many jobs' events
    assert CODEC.batch_items(batch.value or b"") is not None
    assert events_of(batch) == [("a", 1), ("c", 1), ("a", 2)]  # in the order they happened


def test_a_batch_stops_at_its_byte_limit_and_a_chunk_of_one_is_a_plain_record() -> None:
    engine = SchedulerEngine(SETTINGS)
    out = [status(2, f"job-{i}", i) for i in range(5)]
    engine._record_limit = 2 * len(out[0].value or b"")  # two events fill a batch
    framed = engine._batched(out)

    assert [events_of(r) for r in framed] == [
        [("job-0", 0), ("job-1", 1)],
        [("job-2", 2), ("job-3", 3)],
        [("job-4", 4)],
    ]
    assert [r.key for r in framed] == [None, None, b"job-4"]
    assert all(len(r.value or b"") < 2 * engine._record_limit for r in framed)
