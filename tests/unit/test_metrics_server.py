"""jobwheel/metrics.py: the HTTP server every service runs, its health answers, and the cheap
histogram the hot paths use. Real sockets on loopback; no Kafka needed."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from jobwheel.errors import ConfigError
from jobwheel.metrics import (
    OTHER,
    Collector,
    Health,
    Histogram,
    LabelLimiter,
    MetricsServer,
    counter,
    histogram,
    loop_check,
)


class _Counting(Collector):
    def __init__(self) -> None:
        self.n = 0
        self.ok = True

    def collect(self) -> Iterator:
        yield counter("jobwheel_test_things_total", "Things.", self.n)

    def checks(self) -> dict:
        return {"thing": (None, lambda: (self.ok, "fine" if self.ok else "thing is broken"))}


def _get(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read(), resp.headers["Content-Type"]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers["Content-Type"]


@pytest.fixture
def served() -> Iterator[tuple[MetricsServer, _Counting, Health]]:
    registry, health = CollectorRegistry(), Health()
    server = MetricsServer("127.0.0.1", 0, "test", registry=registry, health=health)
    collector = _Counting()
    uninstall = collector.install(registry, health)
    try:
        yield server, collector, health
    finally:
        uninstall()
        server.close()


def test_metrics_are_scraped_live_in_the_prometheus_format(served, capfd):
    server, collector, _ = served
    collector.n = 3
    code, body, content_type = _get(server.url + "/metrics")
    assert code == 200 and content_type.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert [s.value for s in families["jobwheel_test_things"].samples] == [3.0]
    collector.n = 5  # computed at scrape time, not at registration
    _, body, _ = _get(server.url + "/metrics")
    assert "jobwheel_test_things_total 5.0" in body.decode()
    # OpenMetrics when the scraper asks for it
    request = urllib.request.Request(
        server.url + "/metrics", headers={"Accept": "application/openmetrics-text"}
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        assert resp.read().rstrip().endswith(b"# EOF")
    # http.server logs each request to stderr; a service's stderr is its JSON log
    out, err = capfd.readouterr()
    assert "GET /metrics" not in out + err


def test_readiness_names_the_failing_check_and_liveness_ignores_readiness(served):
    server, collector, health = served
    code, body, _ = _get(server.url + "/health/ready")
    assert code == 200
    assert json.loads(body) == {
        "ok": True,
        "checks": [{"check": "thing", "ok": True, "detail": "fine"}],
        "service": "test",
    }
    collector.ok = False
    code, body, content_type = _get(server.url + "/health/ready")
    assert code == 503 and content_type == "application/json"
    report = json.loads(body)
    assert not report["ok"]
    assert report["checks"] == [{"check": "thing", "ok": False, "detail": "thing is broken"}]
    code, body, _ = _get(server.url + "/health/live")  # not ready is not dead
    assert code == 200 and json.loads(body)["ok"]


def test_a_hung_loop_fails_liveness_and_readiness(served):
    server, _, health = served
    turned = [0.0]  # monotonic time of the last turn: long ago
    remove = health.add("loop", live=loop_check("test loop", lambda: turned[0], 30.0))
    try:
        for path in ("/health/live", "/health/ready"):
            code, body, _ = _get(server.url + path)
            assert code == 503, path
            (failing,) = [c for c in json.loads(body)["checks"] if not c["ok"]]
            assert failing["check"] == "loop" and "has not turned for" in failing["detail"]
    finally:
        remove()
    code, _, _ = _get(server.url + "/health/live")
    assert code == 200  # removed with its component


def test_a_check_that_raises_is_a_failed_check_not_a_failed_server(served):
    server, _, health = served

    def broken() -> tuple[bool, str]:
        raise RuntimeError("boom")

    remove = health.add("broken", ready=broken)
    try:
        code, body, _ = _get(server.url + "/health/ready")
    finally:
        remove()
    assert code == 503
    assert {"check": "broken", "ok": False, "detail": "the check failed: RuntimeError: boom"} in (
        json.loads(body)["checks"]
    )


def test_a_collector_that_raises_is_a_500_naming_the_error_not_a_dropped_connection(served, caplog):
    """A collector's bug (a scheduler's once read a partition revoked since its input ends were
    sampled) failed the scrape: http.server closed the connection without an answer, and a
    test reading a metric saw only RemoteDisconnected."""
    server, collector, _ = served
    registry = server._server.registry

    class Broken(Collector):
        def collect(self) -> Iterator:
            raise AttributeError("'StandbyTask' object has no attribute 'requests_next'")

    broken = Broken()
    registry.register(broken)
    try:
        code, body, content_type = _get(server.url + "/metrics")
    finally:
        registry.unregister(broken)
    assert code == 500 and content_type.startswith("text/plain")
    assert "AttributeError: 'StandbyTask' object has no attribute 'requests_next'" in (
        body.decode()
    )
    (logged,) = [r for r in caplog.records if r.getMessage() == "metrics scrape failed"]
    assert logged.levelname == "ERROR" and logged.exc_info
    collector.n = 7  # and the server goes on serving
    assert "jobwheel_test_things_total 7.0" in _get(server.url + "/metrics")[1].decode()


def test_a_request_that_fails_outside_the_handler_is_logged_not_printed(served, caplog, capfd):
    """socketserver prints a failed request's traceback to stderr, outside the JSON log; a
    scraper that hung up is routine (debug), anything else an error with its traceback."""
    server, _, _ = served
    caplog.set_level("DEBUG", logger="jobwheel.metrics")
    for exc in (BrokenPipeError(32, "Broken pipe"), ValueError("odd")):
        try:
            raise exc
        except Exception:
            server._server.handle_error(None, ("127.0.0.1", 4242))
    gone, failed = [r for r in caplog.records if r.name == "jobwheel.metrics"]
    assert (gone.levelname, gone.getMessage()) == ("DEBUG", "metrics client went away")
    assert (failed.levelname, failed.getMessage()) == ("ERROR", "metrics request failed")
    assert failed.exc_info and failed.client == "127.0.0.1:4242"
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


def test_unknown_paths_are_404(served):
    server, _, _ = served
    assert _get(server.url + "/nope")[0] == 404


def test_a_taken_port_is_one_line_naming_the_variable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port} .*JOBWHEEL_METRICS_PORT"):
            MetricsServer("127.0.0.1", port, "test", registry=CollectorRegistry())


def test_histogram_buckets_are_cumulative_and_scaled():
    h = Histogram((10, 100, 1000))
    for value in (5, 10, 11, 500, 5000, 7000):
        h.observe(value)
    buckets, total = h.buckets(scale=0.001)
    assert buckets == [("0.01", 2), ("0.1", 3), ("1.0", 4), ("+Inf", 6)]
    assert total == pytest.approx(12.526)
    family = histogram("jobwheel_test_seconds", "t", {("a",): h}, ("task",), scale=0.001)
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert samples[("jobwheel_test_seconds_count", None)] == 6
    assert samples[("jobwheel_test_seconds_bucket", "+Inf")] == 6


def test_label_limiter_folds_values_past_its_limit_into_other():
    limit = LabelLimiter(limit=2)
    assert [limit(v) for v in ("a", "b", "c", "a", "d", "b")] == ["a", "b", OTHER, "a", OTHER, "b"]


def test_the_kafka_check_fails_naming_the_address_when_nothing_listens():
    from jobwheel.metrics import BrokerProbe

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        probe = BrokerProbe(address, every_s=0.0)
        ok, detail = probe()
        assert ok and address in detail
    ok, detail = probe()  # the listener is gone
    assert not ok
    assert detail.startswith(f"cannot reach Kafka at {address} (") and "refused" in detail


def test_a_process_is_not_ready_before_its_component_runs() -> None:
    """The server starts before the scheduler, worker or sink it serves: until that component
    has installed its collector (and its readiness checks) the process is not ready. It was:
    a worker answered 200 on /health/ready with no worker metrics and no group check yet."""
    registry, health = CollectorRegistry(), Health()
    server = MetricsServer("127.0.0.1", 0, "test", registry=registry, health=health)
    try:
        code, body, _ = _get(server.url + "/health/ready")
        assert code == 503
        assert json.loads(body)["checks"] == [
            {
                "check": "service",
                "ok": False,
                "detail": "starting: the service's component is not running yet",
            }
        ]
        assert _get(server.url + "/health/live")[0] == 200  # starting is not dead
        uninstall = _Counting().install(registry, health)
        assert _get(server.url + "/health/ready")[0] == 200
        uninstall()
        uninstall()  # a second call changes nothing
        assert _get(server.url + "/health/ready")[0] == 503
    finally:
        server.close()
