"""The status sink's metrics and health checks (served by :mod:`jobwheel.metrics`).

The sink counts in :class:`~jobwheel.consumers.status.sink.SinkStats` (what ``/health`` of the API
shows too) and observes each insert here (:class:`SinkMeters`, on the inserter thread, once
per batch); :class:`SinkCollector` reads them when Prometheus scrapes. Names (all
``jobwheel_sink_*``):

================================= ========= =====================================================
name                              type      what
================================= ========= =====================================================
records_total                     counter   records read from the status and acks topics
rows_total                        counter   rows inserted into ClickHouse
undecodable_total                 counter   records skipped (not a status event, or not fitting)
seq_refused_total                 counter   events refused: a ``seq`` no scheduler writes (forged?)
batches_total                     counter   batches inserted
insert_failures_total             counter   failed inserts (retried; offsets held back)
commit_failures_total             counter   offset commits refused (the records are read again)
batch_rows                        histogram rows per inserted batch
insert_seconds                    histogram one insert, rows handed to ClickHouse to done
last_insert_timestamp_seconds     gauge     wall clock of the last insert
partitions                        gauge     partitions assigned (status and acks count apart)
lag_records{topic,partition}      gauge     records not fetched yet (sampled twice a second)
================================= ========= =====================================================

Readiness is false until the sink has joined its group and while its inserts fail (the API
then serves data that is getting older); liveness is false when the sink has stopped on its
own (its thread died: the process should be restarted).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jobwheel.metrics import Check, Collector, Histogram, counter, gauge, histogram

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from jobwheel.consumers.status.sink import StatusSink

PREFIX = "jobwheel_sink_"
BATCH_ROWS = (1, 10, 100, 500, 1000, 2500, 5000, 10_000, 20_000, 50_000)
INSERT_MS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000)
MS = 0.001


@dataclass
class SinkMeters:
    """Observed by the inserter thread, once per batch (one writer)."""

    batch_rows: Histogram = field(default_factory=lambda: Histogram(BATCH_ROWS))
    insert: Histogram = field(default_factory=lambda: Histogram(INSERT_MS))
    #: ``(topic, partition) -> records not fetched``, sampled by the consumer thread.
    lag: dict[tuple[str, int], int] = field(default_factory=dict)
    failing_since: float | None = None  # monotonic: the first failure of the current streak

    def inserted(self, rows: int, took_s: float) -> None:
        self.batch_rows.observe(rows)
        self.insert.observe(took_s * 1000)
        self.failing_since = None

    def failed(self) -> None:
        if self.failing_since is None:
            self.failing_since = time.monotonic()


class SinkCollector(Collector):
    """Reads a running :class:`~jobwheel.consumers.status.sink.StatusSink` at scrape time."""

    def __init__(self, sink: StatusSink) -> None:
        self.sink = sink

    def checks(self) -> dict[str, tuple[Check | None, Check | None]]:
        return {
            "sink thread": (self._live, None),
            "sink kafka call": (self.sink.watchdog.check_live, None),
            "sink": (None, self._ready),
        }

    def _live(self) -> tuple[bool, str]:
        stats = self.sink.stats
        if not stats.running and not self.sink.stopping and stats.last_error:
            return False, f"the status sink stopped: {stats.last_error}"
        return True, "the status sink runs" if stats.running else "the status sink is starting"

    def _ready(self) -> tuple[bool, str]:
        stats, meters = self.sink.stats, self.sink.meters
        if not stats.running:
            return False, "the status sink is not running"
        if meters.failing_since is not None:
            failing = time.monotonic() - meters.failing_since
            return False, (
                f"inserts into ClickHouse have failed for {failing:.0f} s "
                f"({stats.insert_failures} failures): {stats.last_error}"
            )
        if not self.sink.joined:
            return False, f"not in the group {self.sink.settings.status_group} yet"
        return True, f"partitions {stats.assigned} assigned, {stats.inserted} rows inserted"

    def collect(self) -> Iterator[Metric]:
        stats, meters, n = self.sink.stats, self.sink.meters, PREFIX
        yield counter(n + "records_total", "Records read.", stats.consumed)
        yield counter(n + "rows_total", "Rows inserted into ClickHouse.", stats.inserted)
        yield counter(n + "undecodable_total", "Records skipped.", stats.undecodable)
        yield counter(
            n + "seq_refused_total",
            "Events refused for a seq no scheduler writes (forged or corrupt).",
            stats.seq_refused,
        )
        yield counter(n + "batches_total", "Batches inserted.", stats.batches)
        yield counter(
            n + "insert_failures_total", "Failed inserts (retried).", stats.insert_failures
        )
        yield counter(n + "commit_failures_total", "Offset commits refused.", stats.commit_failures)
        yield histogram(n + "batch_rows", "Rows per inserted batch.", meters.batch_rows)
        yield histogram(
            n + "insert_seconds", "One insert into ClickHouse.", meters.insert, scale=MS
        )
        yield gauge(
            n + "last_insert_timestamp_seconds",
            "Wall clock of the last insert.",
            (stats.last_insert_ms or 0) / 1000,
        )
        lag = dict(meters.lag)
        yield gauge(n + "partitions", "Partitions assigned (status and acks).", len(lag))
        yield gauge(
            n + "lag_records",
            "Records not fetched yet, per topic and partition.",
            {(topic, str(p)): v for (topic, p), v in lag.items()},
            ("topic", "partition"),
        )
