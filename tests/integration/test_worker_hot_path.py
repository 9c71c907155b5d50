"""The worker's hot path on a real broker: one record per quick run, the offset rule (an offset
counts as done only once its run finished and the broker acknowledged the verdict), and
fencing that one forged record cannot turn against a whole partition.

Runs are produced as the scheduler produces them (``tests/integration/scheduler_support.py``
has the helpers); ``jobwheel worker`` runs as a subprocess.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from jobwheel.kafka.admin import ensure_topics
from jobwheel.schemas.models import State
from jobwheel.schemas.partitioning import partition_for
from tests.integration.scheduler_support import (
    TopicTail,
    committed_offsets,
    end_offsets,
    make_run,
    produce_runs,
)
from tests.support import log_tail, scaled, start_worker, wait_until


def same_partition_jobs(settings: Any, count: int, partition: int | None = None) -> list[str]:
    """``count`` job ids that all land in one partition (``partition``, or the first's)."""
    found: list[str] = []
    while len(found) < count:
        job_id = f"job-{uuid.uuid4().hex[:8]}"
        p = partition_for(job_id, settings.partitions)
        if partition is None:
            partition = p
        if p == partition:
            found.append(job_id)
    return found


def test_a_quick_run_sends_one_record_with_its_start_and_a_slow_run_its_own_started(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    quick = make_run(settings, "demo.echo", {"n": 1})
    slow = make_run(settings, "demo.sleep", {"seconds": 0.6})
    produce_runs(settings, [quick, slow])
    start_worker(procs, jobwheel_env, tmp_path / "worker.log")

    done = tail.wait_for(quick.run_id, State.SUCCEEDED)[0]
    assert done.started_ms is not None
    assert done.started_ms <= done.event_time_ms
    assert done.event_time_ms - done.started_ms >= done.duration_ms
    slow_done = tail.wait_for(slow.run_id, State.SUCCEEDED)[0]
    assert tail.of(quick.run_id) == [done]  # nothing else about the quick run
    (started,) = tail.of(slow.run_id, State.STARTED)
    assert slow_done.started_ms is None  # its start is in its STARTED event
    # STARTED is sent once the run is past the quick-run time, stamped with the real start.
    assert started.event_time_ms <= slow_done.event_time_ms - 500
    assert tail.events().index(started) < tail.events().index(slow_done)


def test_an_offset_is_committed_only_once_the_broker_has_the_verdict(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    """With the acks topic gone the runs execute but their verdicts cannot be delivered: no
    offset moves. Once the topic is back the verdicts arrive and the offsets follow."""
    admin = AdminClient(settings.librdkafka())
    for future in admin.delete_topics([settings.topics.acks], operation_timeout=30).values():
        future.result()
    wait_until(
        lambda: settings.topics.acks not in admin.list_topics(timeout=10).topics,
        30,
        message="acks topic not deleted",
    )
    counter = tmp_path / "count.txt"
    runs = [make_run(settings, "demo.count", {"path": str(counter)}) for _ in range(6)]
    produce_runs(settings, runs)
    # Deliveries to a missing topic fail after a second (instead of librdkafka's 30 s) and the
    # pool retries them with backoff.
    env = {
        **jobwheel_env,
        "JOBWHEEL_KAFKA_CONFIG": json.dumps({"topic.metadata.propagation.max.ms": 1000}),
    }
    log_path = tmp_path / "worker.log"
    proc = start_worker(procs, env, log_path)

    wait_until(
        lambda: counter.exists() and len(counter.read_text().splitlines()) == len(runs),
        60,
        message=f"runs not executed:\n{log_tail(log_path)}",
    )
    wait_until(
        # "not delivered" (a delivery report) or "not queued" (the client knows the topic is
        # missing), each followed by a retry
        lambda: log_path.read_text().count("pool: status event not") >= 2 * len(runs),
        60,
        message=f"no failed deliveries:\n{log_tail(log_path)}",
    )
    # Every run finished (and failed to report) well over a commit interval ago. A partition
    # may commit its first fetched offset (with the mark of the runs started there, for the
    # next owner to name a repeat), never an offset past a run without a delivered verdict.
    committed = committed_offsets(settings)
    assert {p: o for p, o in committed.items() if o > 0} == {}, committed
    assert proc.poll() is None, log_tail(log_path)

    ensure_topics(settings)  # the acks topic is back
    for run in runs:
        tail.wait_for(run.run_id, State.SUCCEEDED, timeout_s=60)
    ends = {p: o for p, o in end_offsets(settings).items() if o > 0}
    wait_until(
        lambda: all(committed_offsets(settings).get(p, -1) >= o - 1 for p, o in ends.items()),
        30,
        interval_s=0.2,
        message=f"offsets not committed: {committed_offsets(settings)} vs ends {ends}",
    )
    assert len(counter.read_text().splitlines()) == len(runs)  # executed once each


def test_a_long_run_holds_back_its_partitions_commit_while_later_runs_finish(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    jobs = same_partition_jobs(settings, 6)
    partition = partition_for(jobs[0], settings.partitions)
    gate = tmp_path / "long-gate"  # shut: the long run executes until the test opens it
    long_run = make_run(settings, "test.gate", {"gate": str(gate)}, job_id=jobs[0])
    quick = [make_run(settings, "demo.echo", {"i": i}, job_id=j) for i, j in enumerate(jobs[1:])]
    produce_runs(settings, [long_run, *quick])
    start_worker(procs, jobwheel_env, tmp_path / "worker.log")
    for run in quick:
        tail.wait_for(run.run_id, State.SUCCEEDED)

    # A run in another partition, finished after all of those: once its offset is committed,
    # a commit pass has seen the quick runs' acknowledged verdicts.
    other = next(
        j
        for j in (f"job-{uuid.uuid4().hex[:8]}" for _ in range(1000))
        if partition_for(j, settings.partitions) != partition
    )
    marker = make_run(settings, "demo.echo", {"marker": True}, job_id=other)
    produce_runs(settings, [marker])
    tail.wait_for(marker.run_id, State.SUCCEEDED)
    marker_partition = partition_for(other, settings.partitions)
    marker_end = end_offsets(settings)[marker_partition]
    wait_until(
        lambda: committed_offsets(settings).get(marker_partition, -1) >= marker_end - 1,
        30,
        interval_s=0.2,
        message="the marker's offset was never committed",
    )
    # The long run is still executing: nothing at or after its offset may be committed.
    assert not tail.of(long_run.run_id, State.SUCCEEDED)
    assert committed_offsets(settings).get(partition, 0) <= 0
    # Once it ends, the partition's commit goes past every run of it (the same reader sees it).
    gate.touch()
    tail.wait_for(long_run.run_id, State.SUCCEEDED)
    end = end_offsets(settings)[partition]
    wait_until(
        lambda: committed_offsets(settings).get(partition, -1) >= end - 1,
        scaled(30),
        interval_s=0.2,
        message="the partition was not committed once the long run ended",
    )


def test_a_forged_run_with_a_token_from_the_future_fences_nothing_else(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    forged_job, real_job, later_job = same_partition_jobs(settings, 3)
    counter = tmp_path / "count.txt"
    forged = make_run(settings, "demo.echo", {}, job_id=forged_job, fencing_token=2**62)
    real = make_run(settings, "demo.count", {"path": str(counter)}, job_id=real_job)
    produce_runs(settings, [forged, real])
    start_worker(procs, jobwheel_env, tmp_path / "worker.log")

    tail.wait_for(real.run_id, State.SUCCEEDED)
    later = make_run(settings, "demo.count", {"path": str(counter)}, job_id=later_job)
    produce_runs(settings, [later])
    tail.wait_for(later.run_id, State.SUCCEEDED)
    assert not tail.events(state=State.STALE)
    assert counter.read_text().splitlines() == [f"{real.run_id}:1", f"{later.run_id}:1"]


def test_time_limits_fail_the_run_and_a_stuck_thread_keeps_its_slot(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    """Over its ``timeout_ms`` a run is FAILED (retryable) at the limit. An async task is
    cancelled; a sync task's thread cannot be, so it keeps its concurrency slot until it
    returns: with one slot the next run starts only then."""
    counter = tmp_path / "count.txt"
    slow_async = make_run(settings, "demo.sleep", {"seconds": 30}, timeout_ms=300)
    stuck_job, after_job = same_partition_jobs(settings, 2)  # fetched in this order
    # The sync task blocks (in its thread) until the test opens its gate, then notes its end.
    stuck_gate = tmp_path / "stuck-gate"
    stuck_sync = make_run(
        settings,
        "test.gate",
        {"gate": str(stuck_gate), "finished": str(counter)},
        job_id=stuck_job,
        timeout_ms=300,
    )
    after = make_run(settings, "demo.count", {"path": str(counter)}, job_id=after_job)
    produce_runs(settings, [slow_async])
    log_path = tmp_path / "worker.log"
    start_worker(procs, jobwheel_env, log_path, "--concurrency", "1")

    failed = tail.wait_for(slow_async.run_id, State.FAILED)[0]
    assert failed.reason is not None and failed.reason.startswith("timed out")
    assert failed.retry_delay_ms is not None  # attempt 1 of 3: the scheduler retries it

    produce_runs(settings, [stuck_sync, after])
    stuck = tail.wait_for(stuck_sync.run_id, State.FAILED)[0]
    assert stuck.reason is not None and stuck.reason.startswith("timed out")
    # FAILED at the limit, not at the thread's end: the thread is still blocked on its gate.
    assert not counter.exists()
    # It keeps the one slot: the next run has not started (read to the end after the FAILED).
    tail.read_to_end()
    assert not tail.of(after.run_id), tail.of(after.run_id)
    stuck_gate.touch()
    tail.wait_for(after.run_id, State.SUCCEEDED)
    # The next run ran only once the thread had returned.
    assert counter.read_text().splitlines() == [f"{stuck_sync.run_id}:1", f"{after.run_id}:1"]
    assert "keeps its slot until it returns" in log_path.read_text()
