"""The status store on a ClickHouse *server* (the compose/production mode), over HTTP.

Needs a Docker engine (testcontainers ``clickhouse/clickhouse-server``, the version of
deploy/compose); skipped without one. The embedded-engine tests cover the same SQL; this checks
what only a server has: concurrent starters over HTTP, no shared session between threads, and
``readonly=1`` passed as a request setting.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from jobwheel.consumers.status import queries
from jobwheel.consumers.status.store import StatusStore, load_migrations
from jobwheel.errors import QueryError
from tests.status_support import lifecycle, now_ms
from tests.support import docker_engine

IMAGE = "clickhouse/clickhouse-server:25.3"


pytestmark = pytest.mark.skipif(not docker_engine(), reason="needs a Docker engine for ClickHouse")


@pytest.fixture(scope="module")
def server_dsn() -> Iterator[str]:
    from testcontainers.community.clickhouse import ClickHouseContainer

    with ClickHouseContainer(IMAGE) as ch:
        host, port = ch.get_container_host_ip(), ch.get_exposed_port(8123)
        yield f"http://{ch.username}:{ch.password}@{host}:{port}"


def test_concurrent_starters_threads_and_read_only_sql_on_a_server(server_dsn: str) -> None:
    database = f"t_{uuid.uuid4().hex[:12]}"
    stores: list[StatusStore | BaseException] = []

    def start() -> None:
        try:
            stores.append(StatusStore.open(server_dsn, database=database, ttl_days=30))
        except BaseException as exc:  # pragma: no cover - shown by the assertion
            stores.append(exc)

    threads = [threading.Thread(target=start) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    opened = [s for s in stores if isinstance(s, StatusStore)]
    assert len(opened) == 3, stores
    store = opened[0]
    try:
        rows = store.query("SELECT version, count() FROM schema_migrations GROUP BY version")[2]
        assert sorted(rows) == [(m.version, 1) for m in load_migrations()]

        events = [e for i in range(20) for e in lifecycle(f"s-{i}", now_ms())]
        store.add_events(events + events[:10])
        # one client, many threads: no "session is locked" errors
        errors: list[BaseException] = []

        def read() -> None:
            try:
                for _ in range(10):
                    queries.state_counts(store)
            except BaseException as exc:  # pragma: no cover
                errors.append(exc)

        readers = [threading.Thread(target=read) for _ in range(4)]
        for t in readers:
            t.start()
        for t in readers:
            t.join()
        assert errors == []
        assert queries.state_counts(store) == {"COMPLETED": 20}
        result = queries.run_read_only(store, "SELECT count() FROM status_events FINAL")
        assert result.rows == [[len(events)]]
        with pytest.raises(QueryError, match="(?i)settings"):
            queries.run_read_only(store, "SELECT 1 SETTINGS readonly = 0")
    finally:
        store.client.command(f"DROP DATABASE IF EXISTS {database}")
        for s in opened:
            s.close()
