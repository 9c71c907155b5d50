"""The "jobwheel: services" Grafana dashboard is the one deploy/grafana.py generates, names only
metrics the services export, and the runbook explains each of its panels."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import REGISTRY

from jobwheel.consumers.status.metrics import SinkCollector
from jobwheel.consumers.status.pools import PoolCollector, signals
from jobwheel.consumers.status.sink import StatusSink
from jobwheel.consumers.worker.metrics import WorkerCollector
from jobwheel.consumers.worker.pool import WorkerPool
from jobwheel.deploy import grafana
from jobwheel.settings import Settings
from jobwheel.streams.engine import SchedulerEngine
from jobwheel.streams.metrics import SchedulerCollector

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "deploy" / "compose" / "grafana" / "dashboards" / "jobwheel-metrics.json"
RUNBOOK = REPO / "docs" / "operations.md"
#: Series Prometheus itself adds (``up``) or prometheus_client's process collector exports.
BUILTIN = {"up", "process_cpu_seconds_total", "process_resident_memory_bytes"}


class _OnePool:
    """A reader of one idle pool: the gauges' names without a broker."""

    def pools(self) -> list:
        return [signals("default", "g", "t", {}, [], 0)]


def exported(tmp_path: Path) -> set[str]:
    """The families the three components' collectors export (names without _total)."""
    settings = Settings(_env_file=None, topic_prefix="p", data_dir=tmp_path)  # type: ignore[call-arg]
    pool = WorkerPool(settings)
    try:
        collectors = [
            SchedulerCollector(SchedulerEngine(settings)),
            WorkerCollector(pool),
            SinkCollector(StatusSink(settings, store=None)),  # type: ignore[arg-type]
            PoolCollector(_OnePool()),  # type: ignore[arg-type]
        ]
        return {family.name for c in collectors for family in c.collect()}
    finally:
        pool._task_threads.shutdown()
        pool._kafka_thread.shutdown()


def test_the_committed_dashboard_is_the_generated_one():
    assert json.loads(COMMITTED.read_text()) == grafana.dashboard(), (
        "regenerate: python -m jobwheel.deploy.grafana > "
        "deploy/compose/grafana/dashboards/jobwheel-metrics.json"
    )


def test_every_metric_a_panel_queries_is_exported(tmp_path: Path):
    families = exported(tmp_path)
    builtin = {s.name for f in REGISTRY.collect() for s in f.samples} | {"up"}
    assert BUILTIN <= builtin
    named = set()
    for panel in grafana.panels():
        for expr, _legend in panel.targets:
            named |= set(re.findall(r"\b(?:jobwheel|process)_[a-z_]+|\bup\b", expr))
    assert named, "no metric found in the panels' PromQL"
    unknown = set()
    for name in named - BUILTIN:
        family = re.sub(r"_(total|bucket|count|sum)$", "", name)
        if family not in families:
            unknown.add(name)
    assert not unknown, f"panels query metrics nobody exports: {sorted(unknown)}"
    # and the other way round: every jobwheel metric is on the dashboard, or said why not
    not_shown = {"jobwheel_sink_records", "jobwheel_sink_batches", "jobwheel_sink_commit_failures",
                 "jobwheel_sink_last_insert_timestamp_seconds", "jobwheel_sink_partitions",
                 "jobwheel_scheduler_rejected",
                 "jobwheel_scheduler_job_events",
                 "jobwheel_scheduler_last_commit_timestamp_seconds",
                 "jobwheel_scheduler_partition_phase", "jobwheel_scheduler_restored_records",
                 "jobwheel_worker_handed_back", "jobwheel_worker_partitions",
                 "jobwheel_queue_unfinished_runs", "jobwheel_queue_concurrency"}  # fmt: skip
    shown = {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in named}
    assert families - shown == not_shown


def test_the_runbook_explains_every_panel():
    text = RUNBOOK.read_text()
    missing = [p.title for p in grafana.panels() if f"**{p.title}**" not in text]
    assert not missing, f"docs/operations.md does not explain: {missing}"
