"""Hostile and malformed requests to the status API: /sql that would write or reach the host,
requests without the API token, and values that used to end in a 500.

Embedded store (chdb), no Kafka: every request here must be answered before a job client
exists (the factory fails the test if called).
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from jobwheel.consumers.status.api import create_app
from jobwheel.consumers.status.store import StatusStore
from jobwheel.settings import Settings
from tests.status_support import lifecycle, now_ms
from tests.support import jobwheel_argv, wait_until


def _no_kafka() -> Any:
    raise AssertionError("an invalid request reached the job client")


def _client(store: StatusStore, settings: Settings) -> Iterator[TestClient]:
    app = create_app(settings, store, job_client_factory=_no_kafka)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture
def api(store: StatusStore) -> Iterator[TestClient]:
    yield from _client(store, Settings(_env_file=None))  # type: ignore[call-arg]


# --- /sql writes nothing, reaches nothing -------------------------------------------------


OUTFILE_FORMS = [
    "SELECT 'x' INTO OUTFILE '{path}'",
    "SELECT 'x' INTO OUTFILE '{path}' APPEND",
    "SELECT 'x' INTO OUTFILE '{path}' TRUNCATE",
    "SELECT 'x' INTO OUTFILE '{path}' TRUNCATE FORMAT CSV",
    "SELECT 'x' INTO OUTFILE '{path}' AND STDOUT",
    "SELECT 'x' INTO OUTFILE '{path}' COMPRESSION 'gzip' LEVEL 3",
    "select 'x' into outfile '{path}'",
    "  -- comment\n/* another */ (SELECT 'x') INTO OUTFILE '{path}';",
    "WITH 1 AS a SELECT a INTO OUTFILE '{path}'",
    "SELECT 1 UNION ALL SELECT 2 INTO OUTFILE '{path}'",
    "SELECT 1 INTERSECT SELECT 1 INTO OUTFILE '{path}'",
    "SELECT count() FROM jobs INTO OUTFILE '{path}'",
    "EXPLAIN SELECT 1 INTO OUTFILE '{path}'",
    "EXPLAIN PLAN SELECT 1 INTO OUTFILE '{path}'",
    "EXPLAIN AST SELECT 1 INTO OUTFILE '{path}'",
    "EXPLAIN SYNTAX SELECT 1 INTO OUTFILE '{path}'",
    "SHOW TABLES INTO OUTFILE '{path}'",
    "DESCRIBE TABLE jobs INTO OUTFILE '{path}'",
    "EXISTS TABLE jobs INTO OUTFILE '{path}'",
    "SHOW CREATE TABLE jobs INTO OUTFILE '{path}'",
    "SELECT 1; SELECT 'x' INTO OUTFILE '{path}'",
    "SELECT 1 INTO OUTFILE '{path}' SETTINGS readonly = 0",
    # a quoted alias with newlines prints extra lines in EXPLAIN AST; they must not hide a node
    "SELECT 1 AS `a\n ExpressionList\n Identifier Native` INTO OUTFILE '{path}'",
    "EXPLAIN SELECT 1 AS `a\n Identifier Native\n SelectWithUnionQuery` INTO OUTFILE '{path}'",
    "EXPLAIN SELECT 1 AS `a\n Identifier Native` INTO OUTFILE '{path}'",
    "SELECT 1 AS `a\nSelectWithUnionQuery (children 1)` INTO OUTFILE '{path}'",
    "INSERT INTO FUNCTION file('{path}', 'CSV') SELECT 1",
]


@pytest.mark.parametrize("form", OUTFILE_FORMS)
def test_sql_never_writes_a_file(api: TestClient, tmp_path: Path, form: str) -> None:
    target = tmp_path / "written.txt"
    r = api.post("/sql", json={"sql": form.format(path=target)})
    assert r.status_code == 400, r.text
    assert not target.exists()


@pytest.mark.parametrize("suffix", ["APPEND", "TRUNCATE", ""])
def test_sql_leaves_an_existing_file_alone(api: TestClient, tmp_path: Path, suffix: str) -> None:
    target = tmp_path / "existing.txt"
    target.write_text("keep me\n")
    r = api.post("/sql", json={"sql": f"SELECT 'x' INTO OUTFILE '{target}' {suffix}"})
    assert r.status_code == 400
    assert target.read_text() == "keep me\n"


@pytest.mark.parametrize(
    ("sql", "needle"),
    [
        ("SELECT file('/etc/hostname')", "file"),
        ("SELECT * FROM file('/etc/hostname', 'LineAsString')", "file"),
        ("SELECT * FROM FILE('/etc/hostname', 'LineAsString')", "file"),
        ("DESCRIBE TABLE file('/etc/hostname', 'LineAsString')", "file"),
        ("SELECT * FROM url('http://127.0.0.1:9/x', 'CSV', 'x String')", "url"),
        ("SELECT * FROM s3('http://127.0.0.1:9/b/x.csv')", "s3"),
        ("SELECT * FROM remote('127.0.0.1:9', system.one)", "remote"),
        ("SELECT * FROM executable('id', 'TSV', 'x String')", "executable"),
        ("SELECT * FROM python('settings')", "python"),
        ("SELECT * FROM filesystem('/etc')", "filesystem"),
        ("SELECT * FROM mysql('127.0.0.1:9', 'db', 't', 'u', 'p')", "mysql"),
        ("EXPLAIN PLAN SELECT * FROM url('http://127.0.0.1:9/x', 'CSV', 'x String')", "url"),
        ("SELECT * FROM jobs WHERE job_id IN (SELECT * FROM file('/etc/hostname'))", "file"),
        ("SELECT 1 SETTINGS max_execution_time = 100000", "settings"),
        ("SELECT (SELECT 1 SETTINGS max_threads = 64)", "settings"),
        ("SELECT 1 FORMAT JSON", "format"),
        ("DROP TABLE jobs", "read-only"),
        ("TRUNCATE TABLE status_events", "read-only"),
        ("ALTER TABLE status_events DELETE WHERE 1", "read-only"),
        ("INSERT INTO status_events (event_id) VALUES ('x')", "read-only"),
        ("CREATE TABLE x (a Int8) ENGINE = Memory", "read-only"),
        ("SET readonly = 0", "read-only"),
        ("SYSTEM DROP DNS CACHE", "read-only"),
        ("KILL QUERY WHERE 1", "read-only"),
        ("SELECT 1; DROP TABLE jobs", "one statement"),
        ("SELECT 1 PARALLEL WITH SELECT 2", "read-only"),
        ("EXPLAIN AST DROP TABLE jobs", "EXPLAIN"),
        ("", "empty"),
    ],
)
def test_sql_refuses_what_reaches_outside_or_changes_anything(
    api: TestClient, store: StatusStore, sql: str, needle: str
) -> None:
    r = api.post("/sql", json={"sql": sql})
    assert r.status_code == 400, r.text
    assert needle.lower() in r.json()["detail"].lower(), r.json()
    assert store.query("EXISTS TABLE jobs")[2] == [(1,)]
    assert store.query("SELECT count() FROM status_events")[2] == [(0,)]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count() FROM jobs",
        "SELECT state, count() FROM status_events FINAL GROUP BY state",
        "  -- comment\n  select 1;",
        "WITH 1 AS x SELECT x",
        "SELECT number FROM numbers(3)",
        "SELECT * FROM generate_series(1, 3)",
        "SELECT format('{} {}', 'a', 'b')",
        "SELECT 'INTO OUTFILE ''/tmp/x''' AS text",
        "SELECT 1 AS `into outfile`",
        "SELECT 1 UNION ALL SELECT 2",
        "SHOW TABLES",
        "DESCRIBE TABLE runs",
        "EXISTS TABLE jobs",
        "SHOW CREATE TABLE status_events",
        "EXPLAIN SELECT count() FROM jobs",
        "EXPLAIN AST SELECT 1",
        "(SELECT 1)",
    ],
)
def test_sql_still_reads(api: TestClient, sql: str) -> None:
    r = api.post("/sql", json={"sql": sql})
    assert r.status_code == 200, r.text
    assert r.json()["truncated"] is False


def test_queries_run_read_only_within_the_limits(api: TestClient) -> None:
    sql = (
        "SELECT getSetting('readonly'), getSetting('max_execution_time'), "
        "getSetting('max_result_rows'), getSetting('max_memory_usage')"
    )
    r = api.post("/sql", json={"sql": sql})
    assert r.status_code == 200, r.text
    assert r.json()["rows"] == [[1, 30, 10_001, 2_000_000_000]]


def test_a_slow_query_does_not_hold_up_health(api: TestClient, store: StatusStore) -> None:
    finished = threading.Event()
    answers: list[int] = []

    def slow() -> None:
        answers.append(api.post("/sql", json={"sql": "SELECT sleep(3) AS slow_marker"}).status_code)
        finished.set()

    thread = threading.Thread(target=slow)
    thread.start()
    try:
        wait_until(
            lambda: store.query(
                "SELECT count() FROM system.processes WHERE query LIKE '%slow_marker%' "
                "AND query NOT LIKE '%system.processes%'"
            )[2][0][0],
            10,
            interval_s=0.02,
            message="the slow query never started",
        )
        assert api.get("/health").status_code == 200
        assert api.get("/jobs").status_code == 200
        assert not finished.is_set(), "health answered only after the slow query finished"
    finally:
        thread.join()
    assert answers == [200]


def test_sql_beyond_its_connections_is_429_not_a_queue(store: StatusStore) -> None:
    """Waiting /sql requests would hold the threads every other request needs."""
    settings = Settings(_env_file=None, sql_concurrency=1)  # type: ignore[call-arg]
    for client in _client(store, settings):
        thread = threading.Thread(
            target=client.post, args=("/sql",), kwargs={"json": {"sql": "SELECT sleep(3) AS busy"}}
        )
        thread.start()
        try:
            wait_until(
                lambda: store.query(
                    "SELECT count() FROM system.processes WHERE query LIKE '%sleep(3) AS busy%' "
                    "AND query NOT LIKE '%system.processes%'"
                )[2][0][0],
                10,
                interval_s=0.02,
                message="the slow query never started",
            )
            r = client.post("/sql", json={"sql": "SELECT 1"})
            assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
            assert "JOBWHEEL_SQL_CONCURRENCY" in r.json()["detail"]
            assert client.get("/health").status_code == 200
        finally:
            thread.join()
        assert client.post("/sql", json={"sql": "SELECT 1"}).status_code == 200


# --- authentication ---------------------------------------------------------------------------

TOKEN = "write-token-0123456789"
READ_TOKEN = "read-token-9876543210"


@pytest.fixture
def secured(store: StatusStore) -> Iterator[TestClient]:
    settings = Settings(_env_file=None, api_token=TOKEN, api_read_token=READ_TOKEN)  # type: ignore[call-arg]
    yield from _client(store, settings)


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


READS = [
    ("GET", "/jobs", None),
    ("GET", "/jobs/some-job", None),
    ("GET", "/jobs/some-job/runs", None),
    ("GET", "/stats/states", None),
    ("POST", "/sql", {"sql": "SELECT 1"}),
    ("GET", "/jobs/some-job/commands/c1", None),
]
#: The pages that describe the API hold no data and are where a user enters the token (the
#: docs' Authorize, the console's login form with its script and style).
PAGES = [
    "/docs",
    "/openapi.json",
    "/docs/static/swagger-ui.css",
    "/console/login",
    "/console/static/console.js",
]
WRITES = [
    ("POST", "/jobs", {"task": "demo.echo"}),  # invalid (no trigger): 422 once authenticated
    ("POST", "/jobs/some-job/cancel", {"reason": "x" * 10_001}),  # invalid reason: 422
    ("POST", "/jobs/some-job/pause", {"why": 1}),
]


@pytest.mark.parametrize(("method", "path", "body"), READS + WRITES)
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Bearer {TOKEN[:-1]}"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
        {"X-Api-Token": TOKEN},
    ],
)
def test_without_the_right_token_every_endpoint_is_401(
    secured: TestClient, method: str, path: str, body: Any, headers: dict[str, str]
) -> None:
    r = secured.request(method, path, json=body, headers=headers)
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert "token" in r.json()["detail"]


@pytest.mark.parametrize(("method", "path", "body"), READS + WRITES)
def test_the_token_opens_every_endpoint(
    secured: TestClient, method: str, path: str, body: Any
) -> None:
    r = secured.request(method, path, json=body, headers=_auth(TOKEN))
    assert r.status_code in (200, 404, 422), r.text


@pytest.mark.parametrize(("method", "path", "body"), READS)
def test_the_read_token_reads(secured: TestClient, method: str, path: str, body: Any) -> None:
    r = secured.request(method, path, json=body, headers=_auth(READ_TOKEN))
    assert r.status_code in (200, 404), r.text


@pytest.mark.parametrize(("method", "path", "body"), WRITES)
def test_the_read_token_cannot_write(
    secured: TestClient, method: str, path: str, body: Any
) -> None:
    r = secured.request(method, path, json=body, headers=_auth(READ_TOKEN))
    assert r.status_code == 403, r.text


def test_health_needs_no_token(secured: TestClient) -> None:
    assert secured.get("/health").status_code == 200


@pytest.mark.parametrize("path", PAGES)
def test_the_docs_pages_need_no_token_and_offer_to_take_it(secured: TestClient, path: str) -> None:
    assert secured.get(path).status_code == 200
    schema = secured.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert schema["security"] == [{"bearer": []}]


@pytest.mark.parametrize(
    "path", ["/docs/static/../../jobs", "/docs/static/%2e%2e/%2e%2e/jobs", "/docsx", "/docs/x"]
)
def test_nothing_else_passes_as_a_docs_page(secured: TestClient, path: str) -> None:
    assert secured.get(path).status_code in (401, 404)


def test_token_from_a_file(store: StatusStore, tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    settings = Settings(_env_file=None, api_token_file=path)  # type: ignore[call-arg]
    for client in _client(store, settings):
        assert client.get("/jobs").status_code == 401
        assert client.get("/jobs", headers=_auth(TOKEN)).status_code == 200


# --- values that used to end in a 500 ---------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"task": "demo.echo", "in": 1e20}, "in"),
        ({"task": "demo.echo", "every": 1e20}, "every"),
        ({"task": "demo.echo", "now": True, "timeout": 1e20}, "timeout"),
        ({"task": "demo.echo", "in": 10**20}, "in"),
        ({"task": "demo.echo", "every": 2**63}, "every"),
        ({"task": "demo.echo", "in": "99999999999999999999999d"}, "in"),
        ({"task": "demo.echo", "in": "9" * 5000 + "s"}, "in"),
        ({"task": "demo.echo", "in": True}, "in"),
        ({"task": "demo.echo", "in": 1.5}, "in"),
        ({"task": "demo.echo", "in": "５s"}, "in"),
        ({"task": "demo.echo", "now": 1}, "now"),
        ({"task": "demo.echo", "now": True, "max_attempts": True}, "max_attempts"),
        ({"task": "demo.echo", "now": True, "max_attempts": 1e20}, "max_attempts"),
        ({"task": "demo.echo", "at": "9999-12-31T23:59:59-23:59"}, "at"),
        ({"task": "demo.echo", "at": "0001-01-01T00:00:00+01:00"}, "at"),
        ({"task": 5, "now": True}, "task"),
        ({"task": "t" * 10_000, "now": True}, "task"),
        ({"task": "../../etc/passwd", "now": True}, "task"),
        ({"task": "demo.echo", "now": True, "job_id": "j" * 10_000}, "job_id"),
        ({"task": "demo.echo", "now": True, "job_id": "a\nb"}, "job_id"),
        ({"task": "demo.echo", "now": True, "x" * 10_000: 1}, "x"),
    ],
)
def test_bad_values_are_422_naming_the_field(
    api: TestClient, body: dict[str, Any], field: str
) -> None:
    r = api.post("/jobs", json=body)
    assert r.status_code == 422, r.text
    payload = r.json()
    assert payload["field"].startswith(field), payload
    assert payload["detail"].startswith(f"{payload['field']}: ")
    assert len(payload["detail"]) < 400, payload["detail"]


def test_deeply_nested_args_are_refused(api: TestClient) -> None:
    body = '{"task": "demo.echo", "now": true, "args": ' + "[" * 5000 + "]" * 5000 + "}"
    r = api.post("/jobs", content=body, headers={"content-type": "application/json"})
    assert r.status_code in (400, 422), r.text


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("since=²", "since"),
        ("since=%C2%B2", "since"),
        ("until=³", "until"),
        ("since=" + "1" * 23, "since"),
        ("since=-1", "since"),
        ("since=" + "9" * 5000, "since"),
        ("until=253402300800000", "until"),
        ("since=0001-01-01T00:00:00%2B01:00", "since"),
        ("offset=" + str(2**40), "offset"),
        ("offset=" + str(2**70), "offset"),
        ("limit=" + str(2**70), "limit"),
        ("state=" + "X" * 10_000, "state"),
    ],
)
def test_bad_list_filters_are_422_naming_the_field(api: TestClient, query: str, field: str) -> None:
    r = api.get(f"/jobs?{query}")
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field, r.json()
    assert len(r.json()["detail"]) < 400


def test_a_huge_age_means_since_the_epoch(api: TestClient, store: StatusStore) -> None:
    store.add_events(lifecycle("old-job", now_ms()))
    assert api.get("/jobs?since=999999999d").json()["total"] == 1


def test_an_unknown_long_job_id_is_cut_in_the_404(api: TestClient) -> None:
    r = api.get("/jobs/" + "j" * 10_000)
    assert r.status_code == 404
    assert len(r.json()["detail"]) < 300


def test_a_query_cannot_take_the_processs_memory(api: TestClient) -> None:
    # 1 MB a row: the limit is reached in a few thousand rows, long before the query's time
    # limit, however loaded the machine.
    sql = "SELECT groupArray(repeat('x', 1000000)) FROM numbers(1000000)"
    r = api.post("/sql", json={"sql": sql})
    assert r.status_code == 400, r.text
    assert "memory" in r.json()["detail"].lower()


# --- property tests: whatever the body or query, a 4xx (or 503 with no broker), never a 500 ---

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
_FIELDS = [
    "task",
    "job_id",
    "args",
    "now",
    "at",
    "in",
    "every",
    "start_at",
    "cron",
    "tz",
    "max_attempts",
    "timeout",
    "visibility_timeout",
    "starting_deadline",
    "concurrency_policy",
    "idempotency_key",
]


def _no_broker() -> Any:
    from jobwheel.errors import BrokerConnectionError

    raise BrokerConnectionError("no broker in this test")


@pytest.fixture(scope="module")
def fuzz_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    engine = tmp_path_factory.getbasetemp() / "status-chdb"
    store = StatusStore.open(f"chdb://{engine}", database="fuzz_api", ttl_days=30)
    app = create_app(Settings(_env_file=None), store, job_client_factory=_no_broker)  # type: ignore[call-arg]
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client
    store.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.dictionaries(st.sampled_from(_FIELDS) | st.text(max_size=5), _json, max_size=6))
@example(body={"": None, "task": ""})  # a blank unknown key was reported as field ""
def test_any_schedule_body_is_a_4xx_or_503(fuzz_api: TestClient, body: dict[str, Any]) -> None:
    r = fuzz_api.post("/jobs", json=body)
    assert r.status_code in (422, 503), (body, r.text)
    if r.status_code == 422:
        assert r.json()["field"] and len(r.json()["detail"]) < 500


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    params=st.dictionaries(
        st.sampled_from(["state", "task", "since", "until", "limit", "offset"]),
        st.text(max_size=25) | st.integers().map(str),
        max_size=4,
    )
)
def test_any_list_query_is_a_200_or_422(fuzz_api: TestClient, params: dict[str, str]) -> None:
    r = fuzz_api.get("/jobs", params=params)
    assert r.status_code in (200, 422), (params, r.text)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1", "example.org"])
def test_serve_refuses_a_network_address_without_a_token(host: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBWHEEL_")}
    env["JOBWHEEL_DATA_DIR"] = str(tmp_path)
    result = subprocess.run(
        jobwheel_argv(["jobwheel", "serve", "--host", host]),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "without authentication" in result.stderr and "JOBWHEEL_API_TOKEN" in result.stderr
    assert not (tmp_path / "clickhouse").exists()  # refused before opening anything
