"""Metrics and health over HTTP: one small server in every long-running process.

With ``JOBWHEEL_METRICS_PORT`` set, ``jobwheel scheduler``, ``worker``, ``serve`` and ``sink``
answer on ``JOBWHEEL_METRICS_HOST:JOBWHEEL_METRICS_PORT``:

- ``GET /metrics``: Prometheus' text format (OpenMetrics when the scraper asks for it);
- ``GET /health/live``: 200 while the process's loops turn, else 503 (restart it);
- ``GET /health/ready``: 200 while the process does its job, else 503 (look at it): the
  liveness checks plus each component's own (a scheduler restoring or with a partition that
  has stopped committing, Kafka unreachable, a sink whose inserts fail).

Both health answers are JSON naming every check and what is wrong
(``{"ok": false, "checks": [{"check": "partitions", "ok": false, "detail": "partition 3:
..."}]}``), so ``jobwheel health``, a Kubernetes probe or a person with curl read the same
thing. Unset, nothing is bound: a library user or a test that builds an engine or a pool opens
no port.

Metric definitions live with the component they describe (``streams/metrics.py``,
``consumers/worker/metrics.py``, ``consumers/status/metrics.py``): collectors that read, at
scrape time, counters the component keeps anyway. This module only has the plumbing: the
server, the health registry, and two primitives cheap enough for a hot path
(:class:`Histogram`, :class:`LabelLimiter`). Why not prometheus_client's own ``Histogram``
and labelled ``Counter`` on the hot path: each ``observe``/``inc`` takes a lock and a
``labels()`` lookup, about a microsecond, several times per job; the scheduler's whole budget
is about 170 microseconds per job.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder

from jobwheel.errors import ConfigError

if TYPE_CHECKING:
    from jobwheel.settings import Settings

log = logging.getLogger(__name__)

#: A health check: ``(ok, detail)``; the detail says what is wrong (or what is fine).
Check = Callable[[], tuple[bool, str]]
#: Label value standing for every value past a :class:`LabelLimiter`'s limit.
OTHER = "other"


# --- health ---------------------------------------------------------------------------------


class Health:
    """The process's health checks, by name. Components add theirs when they start and remove
    them when they stop; the HTTP server asks them on every probe (from its own thread, so a
    check reads plain attributes and never waits on the component's loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[str, Check] = {}
        self._ready: dict[str, Check] = {}
        self._components = 0

    def component(self) -> Callable[[], None]:
        """Note a running component (its collector installed); returns the function that
        notes it stopped. Until one runs the process is not ready, whatever else passes:
        the server is up before the component it serves (and its checks) exists."""
        with self._lock:
            self._components += 1
        done = threading.Event()

        def stopped() -> None:
            if not done.is_set():
                done.set()
                with self._lock:
                    self._components -= 1

        return stopped

    def add(
        self, name: str, *, live: Check | None = None, ready: Check | None = None
    ) -> Callable[[], None]:
        """Register checks under ``name``; returns the function that removes them again."""
        with self._lock:
            if live is not None:
                self._live[name] = live
            if ready is not None:
                self._ready[name] = ready

        def remove() -> None:
            with self._lock:
                if live is not None and self._live.get(name) is live:
                    del self._live[name]
                if ready is not None and self._ready.get(name) is ready:
                    del self._ready[name]

        return remove

    def report(self, kind: str) -> dict[str, Any]:
        """``{"ok": ..., "checks": [...]}`` for ``"live"`` or ``"ready"`` (which includes the
        liveness checks: a hung process is not ready either)."""
        with self._lock:
            checks = list(self._live.items())
            if kind == "ready":
                checks += list(self._ready.items())
            starting = kind == "ready" and self._components == 0
        results = []
        if starting:
            detail = "starting: the service's component is not running yet"
            results.append({"check": "service", "ok": False, "detail": detail})
        for name, check in checks:
            try:
                ok, detail = check()
            except Exception as exc:  # a broken check says so; it never takes the server down
                ok, detail = False, f"the check failed: {type(exc).__name__}: {exc}"
            results.append({"check": name, "ok": bool(ok), "detail": detail})
        return {"ok": all(r["ok"] for r in results), "checks": results}


#: The process-wide health registry the metrics server answers from.
HEALTH = Health()


def loop_check(what: str, turned_at: Callable[[], float], live_after_s: float) -> Check:
    """Liveness of a loop that stamps ``time.monotonic()`` each time it turns."""

    def check() -> tuple[bool, str]:
        silent = time.monotonic() - turned_at()
        if silent > live_after_s:
            return False, (
                f"the {what} has not turned for {silent:.0f} s (more than "
                f"JOBWHEEL_HEALTH_LIVE_AFTER_MS={live_after_s * 1000:.0f}): it is hung"
            )
        return True, f"the {what} turned {silent:.1f} s ago"

    return check


class BrokerProbe:
    """Is Kafka reachable from here: a TCP connection to a bootstrap server, at most every
    ``every_s`` (a probe asked once a second must not open a connection each time)."""

    def __init__(self, bootstrap: str, every_s: float = 5.0, timeout_s: float = 1.0) -> None:
        self.bootstrap = bootstrap
        self.every_s = every_s
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._at = float("-inf")
        self._why: str | None = None

    def __call__(self) -> tuple[bool, str]:
        from jobwheel.reach import unreachable

        with self._lock:
            if time.monotonic() - self._at >= self.every_s:
                self._why = unreachable(self.bootstrap, self.timeout_s)
                self._at = time.monotonic()
            why = self._why
        if why is not None:
            return False, f"cannot reach Kafka at {self.bootstrap} ({why})"
        return True, f"Kafka at {self.bootstrap} accepts connections"


# --- cheap primitives for hot paths ---------------------------------------------------------


class Histogram:
    """A histogram written by ONE thread without a lock: ``observe`` is a bisect and two
    additions. Readers (the scrape) copy the counts, so what they expose is consistent
    (every bucket's count adds up to the total) even while the writer goes on."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(sorted(bounds))
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def buckets(self, scale: float = 1.0) -> tuple[list[tuple[str, float]], float]:
        """Cumulative ``(le, count)`` pairs ending with ``+Inf``, and the sum; bounds and sum
        multiplied by ``scale`` (kept in milliseconds, exposed in seconds)."""
        counts = list(self.counts)
        total = 0
        out: list[tuple[str, float]] = []
        for bound, n in zip(self.bounds, counts, strict=False):
            total += n
            out.append((_float(bound * scale), total))
        out.append(("+Inf", total + counts[-1]))
        return out, self.sum * scale


def _float(value: float) -> str:
    return repr(float(value))


class LabelLimiter:
    """Keeps a label's values to ``limit`` distinct ones (first come), the rest become
    :data:`OTHER`: task names come from whoever submits jobs, and a series per name would let
    a careless or hostile client grow a process's memory (and Prometheus') without bound."""

    __slots__ = ("limit", "_seen")

    def __init__(self, limit: int = 200) -> None:
        self.limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) >= self.limit:
            return OTHER
        self._seen.add(value)
        return value


F = TypeVar("F", CounterMetricFamily, GaugeMetricFamily)


def counter(
    name: str, doc: str, values: dict[tuple[str, ...], float] | float, labels: Sequence[str] = ()
) -> CounterMetricFamily:
    """A counter family from a number, or from ``{label values: number}``."""
    return _filled(CounterMetricFamily(name, doc, labels=list(labels) if labels else None), values)


def gauge(
    name: str, doc: str, values: dict[tuple[str, ...], float] | float, labels: Sequence[str] = ()
) -> GaugeMetricFamily:
    """A gauge family from a number, or from ``{label values: number}``."""
    return _filled(GaugeMetricFamily(name, doc, labels=list(labels) if labels else None), values)


def _filled(family: F, values: dict[tuple[str, ...], float] | float) -> F:
    if isinstance(values, dict):
        for key, value in list(values.items()):
            family.add_metric(list(key), value)
    else:
        family.add_metric([], values)
    return family


def histogram(
    name: str,
    doc: str,
    histograms: dict[tuple[str, ...], Histogram] | Histogram,
    labels: Sequence[str] = (),
    scale: float = 1.0,
) -> HistogramMetricFamily:
    """A histogram family from one :class:`Histogram` or ``{label values: Histogram}``."""
    family = HistogramMetricFamily(name, doc, labels=list(labels) if labels else None)
    items = histograms.items() if isinstance(histograms, dict) else [((), histograms)]
    for key, h in list(items):
        buckets, total = h.buckets(scale)
        family.add_metric(list(key), buckets, total)
    return family


class Collector:
    """Base of the components' collectors: ``collect()`` builds the families at scrape time;
    ``install()`` registers it (and its health checks) for as long as the component runs."""

    def collect(self) -> Iterable[Metric]:  # pragma: no cover - overridden
        return ()

    def describe(self) -> list[Metric]:
        return []  # nothing collected at registration (the component may not run yet)

    def checks(self) -> dict[str, tuple[Check | None, Check | None]]:
        """``{name: (live, ready)}`` health checks of the component."""
        return {}

    def install(
        self, registry: CollectorRegistry = REGISTRY, health: Health = HEALTH
    ) -> Callable[[], None]:
        registry.register(self)
        removers = [health.add(n, live=lv, ready=rd) for n, (lv, rd) in self.checks().items()]
        removers.append(health.component())

        def uninstall() -> None:
            for remove in removers:
                remove()
            try:
                registry.unregister(self)
            except KeyError:
                pass

        return uninstall


# --- the server -----------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            try:
                body = encoder(self.server.registry)
            except Exception as exc:  # a collector's bug: named, never a dropped connection
                self._scrape_failed(exc)
                return
            self._send(200, content_type, body)
        elif path in ("/health/live", "/health/ready"):
            report = self.server.health.report(path.rsplit("/", 1)[1])
            report["service"] = self.server.service
            body = json.dumps(report).encode()
            self._send(200 if report["ok"] else 503, "application/json", body)
        elif path == "/":
            body = (
                f"jobwheel {self.server.service}: /metrics, /health/live, /health/ready\n"
            ).encode()
            self._send(200, "text/plain; charset=utf-8", body)
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found: try /metrics\n")

    def _scrape_failed(self, exc: Exception) -> None:
        """A collector raised: answer 500 with the error (a scraper records a failed scrape and
        what failed) and log it with its traceback. Left to http.server, the connection was
        closed without an answer and the traceback went to stderr outside the JSON log."""
        what = f"{type(exc).__name__}: {exc}"
        log.error(
            "metrics scrape failed",
            exc_info=exc,
            extra={"error": what, "service": self.server.service},
        )
        body = (
            f"collecting the metrics failed: {what}. The service goes on; this is a bug in "
            "jobwheel's metrics, report it with the service's log.\n"
        ).encode()
        self._send(500, "text/plain; charset=utf-8", body)

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """http.server writes every request to stderr; a service's stderr is its JSON log."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    registry: CollectorRegistry
    health: Health
    service: str

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A request that failed outside the handler's own answers: socketserver prints the
        traceback to stderr, a service's JSON log. A scraper that hung up (its timeout) is
        routine and logged at debug; anything else is an error with its traceback."""
        exc = sys.exc_info()[1]
        client = ":".join(str(part) for part in client_address[:2])
        if isinstance(exc, (ConnectionError, TimeoutError)):
            log.debug("metrics client went away", extra={"client": client, "error": repr(exc)})
            return
        log.error(
            "metrics request failed",
            exc_info=True,
            extra={"client": client, "service": self.service},
        )


class MetricsServer:
    """``/metrics`` and ``/health/*`` on ``host:port`` from a daemon thread."""

    def __init__(
        self,
        host: str,
        port: int,
        service: str,
        *,
        registry: CollectorRegistry = REGISTRY,
        health: Health = HEALTH,
    ) -> None:
        try:
            self._server = _Server((host, port), _Handler)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {host}:{port} ({exc.strerror or exc}): set "
                "JOBWHEEL_METRICS_PORT to a free port (or unset it: no metrics server)"
            ) from exc
        self._server.registry = registry
        self._server.health = health
        self._server.service = service
        self.host, self.port = self._server.server_address[:2]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="jobwheel-metrics", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{_url_host(str(self.host))}:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def start(settings: Settings, service: str) -> MetricsServer | None:
    """Serve metrics and health for ``service`` when ``JOBWHEEL_METRICS_PORT`` is set (else
    None: nothing is bound), with the process-wide checks every service has: Kafka reachable.
    Raises :class:`ConfigError` (one line) when the port cannot be bound."""
    if settings.metrics_port is None:
        return None
    server = MetricsServer(settings.metrics_host, settings.metrics_port, service)
    HEALTH.add("kafka", ready=BrokerProbe(settings.bootstrap_servers))
    log.info(
        "metrics and health served",
        extra={
            "url": server.url,
            "paths": ["/metrics", "/health/live", "/health/ready"],
            "service": service,
        },
    )
    return server
