"""Ad-hoc SQL on the status store (``POST /sql``, ``jobwheel sql``) that can only read.

``readonly=1`` is not enough on its own. ClickHouse refuses writes, DDL and setting changes under
it, but ``INTO OUTFILE`` is carried out by whoever runs the query, and in the embedded engine
that is this process: ``SELECT 'x' INTO OUTFILE '/some/path'`` (``APPEND``, ``TRUNCATE``, and
even under ``EXPLAIN``) writes on the host. Table functions (``file``, ``url``, ``s3``,
``remote``, ``executable``, chdb's ``python``...) and the scalar ``file()`` read the host's
files or reach the network. So every statement is first parsed by ClickHouse itself
(``EXPLAIN AST``, which only parses) and its tree is checked (:func:`check_tree`):

- one statement, of a reading kind: SELECT (with WITH, UNION, INTERSECT...), EXPLAIN of a
  SELECT, SHOW TABLES/COLUMNS/CREATE TABLE, DESCRIBE, EXISTS;
- no ``INTO OUTFILE`` (a literal directly under the statement), no ``FORMAT`` (the API picks
  it), no ``SETTINGS`` anywhere (the limits below are not the caller's to raise);
- no function named like a table function other than the few that only generate rows
  (:data:`ALLOWED_TABLE_FUNCTIONS`), and no scalar ``file()``.

Then it runs with ``readonly=1`` and the limits (:data:`SQL_TIMEOUT_S`, :data:`SQL_MAX_ROWS`,
:data:`SQL_MAX_MEMORY_BYTES`) on
a connection of its own: chdb allows several handles on the one engine of the process, and a
ClickHouse server is asked over a pool of HTTP connections, so a slow query never holds up
``/health``, the other reads or the sink. On a server, ``JOBWHEEL_CLICKHOUSE_SQL_URL`` should name
a read-only user (``deploy/compose/clickhouse/users.d/jobwheel_sql.xml``): the server then
refuses what the parser check might miss, and settings that user may not change are left to its
profile instead of being sent.

The tree check reads EXPLAIN AST's text, one node per line, indented by depth. Identifiers and
aliases are printed raw, so a quoted identifier holding a newline can add lines of its choosing;
the checks are written so that added lines can only make a statement be refused, never hide a
real node: kinds and function names are checked on every line, and the statement's own
children are found by depth under a root that must be the only line at depth 0.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobwheel.consumers.status.store import StatusStore, clickhouse_message
from jobwheel.errors import QueryBusyError, QueryError, StoreError, clip

if TYPE_CHECKING:
    from jobwheel.settings import Settings

log = logging.getLogger(__name__)

SQL_MAX_ROWS = 10_000
SQL_TIMEOUT_S = 30
#: The embedded engine runs inside the API's process: one query must not take its memory.
SQL_MAX_MEMORY_BYTES = 2_000_000_000
MAX_SQL_CHARS = 100_000

#: Statement kinds (the root of EXPLAIN AST) that read, and which children each may have.
#: A child kind not listed (a ``Literal``: INTO OUTFILE and its COMPRESSION; ``Set``) is refused.
_ROOTS: dict[str, frozenset[str]] = {
    "SelectWithUnionQuery": frozenset({"ExpressionList", "Identifier"}),
    "DescribeQuery": frozenset({"TableExpression", "Identifier"}),
    "ShowTables": frozenset({"Identifier"}),
    "ShowColumns": frozenset({"Identifier"}),
    "ExistsTableQuery": frozenset({"Identifier"}),
    "ShowCreateTableQuery": frozenset({"Identifier"}),
    "Explain": frozenset({"SelectWithUnionQuery", "Identifier"}),
}
#: Table functions that only generate rows: no files, no network, no other process.
ALLOWED_TABLE_FUNCTIONS = frozenset(
    {
        "numbers",
        "numbers_mt",
        "zeros",
        "zeros_mt",
        "generate_series",
        "generateseries",
        "primes",
        "values",
        "view",
        "format",
        "null",
        "generaterandom",
    }
)
#: Table functions of the embedded engine (chdb 4.4 / ClickHouse 26.9), lower case; the live
#: list of ``system.table_functions`` is added to it when the store can be asked.
KNOWN_TABLE_FUNCTIONS = frozenset(
    """sqlstandardvalues arrowstream azureblobstorage azureblobstoragecluster bigquery cluster
    clusterallreplicas cosn deltalake deltalakeazure deltalakeazurecluster deltalakecluster
    deltalakelocal deltalakes3 deltalakes3cluster dictionary eval executable file filecluster
    filesystem format fuzzjson fuzzquery gcs generaterandom generateseries generate_series hdfs
    hdfscluster hudi hudicluster iceberg icebergazure icebergazurecluster icebergcluster
    iceberghdfs iceberghdfscluster iceberglocal iceberglocalcluster icebergs3 icebergs3cluster
    input jdbc loop merge mergetreeanalyzeindexes mergetreeanalyzeindexesuuid
    mergetreecodecblockcounts mergetreeindex mergetreeprojection mergetreetextindex mongodb mysql
    null numbers numbers_mt odbc oss paimon paimonazure paimonazurecluster paimoncluster
    paimonhdfs paimonhdfscluster paimonlocal paimons3 paimons3cluster postgresql primes
    prometheusquery prometheusqueryrange python redis remote remotesecure s3 s3cluster sqlite
    timeseriesdata timeseriesmetricfamilies timeseriesmetrics timeseriessamples
    timeseriesselector timeseriestags url urlcluster values view viewexplain viewifpermitted
    ytsaurus zeros zeros_mt""".split()
)
#: Scalar functions that touch the host.
DENIED_FUNCTIONS = frozenset({"file"})

_HELP = "send one SELECT, WITH, SHOW, DESCRIBE, EXISTS or EXPLAIN statement"


@dataclass(frozen=True)
class _Line:
    depth: int
    kind: str
    rest: str


def _lines(rows: Sequence[str]) -> list[_Line]:
    out = []
    for row in rows:
        text = row.lstrip(" ")
        kind, _, rest = text.partition(" ")
        out.append(_Line(len(row) - len(text), kind, rest))
    return out


def check_tree(
    rows: Sequence[str], table_functions: frozenset[str] = KNOWN_TABLE_FUNCTIONS
) -> None:
    """Refuse (:class:`QueryError`) a statement whose EXPLAIN AST ``rows`` could write, reach
    the host or change settings; see the module doc for the rules and why they hold."""
    lines = _lines(rows)
    if not lines or lines[0].depth != 0:
        raise QueryError(f"the statement could not be parsed; {_HELP}")
    root = lines[0]
    if root.kind not in _ROOTS:
        raise QueryError(f"only read-only queries are allowed ({_HELP}); got a {root.kind}")
    denied = (table_functions - ALLOWED_TABLE_FUNCTIONS) | DENIED_FUNCTIONS
    for line in lines[1:]:
        if line.depth == 0:
            raise QueryError(f"one statement per request; {_HELP}")
        if line.kind == "Set":
            raise QueryError(
                "SETTINGS are not allowed: the API runs every query read-only with its own limits "
                f"({SQL_TIMEOUT_S} s, {SQL_MAX_ROWS} rows)"
            )
        if line.kind == "Function":
            name = line.rest.split(" ", 1)[0]
            if name.lower() in denied:
                raise QueryError(
                    f"function {clip(name)} is not allowed here: only the status store's tables "
                    "are read (no files, network, other processes); table functions allowed: "
                    f"{', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))}"
                )
    _check_children(lines, 0)
    if root.kind == "Explain":
        children = [i for i, line in enumerate(lines) if line.depth == 1]
        if not children:
            raise QueryError(f"EXPLAIN of nothing; {_HELP}")
        inner, *rest = children
        if lines[inner].kind != "SelectWithUnionQuery" or any(
            lines[i].kind != "Identifier" or i != len(lines) - 1 for i in rest
        ):
            raise QueryError(f"EXPLAIN is allowed for one SELECT only; {_HELP}")
        _check_children(lines, inner)


def _check_children(lines: list[_Line], index: int) -> None:
    """The direct children of the statement at ``index``: no INTO OUTFILE, no FORMAT."""
    node = lines[index]
    allowed = _ROOTS[node.kind]
    for line in lines[index + 1 :]:
        if line.depth <= node.depth:
            break
        if line.depth != node.depth + 1:
            continue
        if line.kind == "Literal":
            raise QueryError(
                "INTO OUTFILE is not allowed: results are returned by the API, never written to "
                "files"
            )
        if line.kind not in allowed:
            raise QueryError(f"{clip(line.kind)} is not allowed in this statement; {_HELP}")
        if node.kind == "SelectWithUnionQuery" and line.kind == "Identifier":
            if line.rest.split(" ", 1)[0] != "Native":
                raise QueryError("FORMAT is not allowed: the API chooses the result format")


@dataclass
class SqlResult:
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    truncated: bool


class SqlRunner:
    """Runs ad-hoc read-only statements on connections of their own (see the module doc)."""

    def __init__(
        self,
        dsn: str,
        database: str,
        *,
        connections: int = 4,
        max_rows: int = SQL_MAX_ROWS,
        timeout_s: int = SQL_TIMEOUT_S,
    ) -> None:
        self.dsn = dsn
        self.database = database
        self.max_rows = max_rows
        self.timeout_s = timeout_s
        self._free: queue.LifoQueue[StatusStore] = queue.LifoQueue()
        self._all: list[StatusStore] = []
        self.connections = max(1, connections)
        self._slots = threading.BoundedSemaphore(self.connections)
        self._lock = threading.Lock()
        self._table_functions: frozenset[str] | None = None
        self._closed = False

    @classmethod
    def for_store(cls, settings: Settings, store: StatusStore) -> SqlRunner:
        """The embedded engine's handles, or the read-only server user when configured."""
        dsn = store.dsn if store.embedded else (settings.clickhouse_sql_url or store.dsn)
        return cls(dsn, store.database, connections=settings.sql_concurrency)

    @contextmanager
    def _connection(self) -> Iterator[StatusStore]:
        if not self._slots.acquire(blocking=False):
            raise QueryBusyError(
                f"{self.connections} SQL queries are running already (JOBWHEEL_SQL_CONCURRENCY); "
                "try again when one has finished"
            )
        try:
            try:
                store = self._free.get_nowait()
            except queue.Empty:
                with self._lock:
                    if self._closed:
                        raise StoreError("the status store is closed") from None
                    store = StatusStore.connect(self.dsn, database=self.database)
                    self._all.append(store)
            try:
                yield store
            finally:
                self._free.put(store)
        finally:
            self._slots.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for store in self._all:
                store.close()
            self._all.clear()

    def run(self, sql: str) -> SqlResult:
        """Check and run ``sql`` on a connection of the runner's own."""
        with self._connection() as store:
            return self.run_on(store, sql)

    def run_on(self, store: StatusStore, sql: str) -> SqlResult:
        """Check and run ``sql`` on ``store``'s connection (tools and tests)."""
        text = _trim(sql)
        limits = self._limits(store)
        # 1. One statement, by ClickHouse's parser, given as data: the embedded engine runs
        #    every statement of a multi-statement text, so nothing of the caller's text is
        #    executed before this holds.
        try:
            store.query("SELECT formatQuerySingleLine({q:String})", {"q": text}, settings=limits)
        except QueryError as exc:
            raise QueryError(
                f"not one statement ClickHouse can parse ({_HELP}): {_in_own_scope(exc, text)}"
            ) from exc
        # 2. Its tree (EXPLAIN AST only parses), checked. Without settings: the embedded
        #    engine's client appends them as a SETTINGS clause, which would show in the tree.
        # 3. Run with the limits and readonly=1.
        _, _, tree = store.query("EXPLAIN AST " + text)
        check_tree([str(row[0]) for row in tree], self._known_table_functions(store))
        try:
            names, types, rows = store.query(text, settings=limits)
        except QueryError as exc:
            raise QueryError(_in_own_scope(exc, text)) from exc
        return SqlResult(
            names, types, [list(r) for r in rows[: self.max_rows]], len(rows) > self.max_rows
        )

    def _limits(self, store: StatusStore) -> dict[str, Any]:
        """The limits, minus those the connected user may not change (a read-only server user
        has them in its profile; sending them would fail every query). readonly goes last: a
        server refuses setting changes made after it in the same request."""
        wanted = {
            "max_execution_time": self.timeout_s,
            "max_result_rows": self.max_rows + 1,
            "result_overflow_mode": "break",
            "max_memory_usage": SQL_MAX_MEMORY_BYTES,
            "readonly": 1,
        }
        server = getattr(store.client, "server_settings", {}) or {}
        out = {}
        for key, value in wanted.items():
            known = server.get(key)
            if known is not None and known.readonly:
                continue
            if key == "readonly" and known is not None and str(known.value) != "0":
                continue  # a read-only user already; ClickHouse refuses changing readonly then
            out[key] = value
        return out

    def _known_table_functions(self, store: StatusStore) -> frozenset[str]:
        if self._table_functions is None:
            try:
                _, _, rows = store.query("SELECT name FROM system.table_functions")
                live = frozenset(str(r[0]).lower() for r in rows)
            except (QueryError, StoreError) as exc:
                log.warning(
                    "cannot list table functions; using the built-in list",
                    extra={"error": clickhouse_message(exc)},
                )
                live = frozenset()
            self._table_functions = KNOWN_TABLE_FUNCTIONS | live
        return self._table_functions


#: ClickHouse's "In scope <query>." up to the error code it ends with, if any.
_SCOPE = re.compile(
    r"[.:]?\s*In scope .*?(?=\.?\s*\([A-Z][A-Z0-9_]*\)\s*$)|[.:]?\s*In scope .*$", re.DOTALL
)
#: How much of the caller's query an error repeats.
SCOPE_CHARS = 200


def _in_own_scope(exc: QueryError, text: str) -> str:
    """ClickHouse's message about ``text``, naming ``text`` as the query. ClickHouse names the
    query it ran, which is the checker's wrapper (``SELECT formatQuerySingleLine('...')``) or the
    caller's text with the limits appended as ``SETTINGS``: a user reading that would look for
    a clause they never wrote."""
    return _SCOPE.sub(lambda _: f". In scope {clip(text, SCOPE_CHARS)}", str(exc), count=1)


def _trim(sql: str) -> str:
    if len(sql) > MAX_SQL_CHARS:
        raise QueryError(f"the statement is {len(sql)} characters; at most {MAX_SQL_CHARS}")
    text = sql.strip()
    while text.endswith(";"):
        text = text[:-1].rstrip()
    if not text:
        raise QueryError(f"empty query: {_HELP}")
    return text
