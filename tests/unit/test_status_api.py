"""The status API's read endpoints and its input validation, on an embedded store.

No Kafka here: accepted commands are tested in tests/integration/test_api.py on a real broker.
Every invalid request below must be refused before a producer exists, which the job client
factory that fails the test if called makes sure of.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from jobwheel.consumers.status.api import create_app
from jobwheel.consumers.status.store import StatusStore
from jobwheel.errors import StoreError
from jobwheel.schemas.models import State
from jobwheel.settings import Settings
from tests.status_support import docs_assets, event, lifecycle, now_ms


def _no_kafka() -> Any:
    raise AssertionError("an invalid request reached the job client")


@pytest.fixture
def api(store: StatusStore) -> Iterator[TestClient]:
    app = create_app(Settings(), store, job_client_factory=_no_kafka)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture
def filled(store: StatusStore) -> int:
    t0 = now_ms() - 60_000
    events = lifecycle("job-1", t0)
    events += lifecycle("job-2", t0 + 10, task="demo.sleep")
    events.append(event("job-3", State.SCHEDULED, seq=1, t=t0 + 20, task="demo.echo"))
    store.add_events(events + events[:3])  # a redelivered copy or three
    return t0


# --- reads ----------------------------------------------------------------------------------


def test_get_job_returns_state_and_runs(api: TestClient, filled: int) -> None:
    r = api.get("/jobs/job-1")
    assert r.status_code == 200
    body = r.json()
    assert body["job"]["state"] == "COMPLETED"
    assert body["job"]["task"] == "demo.echo"
    (run,) = body["runs"]
    assert run["run_id"] == f"job-1@{filled + 1000}"
    assert (run["state"], run["lateness_ms"], run["duration_ms"]) == ("SUCCEEDED", 7, 100)
    # The lifecycle in order, each event once although three were delivered twice.
    assert [e["state"] for e in body["events"]] == [
        "SCHEDULED",
        "DISPATCHED",
        "STARTED",
        "SUCCEEDED",
        "COMPLETED",
    ]


def test_job_events_follow_the_ordering_token_not_arrival(
    api: TestClient, store: StatusStore
) -> None:
    events = lifecycle("shuffled", now_ms())
    store.add_events(list(reversed(events)))
    states = [e["state"] for e in api.get("/jobs/shuffled").json()["events"]]
    assert states == ["SCHEDULED", "DISPATCHED", "STARTED", "SUCCEEDED", "COMPLETED"]


def test_unknown_job_is_404_with_a_reason(api: TestClient, filled: int) -> None:
    for path in ("/jobs/nope", "/jobs/nope/runs"):
        r = api.get(path)
        assert r.status_code == 404
        assert "nope" in r.json()["detail"]


def test_job_ids_with_slashes_and_at_signs(api: TestClient, store: StatusStore) -> None:
    store.add_events(lifecycle("team/a@b", now_ms()))
    assert api.get("/jobs/team/a@b").json()["job"]["job_id"] == "team/a@b"
    assert len(api.get("/jobs/team%2Fa@b/runs").json()["runs"]) == 1


def test_runs_endpoint(api: TestClient, filled: int) -> None:
    r = api.get("/jobs/job-2/runs")
    assert r.status_code == 200
    assert [x["state"] for x in r.json()["runs"]] == ["SUCCEEDED"]
    assert api.get("/jobs/job-2/runs?limit=0").status_code == 422


def test_list_filters_and_pages(api: TestClient, filled: int) -> None:
    body = api.get("/jobs").json()
    assert body["total"] == 3 and {j["job_id"] for j in body["jobs"]} == {
        "job-1",
        "job-2",
        "job-3",
    }
    assert [j["job_id"] for j in api.get("/jobs?state=scheduled").json()["jobs"]] == ["job-3"]
    assert [j["job_id"] for j in api.get("/jobs?task=demo.sleep").json()["jobs"]] == ["job-2"]
    page = api.get("/jobs?limit=2&offset=2").json()
    assert (len(page["jobs"]), page["total"], page["offset"]) == (1, 3, 2)
    assert api.get("/jobs?since=1h").json()["total"] == 3
    assert api.get(f"/jobs?until={filled + 20}").json()["total"] == 1
    assert api.get("/jobs?since=2000-01-01T00:00:00Z&until=2000-01-02T00:00:00Z").json() == {
        "jobs": [],
        "total": 0,
        "limit": 100,
        "offset": 0,
    }


def test_a_job_is_found_by_a_unique_start_of_its_id(api: TestClient, store: StatusStore) -> None:
    t0 = now_ms()
    ids = ["5e0f2f89", "5e0f77aa", *(f"ab12-{n}" for n in range(7)), "ab1"]
    store.add_events(
        [event(j, State.SCHEDULED, seq=1, t=t0, task="demo.echo", event_id=f"{j}:S") for j in ids]
    )
    assert api.get("/jobs/5e0f2").json()["job"]["job_id"] == "5e0f2f89"
    assert api.get("/jobs/5e0f7/runs").json() == {"job_id": "5e0f77aa", "runs": []}
    assert api.get("/jobs/ab1").json()["job"]["job_id"] == "ab1"  # an exact id wins
    both = api.get("/jobs/5e0f")
    assert both.status_code == 422 and both.json()["field"] == "job_id"
    assert both.json()["message"] == (
        "'5e0f' is the start of 2 job ids (5e0f2f89, 5e0f77aa); give more of the id"
    )
    many = api.get("/jobs/ab12-/runs").json()["message"]
    assert many.startswith("'ab12-' is the start of more than 5 job ids (ab12-0, ab12-1, ")
    assert "ab12-4, ...)" in many
    assert api.get("/jobs/5e0").status_code == 404  # under 4 characters: an id only


def test_a_commands_verdict_is_served_by_its_id(api: TestClient, store: StatusStore) -> None:
    t0 = now_ms()
    store.add_events(
        [
            event("job-v", State.SCHEDULED, seq=1, t=t0, task="demo.echo", event_id="c0:SCHEDULED"),
            event("job-v", State.PAUSED, seq=2, t=t0 + 1, event_id="c1:PAUSED"),
            event("job-v", State.REJECTED, seq=3, t=t0 + 2, event_id="c2:REJECTED", reason="no"),
            event("ghost", State.REJECTED, seq=0, t=t0, event_id="c3:REJECTED", reason="unknown"),
        ]
    )
    assert api.get("/jobs/job-v/commands/c1").json() == {
        "job_id": "job-v",
        "command_id": "c1",
        "state": "PAUSED",
        "reason": None,
        "event_time_ms": t0 + 1,
    }
    assert api.get("/jobs/job-v/commands/c2").json()["state"] == "REJECTED"
    # a made-up id: the scheduler's answer is there, the job is not
    assert api.get("/jobs/ghost/commands/c3").json()["reason"] == "unknown"
    assert api.get("/jobs/ghost").status_code == 404
    assert api.get("/jobs").json()["total"] == 1
    missing = api.get("/jobs/job-v/commands/c3")  # another job's command
    assert missing.status_code == 404 and "no answer" in missing.json()["detail"]

    # A resume's answer is the state the job is in after it, not the event's name RESUMED:
    # SCHEDULED again, or COMPLETED when its run ended while it was paused.
    store.add_events([event("job-v", State.RESUMED, seq=4, t=t0 + 3, event_id="c4:RESUMED")])
    assert api.get("/jobs/job-v/commands/c4").json()["state"] == "SCHEDULED"
    store.add_events(
        [
            event("job-e", State.SCHEDULED, seq=1, t=t0, task="demo.echo", event_id="c5:SCHEDULED"),
            event("job-e", State.PAUSED, seq=2, t=t0 + 1, event_id="c6:PAUSED"),
            event("job-e", State.RESUMED, seq=3, t=t0 + 2, event_id="c7:RESUMED"),
            event("job-e", State.COMPLETED, seq=3, t=t0 + 2),
        ]
    )
    assert api.get("/jobs/job-e/commands/c7").json()["state"] == "COMPLETED"


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("state=RUNNING", "state"),
        ("state=SUCCEEDED", "state"),  # a run's state: runs are in /jobs/{id}/runs and /sql
        ("state=REJECTED", "state"),
        ("since=last+tuesday", "since"),
        ("until=soon", "until"),
        ("since=1h&until=2h", "since"),
    ],
)
def test_list_rejects_bad_filters_naming_the_field(
    api: TestClient, filled: int, query: str, field: str
) -> None:
    r = api.get(f"/jobs?{query}")
    assert r.status_code == 422
    assert r.json()["field"] == field and r.json()["message"]


@pytest.mark.parametrize("query", ["limit=0", "limit=100000", "offset=-1", "limit=ten"])
def test_list_rejects_bad_paging(api: TestClient, query: str) -> None:
    r = api.get(f"/jobs?{query}")
    assert r.status_code == 422
    assert r.json()["detail"]


def test_stats_states(api: TestClient, filled: int) -> None:
    assert api.get("/stats/states").json() == {
        "states": {"COMPLETED": 2, "SCHEDULED": 1},
        "total": 3,
    }


def test_sql_reads(api: TestClient, filled: int) -> None:
    r = api.post(
        "/sql", json={"sql": "SELECT state, count() AS n FROM jobs GROUP BY state ORDER BY state"}
    )
    assert r.status_code == 200
    assert r.json() == {
        "columns": ["state", "n"],
        "types": ["String", "UInt64"],
        "rows": [["COMPLETED", 2], ["SCHEDULED", 1]],
        "truncated": False,
    }
    r = api.post("/sql", json={"sql": "SELECT count() FROM status_events FINAL"})
    assert r.json()["rows"] == [[13]]


@pytest.mark.parametrize(
    ("sql", "needle"),
    [
        ("DROP TABLE jobs", "read-only"),
        ("INSERT INTO status_events (event_id) VALUES ('x')", "read-only"),
        ("SELEC 1", "parse"),
        ("SELECT * FROM nowhere", "nowhere"),
        ("SELECT 1 SETTINGS readonly = 0", "settings"),
    ],
)
def test_sql_errors_are_400_with_the_clickhouse_message(
    api: TestClient, sql: str, needle: str
) -> None:
    r = api.post("/sql", json={"sql": sql})
    assert r.status_code == 400
    assert needle.lower() in r.json()["detail"].lower()


@pytest.mark.parametrize(
    "sql", ["SELEC 1", "SELECT 1 +", "SELECT * FROM nowhere", "SELECT nosuchcol FROM jobs"]
)
def test_sql_errors_name_the_callers_query_not_the_checks_wrapper(
    api: TestClient, sql: str
) -> None:
    """ClickHouse names the query it ran: the parse check's formatQuerySingleLine(...) or the
    caller's text with the limits appended as SETTINGS, neither of which the caller wrote."""
    r = api.post("/sql", json={"sql": sql})
    assert r.status_code == 400
    detail = r.json()["detail"]
    assert f"In scope {sql!r}." in detail, detail
    assert "formatQuerySingleLine" not in detail, detail
    assert "max_execution_time" not in detail, detail


@pytest.mark.parametrize("body", [{}, {"query": "SELECT 1"}, {"sql": 5}, []])
def test_sql_malformed_body_is_422(api: TestClient, body: Any) -> None:
    assert api.post("/sql", json=body).status_code == 422


def test_health(api: TestClient) -> None:
    r = api.get("/health")
    assert r.status_code == 200
    assert r.json()["status"] == "ok" and r.json()["store"]["ok"] is True
    assert r.json()["sink"] is None


def test_openapi_docs_are_served(api: TestClient) -> None:
    assert api.get("/docs").status_code == 200
    paths = api.get("/openapi.json").json()["paths"]
    assert {"/jobs", "/jobs/{job_id}", "/sql", "/health", "/stats/states"} <= set(paths)


def test_the_docs_page_loads_everything_from_this_server(api: TestClient) -> None:
    """No network needed: every asset of /docs is a local URL, and each one answers. (Before,
    Swagger UI's script and style came from a CDN and the page was blank offline.)"""
    html = api.get("/docs").text
    urls = docs_assets(html)
    assert any(u.endswith(".js") for u in urls) and any(u.endswith(".css") for u in urls), urls
    assert "/openapi.json" in urls
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), f"not local: {url}"
        r = api.get(url)
        assert r.status_code == 200, url
        assert len(r.content) > 100, url
    assert "cdn" not in html.lower() and "http://" not in html and "https://" not in html


def test_the_root_page_is_the_console_and_points_to_the_docs(api: TestClient) -> None:
    r = api.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'href="/docs"' in r.text and 'href="/console/jobs"' in r.text


# --- commands: everything invalid is refused before Kafka -----------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"task": "demo.echo"}, "trigger"),
        ({"task": "demo.echo", "now": True, "in": "5s"}, "trigger"),
        ({"task": "demo.echo", "cron": "61 * * * *"}, "cron"),
        ({"task": "demo.echo", "cron": "* * * * *", "tz": "Mars/Olympus"}, "timezone"),
        ({"task": "demo.echo", "every": "5 parsecs"}, "every"),
        ({"task": "demo.echo", "in": -5}, "in"),
        ({"task": "demo.echo", "at": "tomorrow"}, "at"),
        ({"task": "demo.echo", "at": "2020-01-01T00:00:00Z"}, "at"),
        ({"task": "bad task!", "now": True}, "task"),
        ({"task": "demo.echo", "now": True, "max_attempts": 0}, "max_attempts"),
        ({"task": "demo.echo", "now": True, "job_id": "has space"}, "job_id"),
        ({"task": "demo.echo", "now": True, "concurrency_policy": "SOMETIMES"}, "concurrency"),
        ({"task": "demo.echo", "now": True, "args": "x" * 70_000}, "args"),
    ],
)
def test_schedule_rejects_invalid_requests_with_the_field(
    api: TestClient, body: dict[str, Any], field: str
) -> None:
    r = api.post("/jobs", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["field"].startswith(field), r.json()
    assert r.json()["message"]


@pytest.mark.parametrize(
    "body", [{"now": True}, {"task": "demo.echo", "now": True, "colour": "red"}, [1, 2]]
)
def test_schedule_rejects_malformed_bodies(api: TestClient, body: Any) -> None:
    r = api.post("/jobs", json=body)
    assert r.status_code == 422
    assert r.json()["detail"]


def test_schedule_rejects_non_json(api: TestClient) -> None:
    r = api.post("/jobs", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422


@pytest.mark.parametrize("kind", ["cancel", "pause", "resume", "trigger"])
def test_control_rejects_invalid_reason_and_body(api: TestClient, kind: str) -> None:
    r = api.post(f"/jobs/job-1/{kind}", json={"reason": "x" * 10_001})
    assert r.status_code == 422 and r.json()["field"] == "reason"
    assert api.post(f"/jobs/job-1/{kind}", json={"why": "x"}).status_code == 422


# --- failures of the store are 503, never 500 -----------------------------------------------


def test_store_failure_is_503_not_500(engine_dsn: str) -> None:
    broken = StatusStore.open(engine_dsn, database="keeper", migrate=False)
    broken.close()
    app = create_app(Settings(), broken, job_client_factory=_no_kafka)
    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.get("/jobs/x")
        assert r.status_code == 503 and "unavailable" in r.json()["detail"]
        assert client.get("/health").status_code == 503


def test_error_handlers_cover_store_errors(store: StatusStore) -> None:
    app = create_app(Settings(), store, job_client_factory=_no_kafka)

    @app.get("/boom")
    def boom() -> None:
        raise StoreError("disk on fire")

    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.get("/boom")
    assert r.status_code == 503 and "disk on fire" in r.json()["detail"]


def test_the_api_schema_states_the_shortest_interval() -> None:
    from jobwheel.consumers.status.api import ScheduleRequest
    from jobwheel.schemas.validation import MIN_EVERY_MS

    every = ScheduleRequest.model_json_schema()["properties"]["every"]
    assert f"at least {MIN_EVERY_MS // 1000}s" in every["description"]
