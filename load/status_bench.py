"""Throughput of the status sink into the embedded ClickHouse engine (chdb).

Produces N status events (six per job: a full one-shot life) to a fresh status topic, then runs
one :class:`jobwheel.consumers.status.sink.StatusSink` in this process against a new chdb directory
and waits until every event is inserted and committed. Prints:

- the sink's rate: events/s from the first to the last insert (steady state) and over the whole
  run (consumer group join and engine start included);
- the store alone: events/s of ``insert_events`` with the same batch size, no Kafka;
- read latencies on the loaded store: one job (``GET /jobs/{id}``), a filtered page
  (``GET /jobs?state=...``), state counts (``GET /stats/states``).

    jobwheel broker start                       # or pass --start-broker
    python -m load.status_bench --events 200000 --batch-size 5000

No assertions: it prints numbers. Broker, producer and sink share this machine, so figures are
for comparing changes, not capacity planning.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer

from jobwheel.consumers.status import queries
from jobwheel.consumers.status.sink import StatusSink
from jobwheel.consumers.status.store import StatusStore, event_row
from jobwheel.kafka.admin import ensure_topics
from jobwheel.schemas.codec import Codec
from jobwheel.schemas.models import State, StatusEvent
from jobwheel.schemas.partitioning import key_for
from jobwheel.settings import Settings
from load.harness import broker


def job_events(i: int, t0: int) -> list[StatusEvent]:
    job, run = f"bench-{i}", f"bench-{i}@{t0 + 1000}"
    task = ("demo.echo", "demo.sleep", "demo.fail")[i % 3]
    ok = i % 3 != 2
    return [
        StatusEvent(f"{job}:s", job, State.SCHEDULED, t0, "scheduler", seq=1, task=task,
                    next_fire_ms=t0 + 1000),
        StatusEvent(f"{job}:d", job, State.DISPATCHED, t0 + 1003, "scheduler", run_id=run, seq=2,
                    attempt=1, task=task, scheduled_time_ms=t0 + 1000, deadline_ms=t0 + 31_003),
        StatusEvent(f"{job}:b", job, State.STARTED, t0 + 1005, "worker", run_id=run, seq=2,
                    attempt=1, worker="bench:1"),
        StatusEvent(f"{job}:h", job, State.HEARTBEAT, t0 + 1500, "worker", run_id=run, seq=2,
                    attempt=1, worker="bench:1", deadline_ms=t0 + 31_500),
        StatusEvent(f"{job}:f", job, State.SUCCEEDED if ok else State.FAILED, t0 + 1900,
                    "worker", run_id=run, seq=2, attempt=1, worker="bench:1", duration_ms=895,
                    error=None if ok else "ValueError: bench"),
        StatusEvent(f"{job}:c", job, State.COMPLETED if ok else State.DEAD, t0 + 1901,
                    "scheduler", seq=3, run_id=None if ok else run),
    ]  # fmt: skip


def produce(settings: Settings, events: list[StatusEvent], codec: Codec) -> float:
    producer = Producer(settings.librdkafka(**{"partitioner": "murmur2_random", "linger.ms": 20}))
    started = time.monotonic()
    topic = settings.topics.status
    for n, e in enumerate(events):
        while True:
            try:
                producer.produce(topic, codec.encode(e), key_for(e.job_id))
                break
            except BufferError:
                producer.poll(0.05)
        if n % 1000 == 0:
            producer.poll(0)
    producer.flush(60)
    return time.monotonic() - started


def timed(fn: Callable[[], object], repeat: int = 20) -> str:
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000)
    return f"p50 {statistics.median(samples):.1f} ms, max {max(samples):.1f} ms"


def measure_sink(
    settings: Settings, store: StatusStore, events: list[StatusEvent], args: argparse.Namespace
) -> int:
    """Run a sink until every event is inserted; print its CPU and rates. Returns its batch
    size."""
    sink = StatusSink(settings, store, batch_size=args.batch_size, batch_ms=args.batch_ms)
    batch_size = sink.batch_size
    first_insert: list[float] = []
    original = store.insert_events

    def insert_and_time(rows, *, dedup_token=None):  # type: ignore[no-untyped-def]
        if not first_insert:
            first_insert.append(time.monotonic())
        return original(rows, dedup_token=dedup_token)

    store.insert_events = insert_and_time  # type: ignore[method-assign]
    started = time.monotonic()
    cpu_started = time.process_time()
    thread = threading.Thread(target=sink.run, daemon=True)
    thread.start()
    while sink.stats.inserted < len(events):
        time.sleep(0.01)
    done = time.monotonic()
    cpu_s = time.process_time() - cpu_started
    sink.stop()
    thread.join(60)
    store.insert_events = original  # type: ignore[method-assign]
    print(
        f"sink CPU (this process: consumer, decoding and the embedded engine): {cpu_s:.2f}s, "
        f"{cpu_s / len(events) * 1e6:.1f} us per event, "
        f"{cpu_s / len(events) * 5 * 1000:.3f} ms per job of five events"
    )

    steady = done - first_insert[0]
    print(
        f"sink: {len(events)} events in {sink.stats.batches} batches "
        f"(batch size {batch_size}, {args.batch_ms} ms): "
        f"{len(events) / steady:,.0f} events/s steady ({steady:.2f}s from first insert), "
        f"{len(events) / (done - started):,.0f} events/s including group join and start"
    )
    return batch_size


def measure_store_alone(
    settings: Settings, store: StatusStore, events: list[StatusEvent], batch_size: int
) -> None:
    """Insert up to 60,000 of the events into a database of their own, no Kafka; print the
    rate."""
    rows = [event_row(e) for e in events[: min(len(events), 60_000)]]
    store.client.command("CREATE DATABASE IF NOT EXISTS bench_raw")
    raw = StatusStore.open(
        settings.clickhouse_dsn, database="bench_raw", ttl_days=settings.status_ttl_days
    )
    t = time.monotonic()
    for i in range(0, len(rows), batch_size):
        raw.insert_events(rows[i : i + batch_size])
    raw_s = time.monotonic() - t
    print(
        f"store alone: {len(rows)} rows in batches of {batch_size}: "
        f"{len(rows) / raw_s:,.0f} events/s (materialized views included)"
    )
    raw.close()


def measure_reads(store: StatusStore, jobs: int) -> None:
    """Print the latencies of the API's reads on the loaded store."""
    print(f"read one job (GET /jobs/{{id}}):  {timed(lambda: queries.get_job(store, 'bench-7'))}")
    print(f"read runs of a job:              {timed(lambda: queries.job_runs(store, 'bench-7'))}")
    page = queries.JobFilter(state=State.DEAD, limit=50)
    print(f"filtered page of {jobs} jobs:     {timed(lambda: queries.list_jobs(store, page), 5)}")
    print(f"state counts:                    {timed(lambda: queries.state_counts(store), 5)}")
    print("state counts:", queries.state_counts(store))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=120_000, help="about; rounded to jobs x 6")
    parser.add_argument(
        "--batch-size", type=int, default=None, help="default JOBWHEEL_STATUS_BATCH_SIZE"
    )
    parser.add_argument("--batch-ms", type=int, default=500)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--bootstrap", help="broker (default JOBWHEEL_BOOTSTRAP_SERVERS)")
    parser.add_argument("--start-broker", action="store_true", help="start a local broker")
    args = parser.parse_args()

    jobs = max(1, args.events // 6)
    with (
        broker(args.start_broker, args.bootstrap) as bootstrap,
        tempfile.TemporaryDirectory(prefix="jobwheel-status-bench-") as tmp,
    ):
        prefix = f"bench{uuid.uuid4().hex[:8]}"
        settings = Settings(
            bootstrap_servers=bootstrap,
            topic_prefix=prefix,
            partitions=args.partitions,
            status_group=f"{prefix}-status",
            data_dir=Path(tmp),
        )
        ensure_topics(settings)
        codec = Codec()
        t0 = int(time.time() * 1000)
        events = [e for i in range(jobs) for e in job_events(i, t0)]
        produce_s = produce(settings, events, codec)
        print(f"produced {len(events)} status events in {produce_s:.1f}s")

        opened = time.monotonic()
        store = StatusStore.from_settings(settings)
        print(f"store opened and migrated in {time.monotonic() - opened:.2f}s")
        batch_size = measure_sink(settings, store, events, args)
        measure_store_alone(settings, store, events, batch_size)
        measure_reads(store, jobs)
        store.close()


if __name__ == "__main__":
    main()
