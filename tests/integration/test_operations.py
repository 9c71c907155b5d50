"""Operating the pipeline: each service's /metrics and /health/* over HTTP, under a real
workload on a real broker, and `jobwheel health` naming what is wrong. Real processes, real
HTTP; what is asserted is what Prometheus, a Kubernetes probe or an operator would see."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobwheel.deploy.broker import free_port
from jobwheel.producers.client import JobClient, JobSpec
from jobwheel.schemas.partitioning import partition_for
from tests.integration.scheduler_support import log_events, start_scheduler, wait_owns_all
from tests.support import DEMO_TASKS, Procs, scaled, start_worker, stop, wait_until


class Samples(dict[tuple[str, tuple[tuple[str, str], ...]], float]):
    """Every sample of one scrape by (name, labels), and the metric families it declared (a
    labelled counter is declared before its first increment, with no sample yet)."""

    families: frozenset[str] = frozenset()


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def scrape(base: str) -> Samples:
    """Every sample of a process's /metrics, by name and labels."""
    code, body = _get(base + "/metrics")
    assert code == 200, body
    families = list(text_string_to_metric_families(body.decode()))
    samples = Samples(
        {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in families
            for s in family.samples
        }
    )
    samples.families = frozenset(f.name for f in families)
    return samples


def _key(name: str, labels: dict[str, str]) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted(labels.items()))


def _declared(samples: Samples, name: str) -> bool:
    return any(name == f or name.startswith(f + "_") for f in samples.families)


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample ``name{labels}``; a missing one fails, naming what is there instead (a
    renamed metric, or one never created, must not read as 0 and pass an ``== 0``)."""
    key = _key(name, labels)
    if key not in samples:
        there = sorted(f"{n}{dict(lb)}" for n, lb in samples if n.startswith(name))
        prefix = "_".join(name.split("_")[:2])
        raise AssertionError(
            f"metric {name}{labels} is not exposed (samples of that name: {there or 'none'}; "
            f"{prefix}_* families: {sorted(f for f in samples.families if f.startswith(prefix))})"
            "; was it renamed, or never created?"
        )
    return samples[key]


def untouched(samples: Samples, name: str, **labels: str) -> float:
    """Like :func:`value`, but a labelled child that was never incremented (its family is
    declared, the child has no sample yet) is 0; a family that is not declared fails."""
    if _key(name, labels) not in samples and _declared(samples, name):
        return 0.0
    return value(samples, name, **labels)


def polled(samples: Samples, name: str, **labels: str) -> float | None:
    """For a wait: the sample, or None while it does not exist yet (never a made-up 0)."""
    return samples.get(_key(name, labels))


def health(base: str, kind: str = "ready") -> tuple[int, dict[str, Any]]:
    code, body = _get(f"{base}/health/{kind}")
    return code, json.loads(body)


def is_ready(base: str) -> bool:
    """The process answers its readiness with 200 (False while it is not serving yet)."""
    try:
        return health(base)[0] == 200
    except (urllib.error.URLError, OSError):
        return False


def failing(report: dict[str, Any]) -> dict[str, str]:
    return {c["check"]: c["detail"] for c in report["checks"] if not c["ok"]}


def served(env: dict[str, str]) -> tuple[dict[str, str], str]:
    """``env`` with a metrics port of its own, and the base URL it serves."""
    port = free_port()
    return {**env, "JOBWHEEL_METRICS_PORT": str(port)}, f"http://127.0.0.1:{port}"


def json_lines_only(path: Path) -> list[dict[str, Any]]:
    """A service's whole output (stdout and stderr): JSON objects, one per line, or fail."""
    records = []
    for line in path.read_text(errors="replace").splitlines():
        # raw, or written into the JSON (uvicorn adds a coloured copy of its messages)
        assert "\x1b" not in line and "\\u001b" not in line, f"escape in {path.name}: {line!r}"
        record = json.loads(line)  # anything else on the output is a failure
        assert {"ts", "level", "logger", "msg"} <= record.keys(), line
        records.append(record)
    return records


# Waits: three services up (90 + 60 + 60), the workload done (120), margins.
@pytest.mark.timeout(90 + 60 + 60 + 120 + 60)
def test_every_service_serves_metrics_that_move_under_a_real_workload(
    settings, jobwheel_env, procs: Procs, tmp_path: Path
):
    """A scheduler, a worker and `jobwheel serve` (API + sink), each on its own metrics port.
    Twenty quick jobs, one that fails for good and one that fails once: the counters of each
    process say so, scraped over HTTP; readiness is 200 for each; and every line each
    service wrote is a JSON log line."""
    base_env = {**jobwheel_env, "JOBWHEEL_LOG_FORMAT": "json"}
    env_s, scheduler = served(base_env)
    env_w, worker = served(base_env)
    env_a, api = served(base_env)
    sched = start_scheduler(procs, env_s, tmp_path / "sched")
    start_worker(procs, env_w, tmp_path / "w.log", tasks=DEMO_TASKS)
    procs.spawn(["jobwheel", "serve"], env_a, tmp_path / "api.log")
    for base in (scheduler, worker, api):
        wait_until(lambda b=base: is_ready(b), 60, 0.2, f"{base} never ready")

    # The group may hand partitions over in more than one step (KIP-848 is incremental).
    wait_until(
        lambda: (
            polled(scrape(scheduler), "jobwheel_scheduler_partitions", phase="ready") == 4
            and polled(scrape(worker), "jobwheel_worker_partitions", queue="default") == 4
        ),
        60,
        0.2,
        "the scheduler and the worker never held all 4 partitions",
    )
    before = {base: scrape(base) for base in (scheduler, worker, api)}
    assert value(before[scheduler], "jobwheel_scheduler_commands_total") == 0
    worker_runs = "jobwheel_worker_runs_total"  # the default queue's pool
    assert untouched(before[worker], worker_runs, queue="default", task="demo.echo") == 0

    with JobClient(settings) as client:
        client.schedule_many(
            [JobSpec(job_id=f"echo-{i}", task="demo.echo", now=True) for i in range(20)]
        )
        client.schedule("dead", task="demo.fail", now=True, max_attempts=1)
        client.schedule("flaky", task="demo.flaky", args={"failures": 1}, now=True)

    def settled() -> Samples | None:
        s = scrape(scheduler)
        done = polled(s, "jobwheel_scheduler_job_events_total", state="COMPLETED") == 21
        dead = polled(s, "jobwheel_scheduler_dead_letters_total", kind="dead-run") == 1
        return s if done and dead else None

    s = wait_until(settled, 120, 0.5, "the workload never settled")
    assert value(s, "jobwheel_scheduler_commands_total") == 22
    assert value(s, "jobwheel_scheduler_fires_total") == 22  # first attempts
    assert value(s, "jobwheel_scheduler_retries_total") == 1  # flaky's second attempt
    assert value(s, "jobwheel_scheduler_fire_lateness_seconds_count") == 22
    assert value(s, "jobwheel_scheduler_fire_lateness_seconds_bucket", le="+Inf") == 22
    assert value(s, "jobwheel_scheduler_runs_total", task="demo.echo", state="DISPATCHED") == 20
    assert value(s, "jobwheel_scheduler_runs_total", task="demo.fail", state="DEAD") == 1
    assert value(s, "jobwheel_scheduler_job_events_total", state="DEAD") == 1
    assert value(s, "jobwheel_scheduler_acks_total") >= 23  # a verdict per attempt
    assert value(s, "jobwheel_scheduler_transactions_total") >= 1
    # every committed transaction's latency is observed (equal once the scheduler is idle)
    wait_until(
        lambda: (
            value(t := scrape(scheduler), "jobwheel_scheduler_commit_seconds_count")
            == value(t, "jobwheel_scheduler_transactions_total")
        ),
        30,
        0.2,
        "commit latencies and transactions never matched",
    )
    # where the transactions' time went: the parts of the commit call are inside each
    # commit's latency (a scrape may land between the two: the phases lag, never lead)
    t = scrape(scheduler)
    phase = {
        name: value(t, "jobwheel_scheduler_transaction_phase_seconds_total", phase=name)
        for name in ("open", "produce", "offsets", "end", "state")
    }
    assert all(seconds > 0 for seconds in phase.values()), phase
    inside = phase["produce"] + phase["offsets"] + phase["end"]
    assert inside <= value(t, "jobwheel_scheduler_commit_seconds_sum"), phase
    assert value(s, "jobwheel_scheduler_transaction_aborts_total") == 0
    assert value(s, "jobwheel_scheduler_stuck_partitions") == 0
    assert value(s, "jobwheel_scheduler_restore_seconds_count") == 4
    assert (
        "jobwheel_scheduler_lag_records",
        (("partition", "0"), ("topic", settings.topics.requests)),
    ) in s

    w = scrape(worker)
    assert value(w, worker_runs, queue="default", task="demo.echo", state="SUCCEEDED") == 20
    assert value(w, worker_runs, queue="default", task="demo.fail", state="FAILED") == 1
    assert value(w, worker_runs, queue="default", task="demo.flaky", state="FAILED") == 1
    assert value(w, worker_runs, queue="default", task="demo.flaky", state="SUCCEEDED") == 1
    durations = "jobwheel_worker_run_duration_seconds_count"
    assert value(w, durations, queue="default", task="demo.echo") == 20
    assert value(w, "jobwheel_worker_inflight_runs", queue="default") == 0
    assert value(w, "jobwheel_worker_concurrency", queue="default") == settings.worker_concurrency

    def sunk() -> Samples | None:
        """The sink has inserted, and (idle) every batch's size and latency is observed."""
        a = scrape(api)
        batches = value(a, "jobwheel_sink_batches_total")
        return (
            a
            if batches > 0
            and batches == value(a, "jobwheel_sink_insert_seconds_count")
            and value(a, "jobwheel_sink_batch_rows_sum") == value(a, "jobwheel_sink_rows_total")
            else None
        )

    a = wait_until(sunk, 30, 0.5, "the sink inserted nothing, or its counts never matched")
    assert value(a, "jobwheel_sink_records_total") > 0
    assert value(a, "jobwheel_sink_undecodable_total") == 0
    assert value(a, "jobwheel_sink_partitions") == 8  # status and acks, 4 each

    # The pool's signals (status service): the worker has committed past every run, and the
    # transaction markers behind the last ones are no backlog; its announcement is counted.
    def pool_idle() -> Samples | None:
        p = scrape(api)
        idle = polled(p, "jobwheel_queue_unfinished_runs", queue="default") == 0
        return p if idle and polled(p, "jobwheel_queue_workers", queue="default") == 1 else None

    p = wait_until(pool_idle, 30, 0.5, "the default pool never read idle with its one worker")
    assert value(p, "jobwheel_queue_waiting_runs", queue="default") == 0
    assert value(p, "jobwheel_queue_inflight_runs", queue="default") == 0
    assert value(p, "jobwheel_queue_oldest_unfinished_age_seconds", queue="default") == 0
    assert value(p, "jobwheel_queue_concurrency", queue="default") == settings.worker_concurrency

    for base in (scheduler, worker, api):
        code, report = health(base)
        assert code == 200 and report["ok"], report
        assert health(base, "live")[0] == 200

    # One line per dead letter at INFO, naming the run; nothing but JSON on any output.
    [dead] = log_events(sched.log_path, "run dead-lettered")
    assert dead["level"] == "info" and dead["job_id"] == "dead" and dead["task"] == "demo.fail"
    for log in (sched.log_path, tmp_path / "w.log", tmp_path / "api.log"):
        records = json_lines_only(log)
        assert not [r for r in records if r["level"] in ("error", "critical")], log
        per_run = {"run started", "run succeeded", "run failed", "run skipped"}
        assert not [r for r in records if r["msg"] in per_run], log  # DEBUG only


# Waits: the first scheduler (90), its jobs committed (60), its stop (30), the restore seen and
# done (60 + 60), margins.
@pytest.mark.timeout(90 + 60 + 30 + 60 + 60 + 60)
def test_readiness_is_false_while_a_scheduler_restores_and_true_after(
    settings, jobwheel_env, procs: Procs, tmp_path: Path
):
    """A scheduler on an empty disk takes over 300 jobs: while it restores them from the
    changelog (each iteration slowed to 2 s, so the restore lasts long enough to be seen) its
    readiness is 503 naming the restoring partitions, its liveness stays 200; once restored,
    ready, with every partition ready and the records counted."""
    first_env, first = served(jobwheel_env)
    one = start_scheduler(procs, first_env, tmp_path / "one")
    with JobClient(settings) as client:
        client.schedule_many(
            [
                JobSpec(job_id=f"later-{i}", task="demo.echo", in_=timedelta(hours=1))
                for i in range(300)
            ]
        )
    wait_until(
        lambda: (
            polled(scrape(first), "jobwheel_scheduler_job_events_total", state="SCHEDULED") == 300
        ),
        60,
        0.5,
        "the first scheduler did not schedule the jobs",
    )
    assert stop(one, signal.SIGTERM, 30) == 0  # commits what it has, leaves the group

    env, second = served({**jobwheel_env, "JOBWHEEL_SCHEDULER_FAULT_DELAY_MS": "2000"})
    two = start_scheduler(procs, env, tmp_path / "two", wait=False)
    seen: list[tuple[int, dict[str, str]]] = []

    def restoring() -> str | None:
        try:
            code, report = health(second)
        except (urllib.error.URLError, OSError):
            return None  # not serving yet
        assert health(second, "live")[0] == 200  # restoring is not hung
        seen.append((code, failing(report)))
        detail = failing(report).get("partitions", "")
        return detail if code == 503 and detail.startswith("restoring partitions") else None

    try:
        detail = wait_until(restoring, 60, 0.1)
    except AssertionError:
        raise AssertionError(f"never seen restoring; the last answers: {seen[-5:]}") from None
    named = re.fullmatch(
        r"restoring partitions \[([0-9, ]+)\] \((\d+ records left|changelog not measured yet)\)",
        detail,
    )
    assert named is not None, detail
    assert {int(p) for p in named[1].split(", ")} <= set(range(settings.partitions))
    code, report = wait_until(
        lambda: (r := health(second))[0] == 200 and r, 60, 0.2, "never ready after restoring"
    )
    assert report["ok"]
    s = scrape(second)
    assert value(s, "jobwheel_scheduler_partitions", phase="ready") == 4
    assert value(s, "jobwheel_scheduler_partitions", phase="restoring") == 0
    assert value(s, "jobwheel_scheduler_restored_records_total") >= 300
    assert value(s, "jobwheel_scheduler_restore_seconds_count") == 4
    # ... and it says so once ready, restored from an empty disk
    ready = log_events(two.log_path, "partition ready")
    assert sum(e["restored_records"] for e in ready) >= 300


# Waits: the scheduler ready (60), stuck reported (40), ready again (60), health calls.
@pytest.mark.timeout(60 + 40 + 60 + 120)
def test_health_names_the_stuck_partition_from_the_schedulers_readiness(
    settings, jobwheel_env, procs: Procs, tmp_path: Path
):
    """A scheduler alive but making no progress (every iteration takes 15 s): its own
    readiness names the partition with work waiting and no commit, its liveness stays 200, and
    `jobwheel health` fails with that partition under the process's name
    (JOBWHEEL_HEALTH_URLS); once it commits again, both are fine."""
    env = {**jobwheel_env, "JOBWHEEL_HEALTH_STUCK_AFTER_MS": "3000"}
    env_s, base = served(env)
    scheduler = start_scheduler(
        procs, env_s, tmp_path / "stuck", extra_env={"JOBWHEEL_SCHEDULER_FAULT_DELAY_MS": "15000"}
    )
    wait_owns_all(scheduler, settings.partitions)
    wait_until(lambda: is_ready(base), 30, 0.5, "never ready before the job")
    with JobClient(settings) as client:
        job = client.schedule("stuck-job", task="demo.echo", now=True)
    p = partition_for(job, settings.partitions)

    def cli_health() -> dict[str, dict[str, Any]]:
        out = subprocess.run(
            [sys.executable, "-m", "jobwheel.cli", "health", "--json"],
            env={**env, "JOBWHEEL_HEALTH_URLS": f"scheduler={base}"},
            capture_output=True,
            text=True,
            timeout=scaled(60),
        )
        return {c["check"]: c for c in json.loads(out.stdout)["checks"]}

    stuck = wait_until(
        lambda: (c := cli_health()["ready:scheduler"]) and not c["ok"] and c,
        40,
        0.5,
        "jobwheel health never reported the scheduler not ready",
    )
    assert f"partitions: partition {p}: " in stuck["detail"], stuck
    assert "unread input records and no commit for" in stuck["detail"]
    # The alert's metric (JobwheelPartitionStuck) says so too, and clears with it.
    wait_until(
        lambda: polled(scrape(base), "jobwheel_scheduler_stuck_partitions") == 1,
        30,
        0.5,
        "the stuck partition never showed in jobwheel_scheduler_stuck_partitions",
    )
    assert health(base, "live")[0] == 200  # stuck, not dead: a restart is not the answer
    wait_until(lambda: health(base)[0] == 200, 60, 0.5, "stayed not ready after committing")
    wait_until(lambda: cli_health()["ready:scheduler"]["ok"], 60, 1.0, "health stayed failing")
    assert value(scrape(base), "jobwheel_scheduler_stuck_partitions") == 0


# Waits: three services up (90 + 60 + 60), the run in flight and done (60 + 60), the garbage
# counted (30), margins.
@pytest.mark.timeout(90 + 60 + 60 + 60 + 60 + 30 + 60)
def test_the_gauges_and_counters_checked_at_zero_move_when_their_cause_happens(
    settings, jobwheel_env, procs: Procs, tmp_path: Path
):
    """``inflight_runs == 0`` and ``undecodable_total == 0`` above prove something only if
    these samples can be anything else: a run blocked on its gate is in flight (1, then 0 once
    it finishes), and a record on the status topic that no schema decodes is counted by the
    sink (and the sink goes on: the next run's events are still inserted)."""
    from confluent_kafka import Producer

    base_env = {**jobwheel_env, "JOBWHEEL_LOG_FORMAT": "json"}
    env_s, scheduler = served(base_env)
    env_w, worker = served(base_env)
    env_a, api = served(base_env)
    start_scheduler(procs, env_s, tmp_path / "sched")
    start_worker(procs, env_w, tmp_path / "w.log")
    procs.spawn(["jobwheel", "serve"], env_a, tmp_path / "api.log")
    for base in (scheduler, worker, api):
        wait_until(lambda b=base: is_ready(b), 60, 0.2, f"{base} never ready")
    assert value(scrape(worker), "jobwheel_worker_inflight_runs", queue="default") == 0
    assert value(scrape(api), "jobwheel_sink_undecodable_total") == 0

    gate = tmp_path / "gate"
    with JobClient(settings) as client:
        client.schedule("gated", task="test.gate", args={"gate": str(gate)}, now=True)
    wait_until(
        lambda: polled(scrape(worker), "jobwheel_worker_inflight_runs", queue="default") == 1,
        60,
        0.2,
        "the gated run never showed in jobwheel_worker_inflight_runs",
    )
    gate.touch()
    wait_until(
        lambda: polled(scrape(worker), "jobwheel_worker_inflight_runs", queue="default") == 0,
        60,
        0.2,
        "jobwheel_worker_inflight_runs stayed up after the run finished",
    )

    producer = Producer(settings.librdkafka())
    producer.produce(settings.topics.status, key=b"garbage", value=b"\x00no schema at all")
    assert producer.flush(30) == 0
    wait_until(
        lambda: polled(scrape(api), "jobwheel_sink_undecodable_total") == 1,
        30,
        0.5,
        "the sink never counted the undecodable record",
    )
