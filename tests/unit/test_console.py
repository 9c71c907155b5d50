"""The web console on an embedded store, without Kafka: pages, login, and who may do what.

The browser test (tests/integration/test_console_browser.py) drives the same pages in Chromium
on the real pipeline; here every rule of the login and the pages' content is checked quickly.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from jobwheel.consumers.status.api import create_app
from jobwheel.consumers.status.console import charts, session
from jobwheel.consumers.status.store import StatusStore
from jobwheel.schemas.models import State
from jobwheel.settings import Settings
from tests.status_support import event, lifecycle, now_ms

TOKEN = "console-write-token-0123456789"
READ_TOKEN = "console-read-token-0123456789"
NO_KAFKA = "127.0.0.1:1"


def _no_kafka() -> Any:
    raise AssertionError("the request reached the job client")


def _client(store: StatusStore, **tokens: Any) -> TestClient:
    settings = Settings(_env_file=None, bootstrap_servers=NO_KAFKA, **tokens)  # type: ignore[call-arg]
    app = create_app(settings, store, job_client_factory=_no_kafka)
    return TestClient(app, raise_server_exceptions=False, follow_redirects=False)


@pytest.fixture
def open_api(store: StatusStore) -> Iterator[TestClient]:
    with _client(store) as client:
        yield client


@pytest.fixture
def secured(store: StatusStore) -> Iterator[TestClient]:
    with _client(store, api_token=TOKEN, api_read_token=READ_TOKEN) as client:
        yield client


@pytest.fixture
def filled(store: StatusStore) -> int:
    t0 = now_ms() - 120_000
    events = lifecycle("job-1", t0)
    events += lifecycle("<script>alert(1)</script>", t0 + 10, task="demo.sleep")
    events.append(
        event(
            "cron-1", State.SCHEDULED, seq=1, t=t0 + 20, task="demo.echo", next_fire_ms=t0 + 900_000
        )
    )
    store.add_events(events)
    return t0


def _login(client: TestClient, token: str, next_path: str = "/") -> Any:
    return client.post(
        "/console/login",
        content=f"token={token}&next={next_path}",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )


# --- pages ----------------------------------------------------------------------------------


def test_the_overview_counts_jobs_by_state_and_draws_both_charts(
    open_api: TestClient, filled: int
) -> None:
    r = open_api.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert re.search(r'id="count-completed"><span class="n">2<', html)
    assert re.search(r'id="count-scheduled"><span class="n">1<', html)
    runs, late = html.split('id="chart-runs"')[1], html.split('id="chart-lateness"')[1]
    assert "<svg" in runs and 'data-series="SUCCEEDED"' in runs
    assert 'data-series="p99"' in late and "7 ms" in late  # lifecycle() dispatches 7 ms late
    assert "cannot reach Kafka" in html  # the pipeline section says why it has no groups
    assert 'href="/docs"' in html
    # nothing from anywhere else: every script, style and link is local
    for url in re.findall(r'(?:src|href)="([^"]+)"', html):
        assert url.startswith("/"), url


def test_the_jobs_page_filters_by_state_and_escapes_what_it_shows(
    open_api: TestClient, filled: int
) -> None:
    html = open_api.get("/console/jobs", params={"state": "COMPLETED"}).text
    assert 'href="/console/jobs/job-1"' in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert" not in html
    assert "cron-1" not in html
    assert "cron-1" in open_api.get("/console/jobs", params={"state": "scheduled"}).text
    bad = open_api.get("/console/jobs", params={"state": "SUCCEEDED"})
    assert bad.status_code == 200 and "not a job state" in bad.text


def test_the_job_page_shows_runs_with_lateness_duration_and_result_and_the_buttons(
    open_api: TestClient, filled: int
) -> None:
    html = open_api.get("/console/jobs/job-1").text
    assert "7 ms" in html and "100 ms" in html  # lateness and duration of lifecycle()'s run
    assert '<code class="result">{&quot;ok&quot;: true}</code>' in html
    assert 'data-command="trigger"' in html and 'data-command="pause"' not in html  # COMPLETED
    scheduled = open_api.get("/console/jobs/cron-1").text
    assert {"pause", "trigger", "cancel"} <= set(re.findall(r'data-command="(\w+)"', scheduled))
    assert open_api.get("/console/jobs/nope").status_code == 404
    hostile = open_api.get("/console/jobs/%3Cscript%3Ealert(1)%3C%2Fscript%3E")
    assert hostile.status_code == 200 and "<script>alert" not in hostile.text


def test_the_console_pages_answer_while_kafka_is_down(open_api: TestClient, filled: int) -> None:
    html = open_api.get("/console/cluster").text
    assert html.count("cannot reach Kafka") >= 2
    dead = open_api.get("/console/dead-letters")
    assert dead.status_code == 200 and "dead-letter topic" in dead.text


def test_charts_put_each_point_where_its_value_is() -> None:
    svg = charts.line_chart(
        {"p99": [(0, 50.0), (60_000, 100.0)]}, start_ms=0, end_ms=60_000, title="t", unit=" ms"
    )
    points = re.search(r'points="([^"]+)"', svg)[1].split()  # type: ignore[index]
    (x0, y0), (x1, y1) = (tuple(map(float, p.split(","))) for p in points)
    assert x0 == charts.LEFT and x1 == charts.WIDTH - charts.RIGHT
    assert y1 == charts.TOP and y0 > y1  # 100 is the axis's top, 50 half-way down
    assert "no data" in charts.stacked_bars({}, start_ms=0, end_ms=1, bucket_ms=1, title="x")


# --- login and rights -----------------------------------------------------------------------


def test_a_page_load_without_a_token_goes_to_the_login_form(secured: TestClient) -> None:
    r = secured.get("/console/jobs", params={"state": "DEAD"})
    assert r.status_code == 303
    assert r.headers["location"] == "/console/login?next=%2Fconsole%2Fjobs%3Fstate%3DDEAD"
    assert secured.get("/").headers["location"] == "/console/login?next=%2F"
    form = secured.get("/console/login")
    assert form.status_code == 200 and 'name="token"' in form.text
    assert secured.get("/console/static/console.js").status_code == 200
    assert secured.get("/stats/states").status_code == 401  # the API still answers 401


def test_logging_in_sets_a_session_cookie_that_opens_pages_and_reads(
    secured: TestClient, filled: int
) -> None:
    wrong = _login(secured, "not-the-token")
    assert wrong.status_code == 401 and "not this API" in wrong.text
    assert session.COOKIE not in wrong.cookies
    r = _login(secured, TOKEN, "/console/jobs")
    assert r.status_code == 303 and r.headers["location"] == "/console/jobs"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and TOKEN not in cookie
    assert secured.get("/console/jobs").status_code == 200
    assert secured.get("/stats/states").json()["total"] == 3


def test_a_cookie_changes_things_only_with_the_consoles_header(secured: TestClient) -> None:
    _login(secured, TOKEN)
    body = {"reason": "x" * 10_001}  # invalid: a 422 proves the request got past the auth
    assert secured.post("/jobs/j/pause", json=body).status_code == 401
    passed = secured.post("/jobs/j/pause", json=body, headers={"x-jobwheel-console": "1"})
    assert passed.status_code == 422


def test_a_read_token_session_reads_but_cannot_command(secured: TestClient, filled: int) -> None:
    _login(secured, READ_TOKEN)
    page = secured.get("/console/jobs/cron-1").text
    assert "read-only token" in page and 'data-command="pause"' not in page
    r = secured.post("/jobs/cron-1/pause", json={}, headers={"x-jobwheel-console": "1"})
    assert r.status_code == 403


def test_forged_expired_and_logged_out_sessions_open_nothing(secured: TestClient) -> None:
    body = "write.9999999999999"
    forged = f"{body}.{'0' * 64}"
    expired = session.issue("write", TOKEN, now_s=0)
    other = session.issue("write", "another-deployments-token")
    for value in (forged, expired, other, "read." + session.issue("write", TOKEN)[6:]):
        secured.cookies.set(session.COOKIE, value)
        assert secured.get("/").status_code == 303, value
    secured.cookies.clear()
    _login(secured, TOKEN)
    assert secured.get("/").status_code == 200
    assert secured.post("/console/logout").status_code == 303
    assert secured.get("/").status_code == 303


def test_login_returns_only_to_a_page_of_this_site(secured: TestClient) -> None:
    for target in ("//evil.example/x", "https://evil.example/", "\\\\evil", "javascript:x"):
        r = _login(secured, TOKEN, target)
        assert r.headers["location"] == "/", target
