"""The worker on a real broker, without the scheduler: runs are produced the way the scheduler
produces them (transactional, keyed by job id, murmur2), ``jobwheel worker`` runs as a
subprocess, and the test reads what it acknowledges on the acks topic.

Runs that must be executing at a given moment use the ``tests.tasks`` gate tasks: they block
until the test creates a file, so "the run is still executing" is a fact, not a hope.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from jobwheel.schemas.models import State, StatusEvent
from jobwheel.schemas.partitioning import partition_for
from jobwheel.schemas.validation import MAX_DURATION_MS
from tests.integration.scheduler_support import (
    TopicTail,
    committed_offsets,
    end_offsets,
    gated_run,
    make_run,
    produce_runs,
)
from tests.support import (
    HarnessError,
    file_lines,
    log_tail,
    scaled,
    start_worker,
    stop,
    wait_for_log,
    wait_until,
)


def test_outcomes_become_status_events_in_the_jobs_partition(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    echo = make_run(settings, "demo.echo", {"to": "a@example.com", "n": 3})
    listed = make_run(settings, "demo.echo", [1, "two"])
    unknown = make_run(settings, "no.such.task")
    fail_early = make_run(settings, "demo.fail", attempt=1, max_attempts=3)
    fail_last = make_run(settings, "demo.fail", attempt=3, max_attempts=3)
    flaky = make_run(settings, "demo.flaky", {"failures": 1}, attempt=2)
    # Bytes no codec understands, in the same partition as a later good run: skipped, committed.
    after_garbage = make_run(settings, "demo.echo", {"after": "garbage"}, job_id="garbage-job")
    produce_runs(settings, [b"\x00not avro at all", after_garbage], key="garbage-job")
    produce_runs(settings, [echo, listed, unknown, fail_early, fail_last, flaky])
    log_path = tmp_path / "worker.log"
    # STARTED before every run, even a quick one (by default a quick run sends only its verdict).
    proc = start_worker(procs, jobwheel_env, log_path, worker_started_event_ms="0")

    started = tail.wait_for(echo.run_id, State.STARTED)[0]
    done = tail.wait_for(echo.run_id, State.SUCCEEDED)[0]
    assert tail.events().index(started) < tail.events().index(done)
    assert json.loads(done.result_json) == {"to": "a@example.com", "n": 3}
    assert done.source == "worker" and done.worker and done.worker.endswith(f":{proc.pid}")
    assert (done.seq, done.attempt, done.task) == (echo.seq, 1, "demo.echo")
    assert done.scheduled_time_ms == echo.scheduled_time_ms
    assert done.event_id == f"{echo.run_id}:1:SUCCEEDED"
    assert done.duration_ms is not None and done.duration_ms >= 0
    assert started.deadline_ms is not None and started.deadline_ms > started.event_time_ms
    # Keyed by job id and murmur2-partitioned: the scheduler owning the job reads it.
    assert tail.keys[echo.job_id] == {echo.job_id.encode()}
    assert tail.partitions[echo.job_id] == {partition_for(echo.job_id, settings.partitions)}

    assert json.loads(tail.wait_for(listed.run_id, State.SUCCEEDED)[0].result_json) == [1, "two"]

    failed = tail.wait_for(unknown.run_id, State.FAILED)[0]
    assert failed.retry_delay_ms is None
    assert "unknown task 'no.such.task'" in failed.reason
    assert failed.error.startswith("TaskError: ")
    tail.read_to_end()  # after its FAILED: a STARTED would be among what is read
    assert not tail.of(unknown.run_id, State.STARTED)  # it never started

    early = tail.wait_for(fail_early.run_id, State.FAILED)[0]
    assert early.retry_delay_ms is not None and early.retry_delay_ms > 0
    assert early.error == "RuntimeError: demo.fail always fails"
    last = tail.wait_for(fail_last.run_id, State.FAILED)[0]
    assert last.retry_delay_ms is None and "exhausted" in last.reason

    assert json.loads(tail.wait_for(flaky.run_id, State.SUCCEEDED)[0].result_json) == {"attempt": 2}
    tail.wait_for(after_garbage.run_id, State.SUCCEEDED)
    assert proc.poll() is None, log_tail(log_path)
    assert "undecodable run record dead-lettered" in log_path.read_text()

    # Everything reached a terminal event, so every partition is committed to its end
    # (the garbage record included).
    ends = {p: o for p, o in end_offsets(settings).items() if o > 0}
    wait_until(
        lambda: all(committed_offsets(settings).get(p, -1) >= o - 1 for p, o in ends.items()),
        15,
        interval_s=0.3,
        message=f"offsets not committed: {committed_offsets(settings)} vs ends {ends}",
    )


def assert_committed_and_alive(settings: Any, job: str, proc: Any, log_path: Path) -> None:
    """The job's partition was committed to its end (every run there has its verdict) and the
    worker is still up: what one hostile run must not take from the runs after it."""
    partition = partition_for(job, settings.partitions)
    end = end_offsets(settings)[partition] - 1  # the last offset is the commit marker
    wait_until(
        lambda: committed_offsets(settings).get(partition, -1) >= end,
        15,
        interval_s=0.3,
        message=f"offsets not committed: {committed_offsets(settings)} vs end {end}",
    )
    assert proc.poll() is None, log_tail(log_path)


def test_a_task_whose_error_or_result_is_not_valid_unicode_still_gets_its_verdict(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    """A file name whose bytes are not UTF-8 reaches Python as a lone surrogate, which no
    UTF-8 record can carry. A task that fails with such a name in its message, or returns
    one, still gets its verdict (the text escaped), and the runs after it in the partition
    run and are committed: one task's odd text must not stall its partition."""
    job = f"job-{uuid.uuid4().hex[:8]}"
    fails = make_run(
        settings, "test.undecodable_name", {"fail": True}, job_id=job, run_id=f"{job}@1"
    )
    returns = make_run(settings, "test.undecodable_name", job_id=job, run_id=f"{job}@2")
    after = make_run(settings, "demo.echo", {"after": 1}, job_id=job, run_id=f"{job}@3")
    produce_runs(settings, [fails, returns, after])
    log_path = tmp_path / "worker.log"
    proc = start_worker(procs, jobwheel_env, log_path)

    failed = tail.wait_for(fails.run_id, State.FAILED)[0]
    assert failed.error == "FileNotFoundError: no such file: report-\\udcff.txt"
    done = tail.wait_for(returns.run_id, State.SUCCEEDED)[0]
    assert json.loads(done.result_json) == {"name": "report-\udcff.txt"}  # JSON escapes it
    tail.wait_for(after.run_id, State.SUCCEEDED)
    assert_committed_and_alive(settings, job, proc, log_path)


def test_a_task_whose_outcome_cannot_be_printed_still_gets_its_verdict(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    """Async tasks whose outcome the worker cannot simply print: an exception whose ``str()``
    raises, a result neither ``str()`` nor ``repr()`` can print, an int past the digits
    ``str()`` converts, a ``CancelledError`` from the task's own await. Each gets its verdict
    (the failures retryable), and the run after them in the partition runs and is committed.
    Before, each left its run without a verdict: the slot held and the partition's offsets
    stopped there."""
    job = f"job-{uuid.uuid4().hex[:8]}"
    kinds = ("unprintable", "opaque", "huge", "cancelled")
    runs = {
        kind: make_run(
            settings, "test.hostile_outcome", {"kind": kind}, job_id=job, run_id=f"{job}@{i}"
        )
        for i, kind in enumerate(kinds)
    }
    after = make_run(settings, "demo.echo", {"after": 1}, job_id=job, run_id=f"{job}@9")
    produce_runs(settings, [*runs.values(), after])
    log_path = tmp_path / "worker.log"
    proc = start_worker(procs, jobwheel_env, log_path)

    unprintable = tail.wait_for(runs["unprintable"].run_id, State.FAILED)[0]
    assert unprintable.error == "Unprintable: <str() of this exception raised RuntimeError>"
    assert unprintable.retry_delay_ms is not None
    opaque = tail.wait_for(runs["opaque"].run_id, State.SUCCEEDED)[0]
    assert json.loads(opaque.result_json) == "<dict object: repr() raised RuntimeError>"
    huge = tail.wait_for(runs["huge"].run_id, State.SUCCEEDED)[0]
    assert json.loads(huge.result_json) == "<dict object: repr() raised ValueError>"
    cancelled = tail.wait_for(runs["cancelled"].run_id, State.FAILED)[0]
    assert cancelled.error == "CancelledError" and cancelled.retry_delay_ms is not None
    tail.wait_for(after.run_id, State.SUCCEEDED)
    assert_committed_and_alive(settings, job, proc, log_path)


def test_a_task_outcome_the_contract_cannot_carry_as_given_still_gets_its_verdict(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    """What a task raises or returns reaches its verdict in a form the contract carries: a
    BaseException that is not an Exception, a retry delay as a float or past the largest
    duration, a retry reason past the broker's record size, a task cancelling itself, a plain
    function returning a coroutine it never ran. Before, each left its run without a verdict
    (or, for the coroutine, reported a success of a body that never ran), and the partition's
    offsets stopped there."""
    job = f"job-{uuid.uuid4().hex[:8]}"
    kinds = ("base", "float_retry", "far_retry", "long_reason", "self_cancel")
    runs = {
        kind: make_run(
            settings, "test.hostile_outcome", {"kind": kind}, job_id=job, run_id=f"{job}@{i}"
        )
        for i, kind in enumerate(kinds)
    }
    runs["coroutine"] = make_run(settings, "test.returns_coroutine", job_id=job, run_id=f"{job}@7")
    after = make_run(settings, "demo.echo", {"after": 1}, job_id=job, run_id=f"{job}@9")
    produce_runs(settings, [*runs.values(), after])
    log_path = tmp_path / "worker.log"
    proc = start_worker(procs, jobwheel_env, log_path)

    def failed(kind: str) -> StatusEvent:
        return tail.wait_for(runs[kind].run_id, State.FAILED)[0]

    base = failed("base")
    assert base.error == "Abort: stop right here" and base.retry_delay_ms is not None
    assert failed("float_retry").retry_delay_ms == 1501  # whole ms, rounded up
    assert failed("far_retry").retry_delay_ms == MAX_DURATION_MS
    long_reason = failed("long_reason")
    assert long_reason.reason.startswith("task asked for a retry: xxx")
    assert len(long_reason.reason) <= 2048 and len(long_reason.error) <= 2048
    cancelled = failed("self_cancel")
    assert cancelled.error == "CancelledError" and cancelled.retry_delay_ms is not None
    coroutine = failed("coroutine")
    assert coroutine.retry_delay_ms is None and "declare it `async def`" in coroutine.reason
    tail.wait_for(after.run_id, State.SUCCEEDED)
    assert_committed_and_alive(settings, job, proc, log_path)


def test_task_code_can_neither_stop_the_worker_nor_keep_it_from_exiting(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    """A task that stops the worker's event loop; an async task that swallows every
    cancellation (its time limit's too) and leaves a non-daemon thread behind. The first
    run succeeds and the worker carries on (before, it died, and so would every worker the
    run went to next); the second is reported timed out a moment after its limit (before:
    never), and SIGTERM still ends the worker, exit code 0 (before: it hung until SIGKILL)."""
    started = tmp_path / "stubborn-started"
    stops = make_run(settings, "test.stops_loop")
    stubborn = make_run(settings, "test.stubborn", {"started": str(started)})
    produce_runs(settings, [stops, stubborn])
    log_path = tmp_path / "worker.log"
    proc = start_worker(procs, jobwheel_env, log_path)

    done = tail.wait_for(stops.run_id, State.SUCCEEDED)[0]
    assert json.loads(done.result_json) == "after the stop"
    timed_out = tail.wait_for(stubborn.run_id, State.FAILED)[0]
    assert timed_out.reason.startswith("timed out") and timed_out.retry_delay_ms is not None
    assert started.exists() and proc.poll() is None, log_tail(log_path)
    assert stop(proc, timeout_s=30) == 0, log_tail(log_path)
    assert "exiting with task code still running" in log_path.read_text()


def test_long_runs_heartbeat_with_a_fresh_deadline(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    run = make_run(settings, "test.gate_async", {"gate": str(gate)}, visibility_timeout_ms=900)
    produce_runs(settings, [run])
    start_worker(procs, jobwheel_env, tmp_path / "worker.log")
    tail.wait_for(run.run_id, State.HEARTBEAT, count=3)  # every 300 ms while it runs
    gate.touch()
    tail.wait_for(run.run_id, State.SUCCEEDED)
    beats = tail.of(run.run_id, State.HEARTBEAT)
    assert len({b.event_id for b in beats}) == len(beats)
    assert all(b.deadline_ms == b.event_time_ms + 900 for b in beats)
    succeeded = tail.of(run.run_id, State.SUCCEEDED)[0]
    assert all(tail.events().index(b) < tail.events().index(succeeded) for b in beats)


def test_a_run_starting_late_in_its_visibility_window_says_started_before_its_verdict(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    """A quick run sends only its verdict; one that starts after waiting half its visibility
    timeout (a backlog, a broker outage) sends STARTED at once: the scheduler's deadline for it
    is near, and the verdict of a run started after it could reach the scheduler first and get
    it copied while it runs."""
    fresh = make_run(settings, "demo.echo", {"n": 1}, visibility_timeout_ms=60_000)
    waited = make_run(settings, "demo.echo", {"n": 2}, visibility_timeout_ms=60_000)
    # Dispatched 40 s ago: 20 s of its 60 s left.
    waited = replace(
        waited,
        dispatched_at_ms=waited.dispatched_at_ms - 40_000,
        deadline_ms=waited.deadline_ms - 40_000,
    )
    produce_runs(settings, [fresh, waited])
    start_worker(procs, jobwheel_env, tmp_path / "worker.log")
    done = tail.wait_for(waited.run_id, State.SUCCEEDED)[0]
    [started] = tail.of(waited.run_id, State.STARTED)
    assert tail.events().index(started) < tail.events().index(done)
    tail.wait_for(fresh.run_id, State.SUCCEEDED)
    tail.read_to_end()  # after its verdict: a STARTED would be among what is read
    assert tail.of(fresh.run_id, State.STARTED) == []


def test_duplicate_delivery_while_running_executes_once(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    counter, gate = tmp_path / "count.txt", tmp_path / "gate"
    run = make_run(settings, "test.gate", {"gate": str(gate), "started": str(counter)})
    produce_runs(settings, [run, run])
    log_path = tmp_path / "worker.log"
    worker = start_worker(procs, jobwheel_env, log_path, log_level="DEBUG")
    # The duplicate is handled while the first delivery runs: its gate is still shut.
    wait_for_log(log_path, "state=DUPLICATE", scaled(30), proc=worker)
    assert counter.read_text().splitlines() == [f"{run.run_id}:1"]
    tail.wait_for(run.run_id, State.STARTED)  # a run past 100 ms says so before it ends
    gate.touch()
    tail.wait_for(run.run_id, State.SUCCEEDED)
    assert counter.read_text().splitlines() == [f"{run.run_id}:1"]
    assert len(tail.of(run.run_id, State.STARTED)) == 1
    # Both records' offsets are committed with the one execution.
    partition = partition_for(run.job_id, settings.partitions)
    end = end_offsets(settings)[partition]
    wait_until(
        lambda: committed_offsets(settings).get(partition, -1) >= end - 1,
        15,
        interval_s=0.3,
        message="duplicate's offset not committed",
    )


def test_older_attempts_and_fenced_owners_are_stale(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    counter = tmp_path / "count.txt"
    args = {"path": str(counter)}
    newer = make_run(settings, "demo.count", args, job_id="job-s", run_id="job-s@1", attempt=2)
    older = make_run(settings, "demo.count", args, job_id="job-s", run_id="job-s@1", attempt=1)
    owner = make_run(
        settings, "demo.count", args, job_id="job-s", run_id="job-s@2", fencing_token=5
    )
    fenced = make_run(  # the same run again from a replaced owner
        settings, "demo.count", args, job_id="job-s", run_id="job-s@2", fencing_token=4
    )
    produce_runs(settings, [newer, older, owner, fenced])
    start_worker(procs, jobwheel_env, tmp_path / "worker.log")

    stale = tail.wait_for(older.run_id, State.STALE)[0]
    assert stale.attempt == 1 and "1 < 2" in stale.reason
    assert tail.wait_for(fenced.run_id, State.STALE)[0].reason == "fenced: token 4 < 5"
    tail.wait_for(newer.run_id, State.SUCCEEDED)
    tail.wait_for(owner.run_id, State.SUCCEEDED)
    assert sorted(counter.read_text().splitlines()) == ["job-s@1:2", "job-s@2:1"]


def test_sigterm_lets_runs_finish_within_the_grace_then_hands_the_rest_back(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    """SIGTERM: fetching stops, running runs get the grace period to finish, and whatever still
    runs after it is handed back (FAILED, retry at once) and the worker exits. The runs that
    never finish block on a gate that is never opened, so the worker exiting at all shows it
    did not wait for them; the run released during the grace shows it did wait."""
    released = tmp_path / "released"  # created during the grace period
    never = tmp_path / "never"  # never created
    finishing = make_run(settings, "test.gate", {"gate": str(released)})
    async_run = make_run(settings, "test.gate_async", {"gate": str(never)})
    sync_run = make_run(settings, "test.gate", {"gate": str(never)})
    quick = make_run(settings, "demo.echo", {"quick": True})
    produce_runs(settings, [finishing, async_run, sync_run, quick])
    grace_ms = int(scaled(5) * 1000)
    log_path = tmp_path / "worker.log"
    proc = start_worker(procs, jobwheel_env, log_path, worker_shutdown_grace_ms=str(grace_ms))
    for run in (finishing, async_run, sync_run):
        tail.wait_for(run.run_id, State.STARTED)
    tail.wait_for(quick.run_id, State.SUCCEEDED)

    sigterm_ms = int(time.time() * 1000)
    os.killpg(proc.pid, signal.SIGTERM)
    wait_for_log(log_path, "worker stopping", 30, proc=proc)
    released.touch()
    # Finished within the grace: a worker that handed everything back at once would have
    # reported it FAILED ("worker shutdown") instead.
    done = tail.wait_for(finishing.run_id, State.SUCCEEDED)[0]
    assert json.loads(done.result_json) == {"attempt": 1}
    assert proc.wait(scaled(grace_ms / 1000 + 30)) == 0, log_tail(log_path)
    for run in (async_run, sync_run):
        handed = tail.wait_for(run.run_id, State.FAILED)[0]
        assert handed.reason == "worker shutdown"
        assert handed.retry_delay_ms == 0
        assert handed.event_time_ms >= sigterm_ms + grace_ms, "handed back before the grace"
    tail.read_to_end()
    assert not tail.of(finishing.run_id, State.FAILED)
    # The handed-back runs are the scheduler's now: their offsets are committed.
    ends = {p: o for p, o in end_offsets(settings).items() if o > 0}
    assert ends
    assert all(committed_offsets(settings).get(p, -1) >= o - 1 for p, o in ends.items())


def test_a_killed_worker_loses_nothing_its_run_is_delivered_again(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    started, gate = tmp_path / "started.txt", tmp_path / "gate"
    run = make_run(settings, "test.gate", {"gate": str(gate), "started": str(started)})
    produce_runs(settings, [run])
    # A short session so the group notices the dead member quickly.
    env = {**jobwheel_env, "JOBWHEEL_KAFKA_CONFIG": json.dumps({"session.timeout.ms": 6000})}
    first = start_worker(procs, env, tmp_path / "first.log")
    tail.wait_for(run.run_id, State.STARTED)
    stop(first, signal.SIGKILL)  # the run is blocked on its gate: it cannot have finished
    tail.read_to_end()
    assert not tail.of(run.run_id, State.SUCCEEDED)
    assert not tail.of(run.run_id, State.FAILED)

    gate.touch()
    second = start_worker(procs, env, tmp_path / "second.log")
    done = tail.wait_for(run.run_id, State.SUCCEEDED, timeout_s=60)[0]
    assert done.worker.endswith(f":{second.pid}")
    assert file_lines(started) == [f"{run.run_id}:1", f"{run.run_id}:1"]


def _set_acks_max_message_bytes(settings: Any, value: int | None) -> None:
    """Make the broker refuse every acks record (a tiny ``max.message.bytes``) or accept them
    again (``None``: the broker default)."""
    op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        settings.topics.acks,
        incremental_configs=[
            ConfigEntry("max.message.bytes", str(value or ""), incremental_operation=op)
        ],
    )
    admin = AdminClient(settings.librdkafka())
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def _acks_refused(settings: Any, partition: int) -> bool:
    """Does the broker refuse a record on this acks partition now? (The config change takes
    effect on the broker shortly after the admin call returns.)"""
    producer = Producer(settings.librdkafka(**{"message.timeout.ms": 10_000}))
    errors: list[Any] = []
    producer.produce(
        settings.topics.acks,
        value=b"probe" * 40,
        partition=partition,
        on_delivery=lambda err, _msg: errors.append(err),
    )
    if producer.flush(30) != 0:
        raise HarnessError("the probe record was neither accepted nor refused")
    if errors[0] is None:
        raise HarnessError("a probe record was written to the acks topic")
    return errors[0].name() == "MSG_SIZE_TOO_LARGE"


def test_offsets_wait_for_the_brokers_acknowledgement_of_the_final_event(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    """A run that finished but whose SUCCEEDED the broker never acknowledged is not done: its
    offset stays uncommitted, and after a crash the next worker executes it again. (The
    scheduler learns the outcome only from that event; committing before it could lose the
    run for good.) The broker is made to refuse acks with a tiny max.message.bytes while offset
    commits keep working."""
    run, started, finished, gate = gated_run(settings, tmp_path)
    partition = partition_for(run.job_id, settings.partitions)
    run_offset = end_offsets(settings)[partition]
    produce_runs(settings, [run])
    env = {**jobwheel_env, "JOBWHEEL_KAFKA_CONFIG": json.dumps({"session.timeout.ms": 6000})}
    first = start_worker(procs, env, tmp_path / "first.log")
    tail.wait_for(run.run_id, State.STARTED)

    _set_acks_max_message_bytes(settings, 16)
    try:
        wait_until(lambda: _acks_refused(settings, partition), 30, message="acks still accepted")
        gate.touch()
        wait_until(lambda: file_lines(finished), 30, message="the task did not finish")
        # A barrier: a record in another partition that the worker counts as done without an
        # event (undecodable bytes). Once its offset is committed, the worker has committed
        # everything it considered done by then, and that includes the finished run if the
        # run's offset did not wait for its event.
        other = next(
            f"barrier-{i}"
            for i in range(1000)
            if partition_for(f"barrier-{i}", settings.partitions) != partition
        )
        other_partition = partition_for(other, settings.partitions)
        produce_runs(settings, [b"not a run"], key=other)
        barrier_end = end_offsets(settings)[other_partition]
        wait_until(
            lambda: committed_offsets(settings).get(other_partition, -1) >= barrier_end - 1,
            30,
            interval_s=0.3,
            message="the worker did not commit past the barrier",
        )
        assert committed_offsets(settings).get(partition, -1) <= run_offset, (
            "the run's offset was committed before its SUCCEEDED was acknowledged"
        )
        tail.read_to_end()
        assert not tail.of(run.run_id, State.SUCCEEDED)
        stop(first, signal.SIGKILL)
    finally:
        _set_acks_max_message_bytes(settings, None)

    second = start_worker(procs, env, tmp_path / "second.log")
    done = tail.wait_for(run.run_id, State.SUCCEEDED, timeout_s=60)[0]
    assert done.worker.endswith(f":{second.pid}")
    assert file_lines(started) == [f"{run.run_id}:1", f"{run.run_id}:1"]


@pytest.mark.parametrize("task", ["test.gate", "test.gate_async"])
def test_heartbeat_called_by_a_task_reaches_the_acks_topic(
    task: str,
    settings: Any,
    jobwheel_env: dict[str, str],
    procs: Any,
    tail: TopicTail,
    tmp_path: Path,
) -> None:
    """``heartbeat()`` from task code (a worker thread or the event loop) is sent at once. The
    visibility timeout is an hour, so the pool's own beat (every 20 minutes) cannot be the
    one the test sees."""
    gate = tmp_path / "gate"
    hour_ms = 3_600_000
    run = make_run(settings, task, {"gate": str(gate), "beat": True}, visibility_timeout_ms=hour_ms)
    produce_runs(settings, [run])
    start_worker(procs, jobwheel_env, tmp_path / "worker.log")
    (beat,) = tail.wait_for(run.run_id, State.HEARTBEAT)
    assert beat.deadline_ms == beat.event_time_ms + hour_ms
    assert beat.source == "worker" and beat.attempt == 1
    assert not tail.of(run.run_id, State.SUCCEEDED)  # sent while the task still runs
    gate.touch()
    tail.wait_for(run.run_id, State.SUCCEEDED)
    assert len(tail.of(run.run_id, State.HEARTBEAT)) == 1


def test_a_second_worker_shares_the_partitions_and_no_run_is_lost(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    counter = tmp_path / "count.txt"
    first_batch = [
        make_run(settings, "demo.count", {"path": str(counter), "sleep_s": 0.3}) for _ in range(16)
    ]
    produce_runs(settings, first_batch)
    first = start_worker(procs, jobwheel_env, tmp_path / "first.log", "--concurrency", "2")
    tail.wait_for(first_batch[0].run_id, State.STARTED)
    second = start_worker(procs, jobwheel_env, tmp_path / "second.log", "--concurrency", "2")
    wait_until(
        lambda: "partitions assigned" in (tmp_path / "second.log").read_text(),
        30,
        message="the second worker got no partitions",
    )
    second_batch = [make_run(settings, "demo.echo", {"i": i}) for i in range(16)]
    produce_runs(settings, second_batch)

    for run in first_batch + second_batch:
        tail.wait_for(run.run_id, State.SUCCEEDED)
    workers = {e.worker for e in tail.events(state=State.SUCCEEDED)}
    assert workers == {w for w in workers if w} and len(workers) == 2
    assert {w.rsplit(":", 1)[1] for w in workers} == {str(first.pid), str(second.pid)}
    executed = set(counter.read_text().splitlines())
    assert executed == {f"{r.run_id}:1" for r in first_batch}
