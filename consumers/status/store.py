"""The status store: one clickhouse-connect client on ClickHouse, and its schema migrations.

The same code serves a ClickHouse server (``http://host:8123``) and the embedded engine
(``chdb:///abs/dir``, the default under ``settings.data_dir``). The embedded engine is one per
process and one directory per process, and a second process cannot open a directory that is in
use, so a process builds exactly one :class:`StatusStore` and shares it (the API and the sink
thread of ``jobwheel serve`` use the same object; clickhouse-connect serializes calls on it).

Migrations are the ordered ``migrations/NNNN_name.sql`` files. :meth:`StatusStore.migrate`
applies each pending file once and records it in ``schema_migrations``; it is safe on every
start. Concurrent starters against one server take a lock first: ``CREATE TABLE`` without
``IF NOT EXISTS`` succeeds for exactly one of them. The DDL itself is ``IF NOT EXISTS`` too, so
even a stale-lock takeover race cannot break the schema, only repeat a no-op.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import string
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobwheel.consumers.status.memory import StatusMemory, engine_settings_differing
from jobwheel.errors import ConfigError, QueryError, StoreError
from jobwheel.schemas.models import StatusEvent

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from jobwheel.settings import Settings

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
MIGRATIONS_TABLE = "schema_migrations"
LOCK_TABLE = "schema_migrations_lock"

#: Columns the sink writes, in order (``status_events``; the rest are DEFAULT/MATERIALIZED).
EVENT_COLUMNS: tuple[str, ...] = (
    "event_id",
    "job_id",
    "run_id",
    "seq",
    "attempt",
    "state",
    "event_time_ms",
    "source",
    "task",
    "scheduled_time_ms",
    "worker",
    "error",
    "reason",
    "result_json",
    "duration_ms",
    "next_fire_ms",
    "deadline_ms",
    "retry_delay_ms",
    "spec_json",
    "queue",
    "kafka_partition",
    "kafka_offset",
)

#: Tables with a TTL of ``status_ttl_days``, and the time expression the TTL counts from.
#: :meth:`StatusStore.migrate` re-applies the TTL when the setting changes.
TTL_TABLES: Mapping[str, str] = {
    "status_events": "toDateTime(intDiv(event_time_ms, 1000))",
    "job_state": "toDateTime(intDiv(updated_ms, 1000))",
    "run_state": "toDateTime(intDiv(updated_ms, 1000))",
}

#: MergeTree settings of the data tables in the embedded engine (``chdb:``), set by
#: :meth:`StatusStore.migrate` wherever they differ. Why: the embedded engine merges parts in
#: the sink's own process, on the cores of the scheduler and the workers beside it, and under
#: load its merges took a third of the sink's CPU. ``merge_selector_base`` 20 instead of 5 lets
#: a table gather more parts of like size before merging them: fewer, wider merges, so each row
#: is rewritten fewer times, for a few more parts to read (at most about twenty per table in
#: ``load/RESULTS.md``'s runs). ``max_parts_to_merge_at_once`` 10 instead of 100 bounds a merge's
#: memory, which grows with the parts it reads at once (each part's columns have their own
#: read buffers): measured, a merge of 19 parts of ``job_state`` or ``run_state`` took 170 to
#: 225 MiB, and 16 of ``status_events`` (read row-wise) 138 MiB, more than half the engine's
#: share of the status service's memory budget (memory.py), so inserts beside it failed with
#: ``MEMORY_LIMIT_EXCEEDED``. A ClickHouse server keeps its own defaults: its merges run on its
#: own machine, and not every server version knows the settings.
EMBEDDED_TABLE_SETTINGS: Mapping[str, str] = {
    "merge_selector_base": "20",
    "max_parts_to_merge_at_once": "10",
}

#: Compact parts, whatever their size (one file for all columns instead of a file per column
#: and per tuple element), for the two aggregating tables in the embedded engine. Why: their
#: merges cannot be vertical (column by column), so a merge reads every column of every part
#: at once, each file with its own buffer of up to 1 MiB; job_state and run_state have about
#: sixty files a part (tuples of five, null maps), so a merge's memory grew with the size of
#: the parts until the buffers were full: measured, 260 to 280 MiB for one merge of ten parts
#: of a store holding an hour at 2,000 jobs/s (the sink's RSS rose to 973 MiB and inserts beside
#: it failed with MEMORY_LIMIT_EXCEEDED), against at most 54 MiB with compact parts in the same
#: run; larger parts would have needed more than the engine's whole limit. status_events keeps
#: wide parts: its merges are vertical, a column at a time (16 MiB for 106 MiB of parts).
EMBEDDED_TABLE_SETTINGS_OF: Mapping[str, Mapping[str, str]] = {
    table: {"min_bytes_for_wide_part": str(2**40), "min_rows_for_wide_part": str(10**12)}
    for table in ("job_state", "run_state")
}

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_TTL_DAYS = re.compile(r"toIntervalDay\((\d+)\)")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        """Of the file text before substitution, so a changed TTL setting is not a changed file."""
        return hashlib.sha256(self.sql.encode()).hexdigest()[:16]

    def statements(self, **params: object) -> list[str]:
        text = string.Template(self.sql).substitute({k: str(v) for k, v in params.items()})
        lines = [line for line in text.splitlines() if not line.lstrip().startswith("--")]
        return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migration files in version order; a gap or a duplicate version is a packaging bug."""
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _MIGRATION_NAME.match(path.name)
        if not match:
            raise ConfigError(f"migration file {path.name} is not named NNNN_name.sql; rename it")
        found.append(Migration(int(match[1]), match[2], path.read_text()))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise ConfigError(f"migration versions must be 1..n without gaps, found {versions}")
    return found


#: How each written ``status_events`` column may be filled: (nullable, kind, low, high).
_COLUMN_RULES: dict[str, tuple[bool, type, int, int]] = {
    **{c: (False, str, 0, 0) for c in ("event_id", "job_id", "state", "source")},
    **{
        c: (True, str, 0, 0)
        for c in (
            "run_id",
            "task",
            "worker",
            "error",
            "reason",
            "result_json",
            "spec_json",
            "queue",
        )
    },
    **{c: (False, int, -(2**31), 2**31 - 1) for c in ("attempt", "kafka_partition")},
    **{c: (False, int, -(2**63), 2**63 - 1) for c in ("seq", "event_time_ms", "kafka_offset")},
    **{
        c: (True, int, -(2**63), 2**63 - 1)
        for c in (
            "scheduled_time_ms",
            "duration_ms",
            "next_fire_ms",
            "deadline_ms",
            "retry_delay_ms",
        )
    },
}


def row_fits(row: Sequence[Any]) -> str | None:
    """Why ``row`` (in :data:`EVENT_COLUMNS` order) cannot be inserted, or None when it can.

    One value out of its column's range fails the insert of the whole batch, and the sink would
    retry that batch forever: readers of foreign bytes check rows before batching them.
    """
    for name, value in zip(EVENT_COLUMNS, row, strict=True):
        nullable, kind, low, high = _COLUMN_RULES[name]
        if value is None:
            if nullable:
                continue
            return f"{name} is missing"
        if type(value) is not kind:
            return f"{name} is a {type(value).__name__}, not a {kind.__name__}"
        if kind is int and not low <= value <= high:
            return f"{name} {value} is out of its column's range"
    return None


def event_row(
    event: StatusEvent, partition: int = -1, offset: int = -1, *, source: str | None = None
) -> list[Any]:
    """One ``status_events`` row in :data:`EVENT_COLUMNS` order; ``source`` (who wrote it, as
    the topic it came on says) replaces the event's own claim when given."""
    return [
        event.event_id,
        event.job_id,
        event.run_id,
        event.seq,
        event.attempt,
        str(event.state),
        event.event_time_ms,
        source if source is not None else event.source,
        event.task,
        event.scheduled_time_ms,
        event.worker,
        event.error,
        event.reason,
        event.result_json,
        event.duration_ms,
        event.next_fire_ms,
        event.deadline_ms,
        event.retry_delay_ms,
        event.spec_json,
        event.queue,
        partition,
        offset,
    ]


def _connect(dsn: str, engine_options: Mapping[str, str] | None = None) -> Client:
    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import ClickHouseError

    # Over HTTP, no session: the API threads and the sink thread share one client, and
    # ClickHouse refuses concurrent queries in one session. chdb has no sessions; its options
    # are the embedded engine's startup arguments (server settings), used by the first
    # connection of the process only.
    kwargs: dict[str, Any] = (
        {"chdb_options": dict(engine_options or {})}
        if dsn.startswith("chdb:")
        else {"autogenerate_session_id": False}
    )
    try:
        return clickhouse_connect.get_client(dsn=dsn, **kwargs)
    except ClickHouseError as exc:
        text = str(exc)
        if dsn.startswith("chdb:"):
            raise StoreError(
                f"cannot open the embedded status store {dsn}: {text}. Most likely another "
                "process (jobwheel serve or sink) owns this directory (or this process opened "
                "another one): one process owns an embedded store; ask it over HTTP (jobwheel "
                "status/list/sql use JOBWHEEL_API_URL) or stop it, or set JOBWHEEL_DATA_DIR."
            ) from exc
        raise StoreError(f"cannot connect to ClickHouse at {dsn}: {text}") from exc


class StatusStore:
    """The process's one handle on the status tables (see the module doc for why only one)."""

    def __init__(self, client: Client, *, database: str, ttl_days: int, dsn: str = "") -> None:
        if not _IDENT.match(database):
            raise ConfigError(
                f"clickhouse database {database!r} must be a plain identifier "
                "([A-Za-z_][A-Za-z0-9_]*)"
            )
        if ttl_days < 1:
            raise ConfigError(f"status_ttl_days must be >= 1, got {ttl_days}")
        self.client = client
        self.database = database
        self.ttl_days = ttl_days
        self.dsn = dsn
        #: The one insert context of ``status_events`` (see :meth:`insert_events`), made at the
        #: first insert and again after a migration; the lock keeps it to one insert at a time.
        self._events_context: Any = None
        self._insert_lock = threading.Lock()

    @classmethod
    def open(
        cls,
        dsn: str,
        *,
        database: str = "jobwheel",
        ttl_days: int = 30,
        migrate: bool = True,
        engine_options: Mapping[str, str] | None = None,
    ) -> StatusStore:
        """Connect, create the database, and (by default) bring the schema up to date.

        :param engine_options: server settings of the embedded engine (``chdb:``; ignored for a
            server), e.g. :meth:`StatusMemory.engine_options`; they take effect only if this
            opens the process's engine first, and a difference is logged.
        """
        embedded = dsn.startswith("chdb:")
        if embedded:
            path = dsn.removeprefix("chdb://")
            if path.startswith("/"):
                Path(path).mkdir(parents=True, exist_ok=True)
        client = _connect(dsn, engine_options if embedded else None)
        if not _IDENT.match(database):
            client.close()
            raise ConfigError(f"clickhouse database {database!r} must be a plain identifier")
        try:
            client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
            client.database = database
            store = cls(client, database=database, ttl_days=ttl_days, dsn=dsn)
            if embedded and engine_options:
                store._check_engine_settings(engine_options)
            if migrate:
                store.migrate()
        except Exception:
            client.close()
            raise
        return store

    @classmethod
    def connect(cls, dsn: str, *, database: str) -> StatusStore:
        """Another connection to an existing store, creating nothing (``/sql`` runs on these;
        on a server its user may be read-only). Embedded: a second handle on the process's one
        engine, which runs queries concurrently with the first."""
        if not _IDENT.match(database):
            raise ConfigError(f"clickhouse database {database!r} must be a plain identifier")
        client = _connect(dsn)
        try:
            client.database = database
        except Exception as exc:
            client.close()
            raise StoreError(f"cannot use database {database} at {dsn}: {exc}") from exc
        return cls(client, database=database, ttl_days=1, dsn=dsn)

    @classmethod
    def from_settings(cls, settings: Settings, *, migrate: bool = True) -> StatusStore:
        """The process's store, an embedded engine bounded by ``JOBWHEEL_STATUS_MEMORY_MIB``."""
        return cls.open(
            settings.clickhouse_dsn,
            database=settings.clickhouse_database,
            ttl_days=settings.status_ttl_days,
            migrate=migrate,
            engine_options=StatusMemory.from_settings(settings).engine_options(),
        )

    def engine_settings(self, names: Iterable[str]) -> dict[str, str]:
        """The values of the named server settings as the engine runs with them."""
        rows = self.client.query(
            "SELECT name, value FROM system.server_settings WHERE name IN {names:Array(String)}",
            parameters={"names": list(names)},
        ).result_rows
        return {str(name): str(value) for name, value in rows}

    def _check_engine_settings(self, wanted: Mapping[str, str]) -> None:
        """Log the server settings the engine was not started with: it was started earlier in
        this process (by another open, with other options) and keeps what it started with."""
        differing = engine_settings_differing(self.engine_settings(wanted), wanted)
        if differing:
            log.warning(
                "the embedded status engine was started without this memory budget (another "
                "store opened it first in this process); restart the process to apply it",
                extra={"dsn": self.dsn, "differing": differing},
            )

    @property
    def embedded(self) -> bool:
        return self.dsn.startswith("chdb:")

    def close(self) -> None:
        self.client.close()

    # --- migrations -------------------------------------------------------------------------

    def migrate(
        self,
        migrations: Sequence[Migration] | None = None,
        *,
        lock_timeout_s: float = 120.0,
        lock_stale_s: float = 300.0,
    ) -> list[int]:
        """Apply pending migrations once; return the versions this call applied.

        :param lock_stale_s: a lock older than this is taken to belong to a starter that died
            mid-migration and is broken (safe because every statement is IF NOT EXISTS).
        """
        migrations = load_migrations() if migrations is None else list(migrations)
        self._events_context = None  # a migration may change the table's column types
        self._command(
            f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (version UInt32, name String, "
            "checksum String, applied_ms Int64) ENGINE = ReplacingMergeTree ORDER BY version"
        )
        applied = self._applied()
        self._warn_changed(migrations, applied)
        if (
            all(m.version in applied for m in migrations)
            and self._ttl_current()
            and not self._table_settings_to_apply()
        ):
            return []
        self._lock(lock_timeout_s, lock_stale_s)
        try:
            applied = self._applied()  # another starter may have finished while we waited
            done: list[int] = []
            for migration in migrations:
                if migration.version in applied:
                    continue
                for statement in migration.statements(ttl_days=self.ttl_days):
                    self._command(statement)
                self.client.insert(
                    MIGRATIONS_TABLE,
                    [[migration.version, migration.name, migration.checksum, _now_ms()]],
                    column_names=["version", "name", "checksum", "applied_ms"],
                )
                log.info(
                    "status store migration applied",
                    extra={"version": migration.version, "migration": migration.name},
                )
                done.append(migration.version)
            self._apply_ttl()
            self._apply_table_settings()
            return done
        finally:
            self._unlock()

    def applied_migrations(self) -> dict[int, str]:
        return self._applied()

    def _applied(self) -> dict[int, str]:
        rows = self.client.query(
            f"SELECT version, checksum FROM {MIGRATIONS_TABLE} FINAL ORDER BY version"
        ).result_rows
        return {int(v): str(c) for v, c in rows}

    def _warn_changed(self, migrations: Sequence[Migration], applied: Mapping[int, str]) -> None:
        for m in migrations:
            if m.version in applied and applied[m.version] != m.checksum:
                log.warning(
                    "an applied status store migration file has changed; it is not re-applied "
                    "(add a new migration for schema changes)",
                    extra={"version": m.version, "migration": m.name},
                )

    def _engine_of(self, table: str) -> str | None:
        """The table's engine clause as ClickHouse prints it (TTL, SETTINGS); None: no table."""
        rows = self.client.query(
            "SELECT engine_full FROM system.tables "
            "WHERE database = {db:String} AND name = {t:String}",
            parameters={"db": self.database, "t": table},
        ).result_rows
        return str(rows[0][0]) if rows else None

    def _ttl_days_of(self, table: str) -> int | None:
        engine = self._engine_of(table)
        match = None if engine is None else _TTL_DAYS.search(engine)
        return int(match[1]) if match else None

    def _ttl_current(self) -> bool:
        return all(self._ttl_days_of(t) in (None, self.ttl_days) for t in TTL_TABLES)

    def _apply_ttl(self) -> None:
        """Make the tables' TTL match ``status_ttl_days`` (a migration bakes in the first value)."""
        for table, expr in TTL_TABLES.items():
            days = self._ttl_days_of(table)
            if days is not None and days != self.ttl_days:
                self._command(
                    f"ALTER TABLE {table} MODIFY TTL {expr} + INTERVAL {self.ttl_days} DAY"
                )
                log.info(
                    "status store TTL changed",
                    extra={"table": table, "from_days": days, "to_days": self.ttl_days},
                )

    def _table_settings_to_apply(self) -> dict[str, str]:
        """``table -> "name = value, ..."`` of the :data:`EMBEDDED_TABLE_SETTINGS` a data table
        does not have yet (none on a server)."""
        if not self.embedded:
            return {}
        out = {}
        for table in TTL_TABLES:  # the tables that hold data; every one has a TTL
            engine = self._engine_of(table)
            if engine is None:
                continue
            wanted = {**EMBEDDED_TABLE_SETTINGS, **EMBEDDED_TABLE_SETTINGS_OF.get(table, {})}
            missing = [
                f"{name} = {value}"
                for name, value in wanted.items()
                if not re.search(rf"\b{name} = {re.escape(value)}\b", engine)
            ]
            if missing:
                out[table] = ", ".join(missing)
        return out

    def _apply_table_settings(self) -> None:
        for table, assignments in self._table_settings_to_apply().items():
            self._command(f"ALTER TABLE {table} MODIFY SETTING {assignments}")
            log.info(
                "status store table settings changed",
                extra={"table": table, "settings": assignments},
            )

    def _lock(self, timeout_s: float, stale_s: float) -> None:
        from clickhouse_connect.driver.exceptions import DatabaseError

        owner = f"{socket.gethostname()}:{os.getpid()}"
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.client.command(
                    f"CREATE TABLE {LOCK_TABLE} (x UInt8) ENGINE = Memory "
                    f"COMMENT '{owner} {_now_ms()}'"
                )
                return
            except DatabaseError as exc:
                if "TABLE_ALREADY_EXISTS" not in str(exc) and getattr(exc, "code", None) != 57:
                    raise StoreError(f"cannot take the migration lock: {exc}") from exc
            held_by, since_ms = self._lock_holder()
            if since_ms is not None and _now_ms() - since_ms > stale_s * 1000:
                log.warning(
                    "breaking a stale status store migration lock",
                    extra={"held_by": held_by, "age_ms": _now_ms() - since_ms},
                )
                self._unlock()
                continue
            if time.monotonic() > deadline:
                raise StoreError(
                    f"the status store migration lock {self.database}.{LOCK_TABLE} is held by "
                    f"{held_by}; if that process is gone, DROP TABLE {self.database}.{LOCK_TABLE}"
                )
            time.sleep(0.2)

    def _lock_holder(self) -> tuple[str, int | None]:
        rows = self.client.query(
            "SELECT comment FROM system.tables WHERE database = {db:String} AND name = {t:String}",
            parameters={"db": self.database, "t": LOCK_TABLE},
        ).result_rows
        if not rows:
            return "nobody", None
        owner, _, since = str(rows[0][0]).rpartition(" ")
        return owner, int(since) if since.isdigit() else None

    def _unlock(self) -> None:
        self._command(f"DROP TABLE IF EXISTS {LOCK_TABLE}")

    # --- writes and reads -------------------------------------------------------------------

    def insert_events(
        self, rows: Sequence[Sequence[Any]], *, dedup_token: str | None = None
    ) -> int:
        """Insert :func:`event_row` rows; ``dedup_token`` drops an identical retried batch.

        Sent column by column (the client serializes a column at a time anyway, so handing it
        rows costs a transposition per value in Python). Settings, for the ingest rate:
        ``parallel_view_processing`` runs the two materialized views side by side instead of
        one after the other; ``optimize_on_insert = 0`` skips collapsing duplicate keys inside
        the inserted block, which merges and every reader (FINAL, argMax) do anyway.

        Every insert goes through one reused insert context. Why: the client's own context per
        insert refers to itself (a bound method of it is one of its attributes) and keeps the
        inserted columns after the insert, so each batch lived until Python's cycle collector
        ran, and a service collects rarely (``jobwheel.cli._tune_gc``): measured, the sink grew
        by 390 MiB a minute at 2,000 jobs/s, every decoded string of every batch still held. A
        reused context holds at most the last batch, and the column types are looked up once
        instead of at every insert.
        """
        if not rows:
            return 0
        settings: dict[str, Any] = {"parallel_view_processing": 1, "optimize_on_insert": 0}
        if dedup_token:
            settings["insert_deduplication_token"] = dedup_token
        columns = [list(column) for column in zip(*rows, strict=True)]
        with self._insert_lock:
            try:
                if self._events_context is None:
                    self._events_context = self.client.create_insert_context(
                        "status_events", list(EVENT_COLUMNS), column_oriented=True
                    )
                context = self._events_context
                context.settings = settings
                self.client.insert(data=columns, context=context)
            except Exception as exc:
                self._events_context = None  # made again (types looked up) by the next insert
                raise StoreError(f"inserting {len(rows)} status events failed: {exc}") from exc
        return len(rows)

    def release_engine_memory(self) -> None:
        """Return the embedded engine's freed pages to the system (``SYSTEM JEMALLOC PURGE``;
        nothing on a server, whose memory is its own).

        Why: the engine's allocator keeps freed pages for reuse, and its own purging lagged:
        measured, 220 to 290 MiB of freed pages stayed resident after inserts and merges that
        had allocated them, next to 60 MiB in use.
        """
        if self.embedded:
            self._command("SYSTEM JEMALLOC PURGE")

    def add_events(self, events: Iterable[StatusEvent]) -> int:
        """Insert model events directly (tests, tools); the sink uses :meth:`insert_events`."""
        return self.insert_events([event_row(e) for e in events])

    def query(
        self,
        sql: str,
        parameters: Mapping[str, Any] | None = None,
        *,
        settings: Mapping[str, Any] | None = None,
    ) -> tuple[list[str], list[str], list[tuple[Any, ...]]]:
        """Run a SELECT; return (column names, ClickHouse type names, rows).

        Raises :class:`QueryError` with ClickHouse's message when the SQL is wrong, so API
        callers can answer 400 instead of 500.
        """
        try:
            result = self.client.query(
                sql, parameters=dict(parameters or {}), settings=dict(settings or {})
            )
        except Exception as exc:
            # ClickHouse answered with an error about this query (it has a code): the caller's
            # to fix. Anything else (closed client, connection refused) is the store's state.
            if getattr(exc, "code", None) or "DB::Exception" in str(exc):
                raise QueryError(clickhouse_message(exc)) from exc
            raise StoreError(f"status store query failed: {exc}") from exc
        types = [t.name for t in result.column_types]
        return list(result.column_names), types, list(result.result_rows)

    def dicts(self, sql: str, parameters: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        names, _, rows = self.query(sql, parameters)
        return [dict(zip(names, row, strict=True)) for row in rows]

    def ping(self) -> bool:
        try:
            return bool(self.client.ping())
        except Exception:
            return False

    def _command(self, sql: str) -> None:
        try:
            self.client.command(sql)
        except Exception as exc:
            raise StoreError(f"status store statement failed: {exc}\n{sql[:300]}") from exc


def clickhouse_message(exc: Exception, limit: int = 1000) -> str:
    """ClickHouse's own error text, without the client's repeated prefixes and trailers, cut
    to ``limit`` characters (a syntax error quotes the rest of the statement, however long)."""
    text = str(exc).strip()
    idx = text.rfind("DB::Exception: ")
    if idx >= 0:
        text = text[idx + len("DB::Exception: ") :]
    text = re.sub(r"\s*\(version [^)]*\)\.?", "", text).strip()
    return text if len(text) <= limit else text[:limit] + "…"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
