"""Builders for the status store tests, and their two fixtures.

chdb hosts one engine directory per process, so the whole pytest session shares one embedded
engine (``engine_dsn``) and each test gets its own database in it (``store``): isolation
without re-opening the engine. ``tests/conftest.py`` registers this module as a plugin, so every
test module can ask for ``store`` (or ``engine_dsn``) without defining or importing them.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from jobwheel.consumers.status.store import MIGRATIONS_TABLE, StatusStore, load_migrations
from jobwheel.schemas.codec import default_codec
from jobwheel.schemas.models import State, StatusEvent
from jobwheel.schemas.partitioning import key_for
from jobwheel.settings import Settings
from tests.support import HarnessError, kafka_call

_ids = itertools.count(1)


#: The database every test's store is copied from: migrated once per session.
TEMPLATE_DATABASE = "jobwheel_template"
#: Tables before the views that read or feed them.
_CREATE_ORDER = {"MaterializedView": 1, "View": 2}


def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The session's embedded engine; a client stays open so it is initialised only once."""
    path = tmp_path_factory.getbasetemp() / "status-chdb"
    dsn = f"chdb://{path}"
    keeper = StatusStore.open(dsn, database="keeper", migrate=False)
    yield dsn
    keeper.close()


def _template(store: StatusStore) -> list[tuple[str, str]]:
    """``(name, CREATE statement)`` of each object of the template database, tables first;
    the template is migrated the first time it is asked for in this process."""
    rows = _template_rows(store)
    if not any(name == MIGRATIONS_TABLE for name, _ in rows):
        StatusStore.open(store.dsn, database=TEMPLATE_DATABASE, ttl_days=30).close()
        rows = _template_rows(store)
    return rows


def _template_rows(store: StatusStore) -> list[tuple[str, str]]:
    rows = store.client.query(
        "SELECT name, engine, create_table_query FROM system.tables WHERE database = {db:String}",
        parameters={"db": TEMPLATE_DATABASE},
    ).result_rows
    rows.sort(key=lambda r: (_CREATE_ORDER.get(str(r[1]), 0), str(r[0])))
    return [(str(name), str(create)) for name, _, create in rows]


def fresh_store(dsn: str) -> Iterator[StatusStore]:
    """A migrated store in a database of its own, dropped afterwards.

    Copied from a template migrated once (every table and view created from the template's
    own CREATE statement, its migration history copied), then opened as a service opens it:
    ``open`` finds every migration applied, the TTLs and table settings current. Why: running
    the migrations for each test cost about 0.7 s of DDL on the embedded engine, some 4 minutes
    over the suite's 360 tests that take a store."""
    database = f"t_{uuid.uuid4().hex[:12]}"
    maker = StatusStore.open(dsn, database=database, ttl_days=30, migrate=False)
    try:
        for name, create in _template(maker):
            maker.client.command(create.replace(f"{TEMPLATE_DATABASE}.", f"{database}."))
            if name == MIGRATIONS_TABLE:
                maker.client.command(
                    f"INSERT INTO {database}.{MIGRATIONS_TABLE} "
                    f"SELECT * FROM {TEMPLATE_DATABASE}.{MIGRATIONS_TABLE}"
                )
    finally:
        maker.close()
    store = StatusStore.open(dsn, database=database, ttl_days=30)
    yield store
    store.client.command(f"DROP DATABASE IF EXISTS {database} SYNC")
    store.close()


@pytest.fixture(scope="session")
def engine_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from engine(tmp_path_factory)


@pytest.fixture
def store(engine_dsn: str) -> Iterator[StatusStore]:
    yield from fresh_store(engine_dsn)


def todays_event_columns(store: StatusStore) -> None:
    """Give a store migrated to an older version the ``status_events`` columns today's sink
    writes (each added by a later migration with ``ADD COLUMN IF NOT EXISTS``, so that
    migration still runs): a test of an old migration inserts events as the sink does now."""
    for migration in load_migrations():
        for statement in migration.statements(ttl_days=30):
            if statement.startswith("ALTER TABLE status_events ADD COLUMN"):
                store.client.command(statement)


@contextlib.contextmanager
def store_before(
    engine_dsn: str, version: int
) -> Iterator[tuple[StatusStore, Callable[[], list[int]]]]:
    """A store in a database of its own, migrated up to migration ``version`` (not included)
    and given today's event columns (:func:`todays_event_columns`); yields it and a function
    that applies ``version`` (returning what it applied). The database is dropped after."""
    migrations = load_migrations()
    (index,) = [i for i, m in enumerate(migrations) if m.version == version]
    database = f"t_{uuid.uuid4().hex[:12]}"
    store = StatusStore.open(engine_dsn, database=database, ttl_days=30, migrate=False)
    try:
        store.migrate(migrations[:index])
        todays_event_columns(store)
        yield store, lambda: store.migrate(migrations[: index + 1])
    finally:
        store.client.command(f"DROP DATABASE IF EXISTS {database} SYNC")
        store.close()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def event(
    job_id: str,
    state: State | str,
    *,
    seq: int,
    t: int,
    source: str | None = None,
    run_id: str | None = None,
    event_id: str | None = None,
    **fields: Any,
) -> StatusEvent:
    """A StatusEvent with sensible defaults: worker states come from a worker, others not."""
    state = State(state)
    worker_states = {State.STARTED, State.HEARTBEAT, State.SUCCEEDED, State.FAILED}
    if source is None:
        source = "worker" if state in worker_states else "scheduler"
    return StatusEvent(
        event_id=event_id or f"ev-{next(_ids)}",
        job_id=job_id,
        state=state,
        event_time_ms=t,
        source=source,
        run_id=run_id,
        seq=seq,
        **fields,
    )


def lifecycle(job_id: str, t0: int, *, task: str = "demo.echo") -> list[StatusEvent]:
    """A one-shot job's life: scheduled, dispatched 7 ms late, run by a worker, completed."""
    run = f"{job_id}@{t0 + 1000}"
    return [
        event(job_id, State.SCHEDULED, seq=1, t=t0, task=task, next_fire_ms=t0 + 1000),
        event(
            job_id,
            State.DISPATCHED,
            seq=2,
            t=t0 + 1007,
            run_id=run,
            attempt=1,
            task=task,
            scheduled_time_ms=t0 + 1000,
            deadline_ms=t0 + 31_007,
        ),
        event(job_id, State.STARTED, seq=2, t=t0 + 1010, run_id=run, attempt=1, worker="w:1"),
        event(
            job_id,
            State.HEARTBEAT,
            seq=2,
            t=t0 + 1100,
            run_id=run,
            attempt=1,
            worker="w:1",
            deadline_ms=t0 + 31_100,
        ),
        event(
            job_id,
            State.SUCCEEDED,
            seq=2,
            t=t0 + 1110,
            run_id=run,
            attempt=1,
            worker="w:1",
            duration_ms=100,
            result_json='{"ok": true}',
        ),
        event(job_id, State.COMPLETED, seq=3, t=t0 + 1111),
    ]


def produce(settings: Settings, events: Sequence[StatusEvent | bytes]) -> None:
    """Key by job id like the real producers, each event on the topic its source writes
    (scheduler: status, worker: acks); raw bytes go out as they are (garbage)."""
    codec = default_codec()
    producer = Producer(settings.librdkafka(**{"partitioner": "murmur2_random"}))
    t = settings.topics
    for item in events:
        if isinstance(item, bytes):
            producer.produce(t.status, item, b"garbage")
        else:
            topic = t.acks if item.source == "worker" else t.status
            producer.produce(topic, codec.encode(item), key_for(item.job_id))
        producer.poll(0)
    assert producer.flush(30) == 0


def committed(settings: Settings) -> int:
    """Sum of the status group's committed offsets on both topics (records it has finished
    with). A broker error is the test harness's failure, never "0 committed"; only the
    transient answers right after the topics were made are asked again (kafka_call)."""
    return sum(committed_offsets(settings).values())


def committed_offsets(settings: Settings) -> dict[tuple[str, int], int]:
    """(source, partition) -> the status group's committed offset (0: none yet), ``source``
    being the column value the sink gives each topic's rows (scheduler: status, worker:
    acks)."""
    source = {settings.topics.status: "scheduler", settings.topics.acks: "worker"}
    consumer = Consumer(settings.librdkafka(**{"group.id": settings.status_group}))
    try:
        tps = [
            TopicPartition(topic, p)
            for topic in (settings.topics.status, settings.topics.acks)
            for p in range(settings.partitions)
        ]
        answer = kafka_call(
            lambda: consumer.committed(tps, timeout=10), "reading the status group's offsets"
        )
    finally:
        consumer.close()
    errors = [tp.error for tp in answer if tp.error is not None]
    if errors:
        raise HarnessError(f"committed offsets of the status group: {errors}")
    return {(source[tp.topic], tp.partition): max(tp.offset, 0) for tp in answer}


def docs_assets(html: str) -> list[str]:
    """Every URL the docs page makes a browser load: scripts, styles, icons, the schema."""
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
    urls += re.findall(r"""url: ?["']([^"']+)["']""", html)
    return urls
