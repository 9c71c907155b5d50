"""The status store on the embedded engine: migrations, dedup, order-independent state."""

from __future__ import annotations

import random
import re
import threading
import uuid
from collections import Counter
from pathlib import Path

import pytest

from jobwheel.consumers.status import queries
from jobwheel.consumers.status.store import (
    EMBEDDED_TABLE_SETTINGS,
    LOCK_TABLE,
    MIGRATIONS_DIR,
    MIGRATIONS_TABLE,
    StatusStore,
    load_migrations,
)
from jobwheel.errors import ConfigError, QueryError, ValidationError
from jobwheel.schemas.models import State, StatusEvent
from tests.status_support import (
    event,
    lifecycle,
    now_ms,
    store_before,
    todays_event_columns,
)

# --- migrations -----------------------------------------------------------------------------


def test_migrations_apply_once_and_are_safe_to_rerun(store: StatusStore) -> None:
    versions = [m.version for m in load_migrations()]
    assert sorted(store.applied_migrations()) == versions
    assert store.migrate() == []
    assert sorted(store.applied_migrations()) == versions
    tables = {r[0] for r in store.query("SHOW TABLES")[2]}
    assert {"status_events", "job_state", "run_state", "jobs", "runs"} <= tables
    assert LOCK_TABLE not in tables


def test_the_store_every_test_gets_is_the_schema_the_migrations_make(
    engine_dsn: str, store: StatusStore
) -> None:
    """The ``store`` fixture copies a template database migrated once per session (running
    the migrations per test cost minutes of the suite). Every object, engine, setting and
    migration record of the copy is what the migrations make from nothing: a migration that
    adds something the copy leaves out fails here, not as a schema that only tests lack."""
    database = f"t_{uuid.uuid4().hex[:12]}"
    migrated = StatusStore.open(engine_dsn, database=database, ttl_days=30)
    try:

        def schema(db: str) -> list[tuple[str, ...]]:
            rows = migrated.client.query(
                "SELECT name, engine, engine_full, create_table_query FROM system.tables "
                "WHERE database = {db:String} ORDER BY name",
                parameters={"db": db},
            ).result_rows
            return [tuple(str(x).replace(f"{db}.", "<db>.") for x in r) for r in rows]

        def history(db: str) -> list[tuple[int, str, str]]:
            query = f"SELECT version, name, checksum FROM {db}.{MIGRATIONS_TABLE} FINAL"
            return sorted(migrated.client.query(query).result_rows)

        assert len(schema(database)) >= 8  # the tables and views the migrations make
        assert schema(store.database) == schema(database)
        assert history(store.database) == history(database) != []
    finally:
        migrated.client.command(f"DROP DATABASE IF EXISTS {database} SYNC")
        migrated.close()


def test_concurrent_starters_apply_each_migration_once(engine_dsn: str) -> None:
    """Four starters (threads) at once against one embedded engine: each file is recorded
    exactly once and nobody fails (the migration lock makes the others wait, then find nothing
    to do). Threads, not processes: chdb serves one engine directory to one process only, so
    separate processes would test the engine's file lock, not the migration lock."""
    database = f"t_{uuid.uuid4().hex[:12]}"
    results: list[object] = []

    def start() -> None:
        try:
            store = StatusStore.open(engine_dsn, database=database, ttl_days=30)
            results.append(store)
        except Exception as exc:  # pragma: no cover - the assertion shows it
            results.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stores = [r for r in results if isinstance(r, StatusStore)]
    assert len(stores) == 4, results
    try:
        query = f"SELECT version, count() FROM {MIGRATIONS_TABLE} GROUP BY version"
        rows = stores[0].query(query)[2]
        assert all(n == 1 for _, n in rows), rows
        assert len(rows) == len(load_migrations())
    finally:
        stores[0].client.command(f"DROP DATABASE IF EXISTS {database} SYNC")
        for s in stores:
            s.close()


def test_stale_migration_lock_is_broken(store: StatusStore) -> None:
    store.client.command(
        f"CREATE TABLE {LOCK_TABLE} (x UInt8) ENGINE = Memory COMMENT 'dead-host:1 1000'"
    )
    # a starter died in the middle of the newest migration (it rebuilds job_state_mv)
    newest = load_migrations()[-1].version
    store.client.command("DROP TABLE job_state_mv")
    store.client.command(f"ALTER TABLE {MIGRATIONS_TABLE} DELETE WHERE version = {newest}")
    assert store.migrate(lock_stale_s=60) == [newest]
    assert store.query("EXISTS TABLE job_state_mv")[2] == [(1,)]


def test_a_held_lock_times_out_with_advice(store: StatusStore) -> None:
    store.client.command(
        f"CREATE TABLE {LOCK_TABLE} (x UInt8) ENGINE = Memory COMMENT 'other:2 {now_ms()}'"
    )
    newest = load_migrations()[-1].version
    store.client.command(f"ALTER TABLE {MIGRATIONS_TABLE} DELETE WHERE version = {newest}")
    with pytest.raises(Exception, match="held by other:2"):
        store.migrate(lock_timeout_s=0.3)


def engine_of(store: StatusStore, table: str) -> str:
    """The table's engine clause as ClickHouse prints it (its TTL and SETTINGS)."""
    (engine,) = store.query(
        "SELECT engine_full FROM system.tables WHERE database = currentDatabase() "
        "AND name = {t:String}",
        {"t": table},
    )[2][0]
    return str(engine)


def test_ttl_follows_the_setting(engine_dsn: str, store: StatusStore) -> None:
    def ttl_days(table: str) -> int:
        return int(re.search(r"toIntervalDay\((\d+)\)", engine_of(store, table))[1])

    assert ttl_days("status_events") == 30
    reopened = StatusStore.open(engine_dsn, database=store.database, ttl_days=7)
    try:
        assert [ttl_days(t) for t in ("status_events", "job_state", "run_state")] == [7, 7, 7]
    finally:
        reopened.close()


def test_embedded_tables_merge_with_the_embedded_settings(
    engine_dsn: str, store: StatusStore
) -> None:
    """Every data table of an embedded store has EMBEDDED_TABLE_SETTINGS, a store made before
    them gets them at its next open, and a server's tables are left to their operator."""

    def settings_of(table: str) -> str:
        return engine_of(store, table)

    tables = ("status_events", "job_state", "run_state")
    wanted = [f"{name} = {value}" for name, value in EMBEDDED_TABLE_SETTINGS.items()]
    assert wanted
    for table in tables:
        assert all(w in settings_of(table) for w in wanted), settings_of(table)

    for table in tables:  # as a store made before the settings existed
        store.client.command(
            f"ALTER TABLE {table} RESET SETTING {', '.join(EMBEDDED_TABLE_SETTINGS)}"
        )
        assert not any(w in settings_of(table) for w in wanted)
    as_server = StatusStore(
        store.client, database=store.database, ttl_days=30, dsn="http://clickhouse:8123"
    )
    assert as_server.migrate() == []
    assert not any(w in settings_of("status_events") for w in wanted)

    reopened = StatusStore.open(engine_dsn, database=store.database, ttl_days=30)
    try:
        for table in tables:
            assert all(w in settings_of(table) for w in wanted), settings_of(table)
    finally:
        reopened.close()


def test_migration_files_are_numbered_without_gaps(tmp_path: Path) -> None:
    assert [m.version for m in load_migrations()] == list(
        range(1, len(list(MIGRATIONS_DIR.glob("*.sql"))) + 1)
    )
    (tmp_path / "0001_a.sql").write_text("SELECT 1")
    (tmp_path / "0003_c.sql").write_text("SELECT 1")
    with pytest.raises(ConfigError, match="without gaps"):
        load_migrations(tmp_path)


def test_state_rank_in_sql_matches_python_and_covers_every_state() -> None:
    sql = (MIGRATIONS_DIR / "0001_status_events.sql").read_text()
    ranked = re.search(r"indexOf\(\s*\[(.*?)\]", sql, re.DOTALL)[1]
    names = re.findall(r"'([A-Z]+)'", ranked)
    assert names == [s.value for s in queries.STATE_ORDER]
    assert set(names) == {s.value for s in State}


def test_bad_database_name_is_a_config_error(engine_dsn: str) -> None:
    with pytest.raises(ConfigError, match="identifier"):
        StatusStore.open(engine_dsn, database="x; DROP TABLE y")


# --- state from events ----------------------------------------------------------------------


def test_job_and_run_state_ignore_arrival_order_and_duplicates(store: StatusStore) -> None:
    t0 = now_ms()
    events = lifecycle("job-a", t0)
    shuffled = events * 3
    random.Random(7).shuffle(shuffled)
    for i in range(0, len(shuffled), 4):  # many small inserts: copies land in different parts
        store.add_events(shuffled[i : i + 4])

    job = queries.get_job(store, "job-a")
    assert job is not None
    assert job["state"] == "COMPLETED"
    assert job["task"] == "demo.echo"
    assert job["last_run_id"] == f"job-a@{t0 + 1000}"
    assert job["attempts"] == 1
    assert job["next_fire_ms"] is None  # the latest scheduler event (COMPLETED) has none
    assert job["created_ms"] == t0 and job["updated_ms"] == t0 + 1111

    (run,) = queries.job_runs(store, "job-a")
    assert run["state"] == "SUCCEEDED"
    assert run["scheduled_time_ms"] == t0 + 1000
    assert run["dispatched_ms"] == t0 + 1007
    assert run["lateness_ms"] == 7
    assert run["started_ms"] == t0 + 1010
    assert run["finished_ms"] == t0 + 1110
    assert run["duration_ms"] == 100
    assert run["worker"] == "w:1"
    assert run["deadline_ms"] == t0 + 31_100  # the heartbeat moved it
    assert run["attempts"] == 1

    # every event exactly once when read with FINAL
    (n,) = store.query("SELECT count() FROM status_events FINAL")[2][0]
    assert n == len(events)


def test_worker_event_for_an_older_seq_does_not_override_newer_scheduler_state(
    store: StatusStore,
) -> None:
    """A slow worker's SUCCEEDED for attempt 1 arrives after the scheduler re-dispatched
    (visibility timeout, higher seq): the run shows the newer dispatch, not the late answer,
    and the job (whose state no run event changes) is still SCHEDULED."""
    t0 = now_ms()
    run = "job-b@1"
    store.add_events(
        [
            event("job-b", State.SCHEDULED, seq=1, t=t0 - 10, task="t"),
            event("job-b", State.DISPATCHED, seq=5, t=t0, run_id=run, attempt=1),
            event("job-b", State.STARTED, seq=5, t=t0 + 5, run_id=run, attempt=1, worker="w:1"),
            event("job-b", State.DISPATCHED, seq=6, t=t0 + 30_000, run_id=run, attempt=2),
        ]
    )
    store.add_events([event("job-b", State.SUCCEEDED, seq=5, t=t0 + 40_000, run_id=run, attempt=1)])
    job = queries.get_job(store, "job-b")
    assert job is not None and job["state"] == "SCHEDULED" and job["attempts"] == 2
    (r,) = queries.job_runs(store, "job-b")
    assert r["state"] == "DISPATCHED" and r["attempts"] == 2 and r["finished_ms"] is None


def test_a_job_scheduled_again_with_another_task_shows_the_new_task_after_the_merges(
    store: StatusStore,
) -> None:
    """The fix for a misspelt task: the job scheduled again under its id with the right name,
    its dead run replayed (which runs the job's current definition). Every event after that
    names the new task, so every view does, also once the parts are merged (the old any(task)
    kept the oldest name there)."""
    t0 = now_ms()
    run = "job-t@1"
    store.add_events(
        [
            event("job-t", State.SCHEDULED, seq=1, t=t0, task="demo.ecko"),
            event(
                "job-t", State.DISPATCHED, seq=2, t=t0 + 1, run_id=run, attempt=1, task="demo.ecko"
            ),
            event("job-t", State.DEAD, seq=3, t=t0 + 2, run_id=run, attempt=1, task="demo.ecko"),
            event("job-t", State.DEAD, seq=4, t=t0 + 3, task="demo.ecko"),
        ]
    )
    store.add_events([event("job-t", State.SCHEDULED, seq=5, t=t0 + 10, task="demo.echo")])
    store.add_events(
        [
            event(
                "job-t", State.DISPATCHED, seq=6, t=t0 + 20, run_id=run, attempt=2, task="demo.echo"
            ),
            event(
                "job-t", State.SUCCEEDED, seq=6, t=t0 + 21, run_id=run, attempt=2, task="demo.echo"
            ),
            event("job-t", State.COMPLETED, seq=7, t=t0 + 22, task="demo.echo"),
        ]
    )
    for table in ("job_state", "run_state"):
        store.client.command(f"OPTIMIZE TABLE {table} FINAL")
        (parts,) = store.query(
            "SELECT count() FROM system.parts WHERE database = currentDatabase() "
            "AND table = {table:String} AND active",
            {"table": table},
        )[2]
        assert parts == (1,), (table, parts)  # merged: one part holds every row of the job

    job = queries.get_job(store, "job-t")
    assert job is not None and (job["task"], job["state"]) == ("demo.echo", "COMPLETED")
    (r,) = queries.job_runs(store, "job-t")
    assert (r["task"], r["state"]) == ("demo.echo", "SUCCEEDED")
    listed = queries.list_jobs(store, queries.JobFilter(task="demo.echo")).jobs
    assert [j["job_id"] for j in listed] == ["job-t"]
    assert queries.list_jobs(store, queries.JobFilter(task="demo.ecko")).jobs == []


def test_a_run_shows_the_error_and_duration_of_what_it_is_now(store: StatusStore) -> None:
    """Attempt 1 failed, attempt 2 succeeded: the run shows its result, not attempt 1's error.
    A run handed back by a stopping worker and running again shows neither the hand-back's
    error nor its duration while it runs."""
    t0 = now_ms()
    ok, again = "job-r@1", "job-h@1"
    store.add_events(
        [
            event("job-r", State.SCHEDULED, seq=1, t=t0, task="t"),
            event("job-r", State.DISPATCHED, seq=2, t=t0 + 1, run_id=ok, attempt=1),
            event(
                "job-r",
                State.FAILED,
                seq=2,
                t=t0 + 2,
                run_id=ok,
                attempt=1,
                error="E: boom",
                duration_ms=5,
            ),
            event("job-r", State.RETRYING, seq=3, t=t0 + 3, run_id=ok, attempt=1),
        ]
    )
    (r,) = queries.job_runs(store, "job-r")
    assert (r["state"], r["error"], r["duration_ms"]) == ("RETRYING", "E: boom", None)
    store.add_events(
        [
            event("job-r", State.DISPATCHED, seq=4, t=t0 + 10, run_id=ok, attempt=2),
            event(
                "job-r",
                State.SUCCEEDED,
                seq=4,
                t=t0 + 12,
                run_id=ok,
                attempt=2,
                duration_ms=2,
                result_json="1",
            ),
        ]
    )
    (r,) = queries.job_runs(store, "job-r")
    assert (r["state"], r["error"], r["duration_ms"], r["result"]) == ("SUCCEEDED", None, 2, 1)

    store.add_events(
        [
            event("job-h", State.SCHEDULED, seq=1, t=t0, task="t"),
            event("job-h", State.DISPATCHED, seq=2, t=t0 + 1, run_id=again, attempt=1),
            event("job-h", State.STARTED, seq=2, t=t0 + 2, run_id=again, attempt=1),
            event(
                "job-h",
                State.FAILED,
                seq=2,
                t=t0 + 9,
                run_id=again,
                attempt=1,
                error="worker shutdown",
                reason="worker shutdown",
                duration_ms=7,
            ),
            event("job-h", State.DISPATCHED, seq=3, t=t0 + 10, run_id=again, attempt=2),
            event("job-h", State.STARTED, seq=3, t=t0 + 11, run_id=again, attempt=2),
        ]
    )
    (h,) = queries.job_runs(store, "job-h")
    assert (h["state"], h["error"], h["duration_ms"]) == ("STARTED", None, None)
    # the events keep every attempt's error
    errors = [e["error"] for e in queries.run_events(store, again) if e["error"]]
    assert errors == ["worker shutdown"]


def test_same_seq_ties_break_by_source_then_state_rank(store: StatusStore) -> None:
    t0 = now_ms()
    # worker beats scheduler at the same seq; a late HEARTBEAT is never "the state"
    store.add_events(
        [
            event("job-c", State.SUCCEEDED, seq=2, t=t0 + 10, run_id="r", worker="w:1"),
            event("job-c", State.HEARTBEAT, seq=2, t=t0 + 99, run_id="r", worker="w:1"),
            event("job-c", State.DISPATCHED, seq=2, t=t0 + 500, run_id="r"),
        ]
    )
    (run,) = queries.job_runs(store, "job-c")
    assert run["state"] == "SUCCEEDED"


def test_next_fire_comes_from_the_latest_scheduler_event(store: StatusStore) -> None:
    t0 = now_ms()
    store.add_events(
        [
            event(
                "job-d", State.SCHEDULED, seq=1, t=t0, task="demo.echo", next_fire_ms=t0 + 60_000
            ),
            event("job-d", State.STARTED, seq=1, t=t0 + 5, run_id="x", worker="w"),
        ]
    )
    job = queries.get_job(store, "job-d")
    assert job is not None and job["next_fire_ms"] == t0 + 60_000
    store.add_events([event("job-d", State.PAUSED, seq=2, t=t0 + 10)])
    job = queries.get_job(store, "job-d")
    assert job is not None and job["state"] == "PAUSED" and job["next_fire_ms"] is None


def test_failed_then_retried_run_keeps_last_error_and_counts_attempts(
    store: StatusStore,
) -> None:
    t0 = now_ms()
    run = "job-e@1"
    store.add_events(
        [
            event("job-e", State.SCHEDULED, seq=0, t=t0 - 1, task="t"),
            event("job-e", State.DISPATCHED, seq=1, t=t0, run_id=run, attempt=1, task="t"),
            event("job-e", State.FAILED, seq=1, t=t0 + 5, run_id=run, attempt=1, error="E: boom"),
            event("job-e", State.RETRYING, seq=2, t=t0 + 6, run_id=run, attempt=1),
            event("job-e", State.DISPATCHED, seq=3, t=t0 + 100, run_id=run, attempt=2),
            event(
                "job-e", State.FAILED, seq=3, t=t0 + 105, run_id=run, attempt=2, error="E: again"
            ),
            event("job-e", State.DEAD, seq=4, t=t0 + 106, run_id=run, attempt=2),
            event("job-e", State.DEAD, seq=5, t=t0 + 106),  # the one-off job, after its run
        ]
    )
    job = queries.get_job(store, "job-e")
    assert job is not None
    assert (job["state"], job["attempts"], job["last_error"]) == ("DEAD", 2, "E: again")
    (r,) = queries.job_runs(store, "job-e")
    assert (r["state"], r["attempts"], r["finished_ms"], r["dispatched_ms"]) == (
        "DEAD",
        2,
        t0 + 106,
        t0,
    )


def test_insert_dedup_token_drops_a_retried_identical_batch(store: StatusStore) -> None:
    from jobwheel.consumers.status.store import event_row

    rows = [event_row(e) for e in lifecycle("job-f", now_ms())]
    store.insert_events(rows, dedup_token="status:0:0-5")
    store.insert_events(rows, dedup_token="status:0:0-5")
    (n,) = store.query("SELECT count() FROM status_events")[2][0]
    assert n == len(rows)


def test_an_inserted_batch_is_let_go_once_the_next_one_is_in(store: StatusStore) -> None:
    """The store keeps nothing of a batch once a later one is inserted, even with Python's
    cycle collector off: a service collects cycles rarely (``jobwheel.cli._tune_gc``), and the
    sink grew by hundreds of MiB a minute when each insert left its columns in a cycle."""
    import gc
    import sys

    from jobwheel.consumers.status.store import EVENT_COLUMNS, event_row

    t0 = now_ms()
    first = [event_row(e) for e in lifecycle("job-g", t0)]
    task = "".join(["task-", uuid.uuid4().hex])  # a string object only the first batch holds
    for row in first:
        row[EVENT_COLUMNS.index("task")] = task
    held = sys.getrefcount(task)
    gc.disable()
    try:
        store.insert_events(first, dedup_token="first")
        store.insert_events([event_row(e) for e in lifecycle("job-h", t0)], dedup_token="second")
        assert sys.getrefcount(task) == held
    finally:
        gc.enable()
    stored = store.query("SELECT DISTINCT task FROM status_events WHERE job_id = 'job-g'")[2]
    assert stored == [(task,)]


# --- listing, counts, read-only SQL ---------------------------------------------------------


def _fill(store: StatusStore, t0: int) -> None:
    events = []
    for i in range(5):
        events += lifecycle(f"done-{i}", t0 + i * 10, task="demo.echo")
    for i in range(3):
        events.append(event(f"wait-{i}", State.SCHEDULED, seq=1, t=t0 + 100 + i, task="demo.sleep"))
    store.add_events(events)


def test_list_jobs_filters_and_pages(store: StatusStore) -> None:
    t0 = now_ms()
    _fill(store, t0)
    page = queries.list_jobs(store, queries.JobFilter(state=State.COMPLETED, limit=2))
    assert page.total == 5 and len(page.jobs) == 2
    rest = queries.list_jobs(store, queries.JobFilter(state=State.COMPLETED, limit=10, offset=2))
    assert len(rest.jobs) == 3
    assert {j["job_id"] for j in page.jobs + rest.jobs} == {f"done-{i}" for i in range(5)}
    assert [j["job_id"] for j in page.jobs] == ["done-4", "done-3"]  # newest update first

    sleeping = queries.list_jobs(store, queries.JobFilter(task="demo.sleep"))
    assert {j["job_id"] for j in sleeping.jobs} == {"wait-0", "wait-1", "wait-2"}
    recent = queries.list_jobs(store, queries.JobFilter(since_ms=t0 + 101))
    assert {j["job_id"] for j in recent.jobs} == {"wait-1", "wait-2"} | {
        f"done-{i}" for i in range(5)
    }
    old = queries.list_jobs(store, queries.JobFilter(until_ms=t0 + 1111))
    assert {j["job_id"] for j in old.jobs} == {"done-0", "wait-0", "wait-1", "wait-2"}
    beyond = queries.list_jobs(store, queries.JobFilter(offset=50))
    assert beyond.jobs == [] and beyond.total == 8


def test_state_counts(store: StatusStore) -> None:
    _fill(store, now_ms())
    assert queries.state_counts(store) == {"COMPLETED": 5, "SCHEDULED": 3}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"offset": -1}, "offset"),
        ({"since_ms": 5, "until_ms": 1}, "since"),
    ],
)
def test_job_filter_rejects_bad_bounds(kwargs: dict[str, int], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        queries.JobFilter(**kwargs)
    assert info.value.field == field


def test_parse_time_forms() -> None:
    assert queries.parse_time("1h", "since", now=10_000_000) == 10_000_000 - 3_600_000
    # An absolute instant parses the same on any day: these dates never meet the TTL.
    instant = 1_700_000_000_000  # fixed date: only parsed
    assert queries.parse_time(str(instant), "since") == instant
    assert queries.parse_time("2023-11-14T22:13:20Z", "since") == instant  # fixed date: parsed
    # the one grammar (schemas/timetext.py): a time without an offset is refused, not guessed
    with pytest.raises(ValidationError, match="no time zone offset; add one"):
        queries.parse_time("2023-11-14T22:13:20", "since")  # fixed date: refused for its form
    assert queries.parse_time("1w", "since", now=10**12) == 10**12 - 604_800_000
    with pytest.raises(ValidationError, match="not a time"):
        queries.parse_time("yesterday", "until")
    assert queries.parse_state("completed") is State.COMPLETED
    with pytest.raises(ValidationError, match="not a job state"):
        queries.parse_state("RUNNING")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count() FROM jobs",
        "  -- comment\n  select 1;",
        "WITH 1 AS x SELECT x",
        "SHOW TABLES",
        "DESCRIBE TABLE runs",
        "EXPLAIN SELECT 1",
        "(SELECT 1)",
    ],
)
def test_read_only_sql_allows_reads(store: StatusStore, sql: str) -> None:
    assert queries.run_read_only(store, sql).columns


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("INSERT INTO status_events (event_id) VALUES ('x')", "read-only"),
        ("DROP TABLE jobs", "read-only"),
        ("/* hi */ ALTER TABLE jobs DELETE WHERE 1", "read-only"),
        ("SELECT 1; DROP TABLE jobs", "one statement"),
        ("", "empty"),
        ("SELECT 1 SETTINGS readonly = 0", "settings"),
        ("SELECT * FROM file('/etc/hostname', 'LineAsString')", "file"),
        ("SELECT nosuch FROM jobs", "nosuch"),
    ],
)
def test_read_only_sql_refuses_the_rest(store: StatusStore, sql: str, message: str) -> None:
    with pytest.raises(QueryError, match=f"(?i){message}"):
        queries.run_read_only(store, sql)
    assert store.query("EXISTS TABLE jobs")[2] == [(1,)]


def test_read_only_sql_caps_rows(store: StatusStore) -> None:
    result = queries.run_read_only(store, "SELECT number FROM numbers(100000)", max_rows=10)
    assert len(result.rows) == 10 and result.truncated


# --- dashboards -----------------------------------------------------------------------------


def test_every_dashboard_query_runs_and_sees_the_data(store: StatusStore) -> None:
    t0 = now_ms() - 120_000
    _fill(store, t0)
    stuck = "stuck@1"
    store.add_events(
        [
            event("stuck", State.SCHEDULED, seq=1, t=t0 - 1, task="x"),
            event(
                "stuck",
                State.DISPATCHED,
                seq=2,
                t=t0,
                run_id=stuck,
                attempt=1,
                task="x",
                scheduled_time_ms=t0,
                deadline_ms=t0 + 1000,
            ),
            event("later", State.SCHEDULED, seq=1, t=t0, task="x", next_fire_ms=now_ms() + 60_000),
            # paused: no upcoming fire, even with a next fire on its events (older schedulers
            # announced one on PAUSED)
            event("held", State.SCHEDULED, seq=1, t=t0, task="x", next_fire_ms=now_ms() + 30_000),
            event("held", State.PAUSED, seq=2, t=t0 + 1, next_fire_ms=now_ms() + 30_000),
            event("bad", State.SCHEDULED, seq=1, t=t0 - 1, task="flaky"),
            event(
                "bad",
                State.DISPATCHED,
                seq=2,
                t=t0,
                run_id="bad@1",
                attempt=1,
                task="flaky",
                scheduled_time_ms=t0,
            ),
            event(
                "bad",
                State.FAILED,
                seq=2,
                t=t0 + 5,
                run_id="bad@1",
                attempt=1,
                error="E",
                queue="reports",
            ),  # fmt: skip
        ]
    )
    results = {}
    for panel in queries.PANELS:
        sql = queries.expand_macros(panel.sql, t0 - 60_000, now_ms() + 60_000)
        assert "$__" not in sql
        results[panel.key] = queries.run_read_only(store, sql)
    # summed over the minutes: the events may straddle a minute's end
    by_state: Counter[str] = Counter()
    for _minute, state, events in results["runs_per_minute"].rows:
        by_state[state] += events
    assert by_state["SUCCEEDED"] == 5
    by_pool: Counter[str] = Counter()
    for _minute, pool, runs in results["runs_by_queue"].rows:
        by_pool[pool] += runs
    # the lifecycles' verdicts name no queue (older workers); bad's FAILED names its pool
    assert by_pool == {"(not named)": 5, "reports": 1}
    assert max(r[4] for r in results["lateness"].rows) == 7
    failure = {r[0]: r[4] for r in results["failure_rate"].rows}
    assert failure == {"demo.echo": 0.0, "flaky": 1.0}
    assert [r[1] for r in results["stuck_runs"].rows] == [stuck]
    assert [r[0] for r in results["upcoming_fires"].rows] == ["later"]
    assert results["jobs_by_state"].rows == [
        ["COMPLETED", 5],
        ["PAUSED", 1],
        ["SCHEDULED", 6],  # wait-0..2, later, stuck and bad: their runs are not the job's state
    ]


REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "consumers" / "status" / "DASHBOARDS.md"
GRAFANA = REPO / "deploy" / "compose" / "grafana"


def test_doc_and_grafana_dashboard_carry_the_panel_sql_verbatim() -> None:
    import json

    doc = DOC.read_text()
    for panel in queries.PANELS:
        assert panel.sql in doc, panel.key
    committed = json.loads((GRAFANA / "dashboards" / "jobwheel.json").read_text())
    assert committed == queries.grafana_dashboard(), (
        "regenerate: python -m jobwheel.consumers.status.queries > "
        "deploy/compose/grafana/dashboards/jobwheel.json"
    )
    assert [p["targets"][0]["rawSql"] for p in committed["panels"]] == [
        p.sql for p in queries.PANELS
    ]
    datasource = (GRAFANA / "provisioning" / "datasources" / "clickhouse.yaml").read_text()
    assert f"uid: {queries.GRAFANA_DATASOURCE['uid']}" in datasource
    assert f"type: {queries.GRAFANA_DATASOURCE['type']}" in datasource


def _sleep_run(job_id: str, t: int, duration_ms: int) -> list[StatusEvent]:
    run = f"{job_id}@{t}"
    return [
        event(
            job_id,
            State.DISPATCHED,
            seq=1,
            t=t,
            run_id=run,
            attempt=1,
            task="demo.sleep",
            scheduled_time_ms=t,
        ),
        event(
            job_id,
            State.SUCCEEDED,
            seq=1,
            t=t + duration_ms,
            run_id=run,
            attempt=1,
            worker="w:2",
            duration_ms=duration_ms,
        ),
    ]


def test_every_sql_block_in_the_doc_runs_and_answers_what_it_says(store: StatusStore) -> None:
    """Each query a reader copies from DASHBOARDS.md gives the documented answer on known
    data (the panels' answers are checked in the dashboard test above)."""
    t0 = now_ms() - 60_000
    _fill(store, t0)
    history = lifecycle("my-job", t0 - 5000)
    store.add_events(random.Random(7).sample(history, len(history)))  # arrival order is not it
    day_ms = 86_400_000
    store.add_events(
        _sleep_run("nap-short", t0, 300)
        + _sleep_run("nap-long", t0 + 10, 900)
        + _sleep_run("nap-old", t0 - 2 * day_ms, 5000)  # finished more than a day ago
    )
    store.add_events(
        [
            event(
                "cron-m",
                State.MISSED,
                seq=2,
                t=t0,
                run_id="cron-m@1000",
                scheduled_time_ms=t0 - 2000,
                reason="starting deadline passed",
            ),
            event(
                "cron-s",
                State.SKIPPED,
                seq=2,
                t=t0,
                run_id="cron-s@2000",
                scheduled_time_ms=t0 - 1000,
                reason="FORBID: a run is active",
            ),
        ]
    )
    extra = {
        # A job's full history, in the order that decides its state
        "WHERE job_id = 'my-job'": lambda rows: (
            [(r[1], r[2], r[3]) for r in rows]
            == [
                (1, "scheduler", "SCHEDULED"),
                (2, "scheduler", "DISPATCHED"),
                (2, "worker", "STARTED"),
                (2, "worker", "HEARTBEAT"),
                (2, "worker", "SUCCEEDED"),
                (3, "scheduler", "COMPLETED"),
            ]
        ),
        # Slowest runs of a task in the last day
        "WHERE task = 'demo.sleep'": lambda rows: (
            [r[:4] for r in rows]
            == [[f"nap-long@{t0 + 10}", 900, 1, "w:2"], [f"nap-short@{t0}", 300, 1, "w:2"]]
        ),
        # Runs that were not fired, and why
        "WHERE state IN ('MISSED', 'SKIPPED', 'STALE')": lambda rows: (
            [r[:4] for r in rows]
            == [
                ["cron-s", "cron-s@2000", "SKIPPED", "FORBID: a run is active"],
                ["cron-m", "cron-m@1000", "MISSED", "starting deadline passed"],
            ]
        ),
    }
    panels = {panel.sql for panel in queries.PANELS}
    blocks = re.findall(r"```sql\n(.*?)\n```", DOC.read_text(), re.DOTALL)
    assert len(blocks) == len(panels) + len(extra)
    checked = set()
    for sql in blocks:
        result = queries.run_read_only(
            store, queries.expand_macros(sql, now_ms() - 3_600_000, now_ms())
        )
        if sql in panels:
            continue  # its answer is checked by the dashboard test
        (key,) = [k for k in extra if k in sql] or [f"no expected answer for:\n{sql}"]
        assert extra[key](result.rows), (sql, result.rows)
        checked.add(key)
    assert checked == set(extra)


# --- the job state model (README, "Job states") -------------------------------------------


def _job_state(store: StatusStore, job_id: str) -> str | None:
    job = queries.get_job(store, job_id)
    return None if job is None else job["state"]


def test_a_jobs_state_moves_only_with_job_level_events(store: StatusStore) -> None:
    """Run events and REJECTED answers are about the job, never its state; the walk of the
    issue that asked for the model: trigger a paused job (its run dies), resume it, cancel it
    twice, and a one-off job whose run died."""
    t0 = now_ms()
    run = "p@trigger-1"
    store.add_events(
        [
            event("p", State.SCHEDULED, seq=1, t=t0, task="demo.fail", next_fire_ms=t0 + 60_000),
            event("p", State.PAUSED, seq=2, t=t0 + 1),
            event("p", State.DISPATCHED, seq=3, t=t0 + 2, run_id=run, attempt=1),
            event("p", State.FAILED, seq=3, t=t0 + 3, run_id=run, attempt=1, error="E: x"),
            event("p", State.DEAD, seq=4, t=t0 + 4, run_id=run, attempt=1, reason="not retryable"),
        ]
    )
    assert _job_state(store, "p") == "PAUSED"
    (r,) = queries.job_runs(store, "p")
    assert r["state"] == "DEAD"
    store.add_events([event("p", State.RESUMED, seq=5, t=t0 + 5, next_fire_ms=t0 + 60_000)])
    job = queries.get_job(store, "p")
    assert job is not None and (job["state"], job["next_fire_ms"]) == ("SCHEDULED", t0 + 60_000)
    store.add_events(
        [
            event("p", State.CANCELLED, seq=6, t=t0 + 6),
            event("p", State.REJECTED, seq=7, t=t0 + 7, reason="job is already CANCELLED"),
        ]
    )
    job = queries.get_job(store, "p")
    assert job is not None and job["state"] == "CANCELLED"
    assert job["last_reason"] == "job is already CANCELLED"  # shown with the job, not as it
    assert job["state_time_ms"] == t0 + 6

    store.add_events(
        [
            event("once", State.SCHEDULED, seq=1, t=t0, task="demo.fail"),
            event("once", State.DEAD, seq=3, t=t0 + 9, run_id="once@1", attempt=3),
            event("once", State.DEAD, seq=4, t=t0 + 9, reason="its last run ended DEAD"),
        ]
    )
    dead = queries.list_jobs(store, queries.JobFilter(state=State.DEAD))
    assert [j["job_id"] for j in dead.jobs] == ["once"]
    assert queries.state_counts(store) == {"CANCELLED": 1, "DEAD": 1}


def test_a_command_for_a_job_never_scheduled_makes_no_job(store: StatusStore) -> None:
    t0 = now_ms()
    store.add_events(
        [event("deadbeef", State.REJECTED, seq=0, t=t0, event_id="c1:REJECTED", reason="unknown")]
    )
    assert queries.get_job(store, "deadbeef") is None
    assert queries.list_jobs(store, queries.JobFilter()).total == 0
    assert queries.state_counts(store) == {}
    # ... but the scheduler's answer to the command is there for whoever sent it
    verdict = queries.command_verdict(store, "deadbeef", "c1")
    assert verdict is not None and (verdict["state"], verdict["reason"]) == ("REJECTED", "unknown")
    assert queries.command_verdict(store, "deadbeef", "c2") is None


def test_jobs_recorded_before_the_model_are_backfilled(engine_dsn: str) -> None:
    """Migration 0005 on a store that already holds events: the old view said DEAD for a
    paused job whose triggered run died, and listed a made-up id as a REJECTED job."""
    migrations = load_migrations()
    database = f"t_{uuid.uuid4().hex[:12]}"
    store = StatusStore.open(engine_dsn, database=database, ttl_days=30, migrate=False)
    try:
        store.migrate(migrations[:4])
        # today's writer sends spec_json (0006) and queue (0011): those columns first, the
        # rest is 0004's schema
        todays_event_columns(store)
        t0 = now_ms()
        store.add_events(
            [
                event("p", State.SCHEDULED, seq=1, t=t0, task="demo.fail"),
                event("p", State.PAUSED, seq=2, t=t0 + 1),
                event("p", State.DEAD, seq=4, t=t0 + 4, run_id="p@trigger-1", attempt=1),
                event("ghost", State.REJECTED, seq=0, t=t0, reason="unknown job"),
                *lifecycle("done", t0),
            ]
        )
        assert queries.state_counts(store) == {"COMPLETED": 1, "DEAD": 1, "REJECTED": 1}
        assert store.migrate(migrations[:7]) == [5, 6, 7]
        assert queries.state_counts(store) == {"COMPLETED": 1, "PAUSED": 1}
        # the columns of `jobs` at 0007 (queries read today's)
        [job] = store.dicts("SELECT created_ms, task FROM jobs WHERE job_id = 'done'")
        assert job["created_ms"] == t0 and job["task"] == "demo.echo"
        # and events after the migration still reach the new state
        store.add_events([event("p", State.RESUMED, seq=5, t=t0 + 5)])
        assert store.query("SELECT state FROM jobs WHERE job_id = 'p'")[2] == [("SCHEDULED",)]
    finally:
        store.client.command(f"DROP DATABASE IF EXISTS {database} SYNC")
        store.close()


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("succeeded", "state of a run"),
        ("REJECTED", "answer to a command"),
        ("resumed", "SCHEDULED again"),
        ("RUNNING", "not a job state"),
    ],
)
def test_list_filters_by_job_states_only(text: str, hint: str) -> None:
    assert queries.parse_state("dead") is State.DEAD
    with pytest.raises(ValidationError, match=hint) as info:
        queries.parse_state(text)
    assert "SCHEDULED, PAUSED, COMPLETED, DEAD, CANCELLED" in str(info.value)


def _random_history(rng: random.Random, t0: int, jobs: int, prefix: str) -> list[StatusEvent]:
    """Events of many jobs in every state, with every nullable field now set and now not;
    event times are distinct, so no two events of a job share an ordering token."""
    states = [s for s in State if s != State.RESUMED] + [State.RESUMED]
    out: list[StatusEvent] = []
    t = t0
    for j in range(jobs):
        job = f"{prefix}-{j}"
        task = rng.choice(["demo.echo", "demo.fail"])  # a job's task never changes
        for _ in range(rng.randint(1, 12)):
            t += 1
            state = rng.choice(states)
            run = rng.choice([None, f"{job}@1", f"{job}@2"])
            maybe = lambda v: v if rng.random() < 0.5 else None  # noqa: E731
            out.append(
                event(
                    job,
                    state,
                    seq=rng.randint(0, 6),
                    t=t,
                    source=rng.choice(["scheduler", "worker"]),
                    run_id=run,
                    attempt=rng.randint(1, 3),
                    task=maybe(task),
                    scheduled_time_ms=maybe(t0 + rng.randint(0, 1000)),
                    worker=maybe(f"w:{rng.randint(1, 3)}"),
                    error=maybe(f"E: {rng.randint(1, 9)}"),
                    reason=maybe(f"reason {rng.randint(1, 9)}"),
                    duration_ms=maybe(rng.randint(0, 500)),
                    next_fire_ms=maybe(t0 + rng.randint(1000, 9000)),
                    deadline_ms=maybe(t0 + rng.randint(30_000, 60_000)),
                )
            )
    return out


def _task(store: StatusStore, view: str) -> str:
    """Job ``j``'s task in ``view`` (`jobs` or `runs`), as the columns of 0008 have it."""
    [[task]] = store.query(f"SELECT task FROM {view} WHERE job_id = 'j'")[2]
    return str(task)


def test_a_store_with_events_gets_each_latest_task_from_migration_0008(engine_dsn: str) -> None:
    """Migration 0008 on a store that already holds a job scheduled again with another task,
    merged: it read the oldest task before, the latest after, and events after it too."""
    with store_before(engine_dsn, 8) as (store, migrate):
        t0 = now_ms()
        store.add_events([event("j", State.SCHEDULED, seq=1, t=t0, task="demo.ecko")])
        store.add_events(
            [
                event("j", State.SCHEDULED, seq=2, t=t0 + 1, task="demo.echo"),
                event("j", State.DISPATCHED, seq=3, t=t0 + 2, run_id="j@1", task="demo.echo"),
            ]
        )
        store.client.command("OPTIMIZE TABLE job_state FINAL")
        assert _task(store, "jobs") == "demo.ecko"
        assert migrate() == [8]
        assert _task(store, "jobs") == "demo.echo"
        assert [_task(store, "runs")] == ["demo.echo"]
        store.add_events([event("j", State.SCHEDULED, seq=4, t=t0 + 3, task="demo.sleep")])
        store.client.command("OPTIMIZE TABLE job_state FINAL")
        assert _task(store, "jobs") == "demo.sleep"


def test_the_plain_state_tables_answer_as_the_aggregate_states_did(engine_dsn: str) -> None:
    """Migration 0007 (tuples under max instead of argMax states) on a store that holds events:
    every column of `jobs` and `runs` reads the same before and after it, and events inserted
    after it (in many small parts, shuffled, with copies) give the answers the old tables gave
    for the same events."""
    migrations = load_migrations()
    t0 = now_ms()
    rng = random.Random(11)
    before_events = _random_history(rng, t0, 60, "early")
    after_events = _random_history(rng, t0 + 100_000, 60, "late")

    def insert_shuffled(store: StatusStore, events: list[StatusEvent]) -> None:
        copies = events + rng.sample(events, len(events) // 3)
        rng.shuffle(copies)
        for i in range(0, len(copies), 25):
            store.add_events(copies[i : i + 25])

    def read(store: StatusStore) -> tuple[list[tuple], list[tuple]]:
        return (
            store.query("SELECT * FROM jobs ORDER BY job_id")[2],
            store.query("SELECT * FROM runs ORDER BY job_id, run_id")[2],
        )

    old_db, new_db = (f"t_{uuid.uuid4().hex[:12]}" for _ in range(2))
    old = StatusStore.open(engine_dsn, database=old_db, ttl_days=30, migrate=False)
    new = StatusStore.open(engine_dsn, database=new_db, ttl_days=30, migrate=False)
    try:
        for store in (old, new):
            store.migrate(migrations[:6])
            todays_event_columns(store)
        for store in (old, new):
            insert_shuffled(store, before_events)
        jobs_before, runs_before = read(new)
        assert len(jobs_before) > 25 and len(runs_before) > 60  # the mix has both kinds
        assert new.migrate(migrations[:7]) == [7]
        assert read(new) == (jobs_before, runs_before)
        for store in (old, new):
            insert_shuffled(store, after_events)
        assert read(new) == read(old)
        assert len(read(new)[0]) > len(jobs_before)
    finally:
        for store, db in ((old, old_db), (new, new_db)):
            store.client.command(f"DROP DATABASE IF EXISTS {db} SYNC")
            store.close()


def _fill_state_table(store: StatusStore, table: str, parts: int, rows: int) -> None:
    """``parts`` parts of ``rows`` runs or jobs each, every tuple column filled, as the
    materialized views fill them; the table's merges stay stopped."""
    t = "(toInt64(number), toUInt8(1), toUInt8(9), toInt64(number), {})"
    # Text as it comes (ids, worker names, errors): it does not compress away.
    text = t.format("randomPrintableASCII(24)")
    num = t.format("toInt64(number)")
    succeeded, completed, first = t.format("'SUCCEEDED'"), t.format("'COMPLETED'"), t.format("1")
    if table == "run_state":
        columns = (
            "job_id, run_id, task, scheduled_time_ms, dispatched_ms, started_ms, attempts, "
            "state, worker, error, reason, duration_ms, deadline_ms, latest_task, latest_queue, "
            "updated_ms"
        )
        values = (
            "concat('job-', toString(number)), concat('job-', toString(number), '@1'), "
            f"'load.noop', number, number, number, 1, {succeeded}, {text}, "
            f"{text}, {text}, {num}, {num}, {text}, {text}, toInt64(number)"
        )
    else:
        columns = (
            "job_id, task, lifecycle, last_run_id, attempt, next_fire, last_error, last_reason, "
            "latest_task, latest_queue, seq, created_ms, updated_ms"
        )
        values = (
            f"concat('job-', toString(number)), 'load.noop', {completed}, {text}, "
            f"{first}, {num}, {text}, {text}, {text}, {text}, toInt64(number), "
            "toInt64(number), toInt64(number)"
        )
    store.client.command(f"SYSTEM STOP MERGES {table}")  # the parts stay apart
    for k in range(parts):
        store.client.command(
            f"INSERT INTO {table} ({columns}) SELECT {values} FROM numbers({k * rows}, {rows}) "
            f"SETTINGS max_block_size = {rows}, min_insert_block_size_rows = {rows}"
        )


@pytest.mark.parametrize("table", ["job_state", "run_state"])
def test_the_state_tables_write_compact_parts_however_large(engine_dsn: str, table: str) -> None:
    """The embedded store's aggregating tables keep a part in one file, not a file per column,
    past the size (10 MiB) at which the engine would otherwise switch: their merges read every
    column of every part at once, and with a file per column each file's buffer grew with the
    parts. Measured on a store holding an hour at 2,000 jobs/s (BENCHMARKS.md): a merge took
    260 MiB with a file per column, at most 54 MiB with compact parts, and inserts beside it
    stopped failing for memory."""
    database = f"parts_{uuid.uuid4().hex[:8]}"
    store = StatusStore.open(engine_dsn, database=database, ttl_days=30)
    try:
        _fill_state_table(store, table, parts=2, rows=80_000)
        found = store.query(
            "SELECT part_type, data_uncompressed_bytes FROM system.parts "
            f"WHERE active AND database = '{database}' AND table = '{table}'"
        )[2]
        assert len(found) == 2 and all(size > 10 * 2**20 for _, size in found), found
        assert {kind for kind, _ in found} == {"Compact"}, found
    finally:
        store.client.command(f"DROP DATABASE IF EXISTS {database}")
