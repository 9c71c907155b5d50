"""The Grafana dashboard of the services' Prometheus metrics (``jobwheel: services``), beside
the ClickHouse one of ``consumers/status/queries.py``.

Built from :data:`PANELS`, so the PromQL lives in one place and a test can check that every
metric it names is one the services export (tests/unit/test_metrics_dashboard.py).
``docs/operations.md`` ("Reading the dashboards") says what each panel is for. Regenerate the
provisioned file after a change::

    python -m jobwheel.deploy.grafana > deploy/compose/grafana/dashboards/jobwheel-metrics.json

The metrics come from the Prometheus of ``deploy/compose`` (``prometheus/prometheus.yml``
scrapes every scheduler, worker, sink and api container; the ``job`` label is the service).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "jobwheel-prometheus"}


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    #: ``(PromQL, legend)`` per series
    targets: tuple[tuple[str, str], ...]
    unit: str = ""
    kind: str = "timeseries"
    width: int = 8


def _q(quantile: float, metric: str, by: str = "le", window: str = "1m") -> str:
    return f"histogram_quantile({quantile}, sum by ({by}) (rate({metric}_bucket[{window}])))"


#: Rows of panels, in order: ``(row title, panels)``.
ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    (
        "Scheduler",
        (
            Panel(
                "Fire lateness",
                "Commit of a run's first attempt minus its scheduled time, i.e. when workers "
                "can see it. The target is p99 under 100 ms and never more than 2 s.",
                (
                    (_q(0.5, "jobwheel_scheduler_fire_lateness_seconds"), "p50"),
                    (_q(0.95, "jobwheel_scheduler_fire_lateness_seconds"), "p95"),
                    (_q(0.99, "jobwheel_scheduler_fire_lateness_seconds"), "p99"),
                ),
                unit="s",
            ),
            Panel(
                "Fires, retries and commands per second",
                "Runs dispatched (first attempts), re-dispatched (attempt > 1) and commands "
                "applied, over all schedulers.",
                (
                    ("sum(rate(jobwheel_scheduler_fires_total[1m]))", "fires"),
                    ("sum(rate(jobwheel_scheduler_retries_total[1m]))", "retries"),
                    ("sum(rate(jobwheel_scheduler_commands_total[1m]))", "commands"),
                    ("sum(rate(jobwheel_scheduler_acks_total[1m]))", "acks"),
                ),
                unit="ops",
            ),
            Panel(
                "Run events by task and state",
                "What the schedulers decided about runs, per second: DISPATCHED, RETRYING, "
                "DEAD, MISSED, SKIPPED, CANCELLED, by task.",
                (
                    (
                        "sum by (task, state) (rate(jobwheel_scheduler_runs_total[1m]))",
                        "{{task}} {{state}}",
                    ),
                ),
                unit="ops",
            ),
            Panel(
                "Dead letters by kind",
                "Records sent to the dead-letter topic in 5 minutes, by kind (as `jobwheel dlq "
                "list --kind`): dead-run (attempts used up), request (refused), ack "
                "(undecodable), too-large, undecodable-run (a runs record a worker could not "
                "decode); commands replayed from it (`jobwheel dlq replay`); "
                "and changes the scheduler refused or undid, each with its event: "
                "record-too-large (a job record past JOBWHEEL_SCHEDULER_MAX_RECORD_BYTES), "
                "timer-failed (a job paused or its run ended DEAD by a timer that failed).",
                (
                    (
                        "sum by (kind) (increase(jobwheel_scheduler_dead_letters_total[5m]))",
                        "{{kind}}",
                    ),
                    (
                        "sum(increase(jobwheel_worker_undecodable_runs_total[5m]))",
                        "undecodable-run",
                    ),
                    ("sum(increase(jobwheel_scheduler_replays_total[5m]))", "replayed"),
                    (
                        "sum by (reason) (increase(jobwheel_scheduler_refused_changes_total[5m]))",
                        "refused {{reason}}",
                    ),
                ),
                kind="bars",
            ),
            Panel(
                "Input lag by partition",
                "Commands and acks not yet read by the partition's owner. A partition whose "
                "lag grows while the others stay flat has stopped: see its owner's readiness.",
                (
                    (
                        "max by (topic, partition) (jobwheel_scheduler_lag_records)",
                        "{{topic}} p{{partition}}",
                    ),
                ),
            ),
            Panel(
                "Partitions by scheduler and phase",
                "Partitions each scheduler owns (ready, restoring) and keeps warm (standby).",
                (
                    (
                        "sum by (instance, phase) (jobwheel_scheduler_partitions)",
                        "{{instance}} {{phase}}",
                    ),
                ),
            ),
            Panel(
                "Stuck partitions and commit age",
                "Partitions with work waiting and no commit for JOBWHEEL_HEALTH_STUCK_AFTER_MS "
                "(their scheduler is not ready), and the oldest commit per partition.",
                (
                    ("sum(jobwheel_scheduler_stuck_partitions)", "stuck"),
                    (
                        "max by (partition) (jobwheel_scheduler_partition_commit_age_seconds)",
                        "age p{{partition}}",
                    ),
                ),
                unit="s",
            ),
            Panel(
                "Transaction commit latency",
                "One transaction, begin to committed (runs, events, changelog and offsets).",
                (
                    (_q(0.5, "jobwheel_scheduler_commit_seconds"), "p50"),
                    (_q(0.99, "jobwheel_scheduler_commit_seconds"), "p99"),
                ),
                unit="s",
            ),
            Panel(
                "Where a transaction's time goes",
                "Mean seconds per committed transaction in each phase: open (its work "
                "waiting for the commit: JOBWHEEL_SCHEDULER_COMMIT_INTERVAL_MS), produce, "
                "offsets, end (the commit call: the broker's round trips), state (the local "
                "state written after it). A run is visible to workers after end: open plus "
                "the commit is how long a due run waits in the scheduler.",
                (
                    (
                        "sum by (phase) (rate(jobwheel_scheduler_transaction_phase_seconds_total"
                        "[1m])) / scalar(sum(rate(jobwheel_scheduler_transactions_total[1m])))",
                        "{{phase}}",
                    ),
                ),
                unit="s",
            ),
            Panel(
                "Aborts and resets",
                "Aborted transactions (the batch is processed again) and resets (fenced or "
                "fatal: all partitions dropped and restored), per 5 minutes; and workers' runs "
                "consumers replaced after staying out of their group (a client that stopped "
                "joining it).",
                (
                    ("sum(increase(jobwheel_scheduler_transaction_aborts_total[5m]))", "aborts"),
                    ("sum(increase(jobwheel_scheduler_resets_total[5m]))", "resets"),
                    (
                        "sum(increase(jobwheel_worker_consumers_replaced_total[5m]))",
                        "worker consumers replaced",
                    ),
                ),
                kind="bars",
            ),
            Panel(
                "Clock skew",
                "Each scheduler's clock minus the broker's as it reads it, and commands whose "
                "issue time was held to the broker's (a client clock off by more than "
                "JOBWHEEL_SCHEDULER_CLOCK_TOLERANCE_MS), per 5 minutes.",
                (
                    ("max by (instance) (jobwheel_scheduler_clock_skew_seconds)", "{{instance}}"),
                    (
                        "sum(increase(jobwheel_scheduler_issue_times_clamped_total[5m]))",
                        "issue times clamped",
                    ),
                ),
            ),
            Panel(
                "Restores",
                "Changelog records left to restore, and how long restores took (p95).",
                (
                    ("sum(jobwheel_scheduler_restore_remaining_records)", "records left"),
                    (_q(0.95, "jobwheel_scheduler_restore_seconds", window="15m"), "p95 s"),
                ),
            ),
        ),
    ),
    (
        "Workers",
        (
            Panel(
                "Run verdicts by task and state",
                "SUCCEEDED, FAILED and STALE per second, by task, over all workers; and runs "
                "not run again because the partition's previous owner had finished them.",
                (
                    (
                        "sum by (task, state) (rate(jobwheel_worker_runs_total[1m]))",
                        "{{task}} {{state}}",
                    ),
                    ("sum(rate(jobwheel_worker_skipped_done_total[1m]))", "already done"),
                ),
                unit="ops",
            ),
            Panel(
                "Run duration by task (p95)",
                "How long runs execute, by task.",
                (
                    (
                        _q(0.95, "jobwheel_worker_run_duration_seconds", by="task, le"),
                        "{{task}}",
                    ),
                ),
                unit="s",
            ),
            Panel(
                "Runs in flight",
                "Executing, waiting for a slot, and the slots there are, over all workers. "
                "In flight at the slot count with runs waiting: add workers.",
                (
                    ("sum(jobwheel_worker_inflight_runs)", "executing"),
                    ("sum(jobwheel_worker_waiting_runs)", "waiting"),
                    ("sum(jobwheel_worker_concurrency)", "slots"),
                ),
            ),
            Panel(
                "Runs not fetched by queue and partition",
                "Runs records no worker of the queue has fetched yet.",
                (
                    (
                        "max by (queue, partition) (jobwheel_worker_lag_records)",
                        "{{queue}} p{{partition}}",
                    ),
                ),
            ),
        ),
    ),
    (
        "Pools (queues)",
        (
            Panel(
                "Pool backlog by queue",
                "Runs each pool has not finished, split into waiting for a slot and "
                "executing (the status service's reading of the pool's group lag and its "
                "workers' announcements). Waiting that grows: add workers to that pool.",
                (
                    ("max by (queue) (jobwheel_queue_waiting_runs)", "{{queue}} waiting"),
                    ("max by (queue) (jobwheel_queue_inflight_runs)", "{{queue}} running"),
                ),
            ),
            Panel(
                "Oldest unfinished run by queue",
                "How long the oldest run a pool has not finished has waited since dispatch: "
                "how far behind the pool is, whatever its tasks' length.",
                (
                    (
                        "max by (queue) (jobwheel_queue_oldest_unfinished_age_seconds)",
                        "{{queue}}",
                    ),
                ),
                unit="s",
            ),
            Panel(
                "Pool throughput and workers",
                "Runs finished per second and live workers, by pool (from the workers' "
                "announcements).",
                (
                    (
                        "max by (queue) (jobwheel_queue_finished_runs_per_second)",
                        "{{queue}} finished/s",
                    ),
                    ("max by (queue) (jobwheel_queue_workers)", "{{queue}} workers"),
                ),
            ),
        ),
    ),
    (
        "Status sink",
        (
            Panel(
                "Rows inserted per second",
                "Status rows written into ClickHouse, records skipped as undecodable, and events "
                "refused for a seq no scheduler writes.",
                (
                    ("sum(rate(jobwheel_sink_rows_total[1m]))", "rows"),
                    ("sum(rate(jobwheel_sink_undecodable_total[1m]))", "undecodable"),
                    ("sum(rate(jobwheel_sink_seq_refused_total[1m]))", "seq refused"),
                ),
                unit="ops",
            ),
            Panel(
                "Insert latency and batch size",
                "p99 of one insert, and the median batch.",
                (
                    (_q(0.99, "jobwheel_sink_insert_seconds"), "insert p99 (s)"),
                    (_q(0.5, "jobwheel_sink_batch_rows"), "batch rows p50"),
                ),
            ),
            Panel(
                "Sink lag and failures",
                "Records not fetched yet, and failed inserts (retried) per 5 minutes: the "
                "API's data is older by about as much.",
                (
                    ("sum(jobwheel_sink_lag_records)", "lag"),
                    ("sum(increase(jobwheel_sink_insert_failures_total[5m]))", "failed inserts"),
                ),
            ),
        ),
    ),
    (
        "Processes",
        (
            Panel(
                "Up",
                "1 per process Prometheus can scrape, by service.",
                (("sum by (job) (up)", "{{job}}"),),
            ),
            Panel(
                "CPU",
                "CPU seconds per second, by process.",
                (("rate(process_cpu_seconds_total[1m])", "{{job}} {{instance}}"),),
            ),
            Panel(
                "Memory",
                "Resident memory, by process.",
                (("process_resident_memory_bytes", "{{job}} {{instance}}"),),
                unit="bytes",
            ),
        ),
    ),
)


def panels() -> list[Panel]:
    return [p for _, row in ROWS for p in row]


def dashboard() -> dict[str, Any]:
    """The provisioned dashboard (deploy/compose/grafana/dashboards/jobwheel-metrics.json)."""
    out: list[dict[str, Any]] = []
    y = 0
    number = 0
    for row_title, row in ROWS:
        number += 1
        out.append(
            {
                "id": number,
                "type": "row",
                "title": row_title,
                "collapsed": False,
                "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
                "panels": [],
            }
        )
        y += 1
        x = 0
        for panel in row:
            if x + panel.width > 24:
                x, y = 0, y + 8
            number += 1
            bars = panel.kind == "bars"
            out.append(
                {
                    "id": number,
                    "type": "timeseries",
                    "title": panel.title,
                    "description": panel.description,
                    "datasource": DATASOURCE,
                    "gridPos": {"x": x, "y": y, "w": panel.width, "h": 8},
                    "targets": [
                        {
                            "refId": chr(ord("A") + i),
                            "datasource": DATASOURCE,
                            "expr": expr,
                            "legendFormat": legend,
                        }
                        for i, (expr, legend) in enumerate(panel.targets)
                    ],
                    "fieldConfig": {
                        "defaults": {
                            "unit": panel.unit,
                            "custom": {"drawStyle": "bars" if bars else "line"},
                        }
                    },
                    "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                }
            )
            x += panel.width
        y += 8
    return {
        "uid": "jobwheel-services",
        "title": "jobwheel: services",
        "description": "Prometheus metrics of the schedulers, workers and status sink; what "
        "each panel is for: docs/operations.md, 'Reading the dashboards'.",
        "tags": ["jobwheel"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "panels": out,
    }


if __name__ == "__main__":
    json.dump(dashboard(), sys.stdout, indent=2)
    sys.stdout.write("\n")
