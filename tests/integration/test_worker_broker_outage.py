"""A worker told to stop while its broker is unreachable still exits: within its grace period
and a bounded wait for the broker (at once on a second signal), saying in one line what the
broker did not get, and losing nothing: a run it finished but could not acknowledge runs again
on the next worker once the broker is back.

Without a bound the worker hung for good in its final synchronous offset commit (and then in
``Consumer.close()``), which librdkafka retries for as long as the broker is down.

The broker is the test's own (the ``own_broker`` fixture of ``tests/conftest.py``), not the
session's shared one: the tests stop it. Overriding ``kafka_bootstrap`` points the usual
``settings`` / ``jobwheel_env`` fixtures at it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from jobwheel.deploy.broker import LocalBroker
from jobwheel.schemas.models import Run, State
from jobwheel.schemas.partitioning import partition_for
from tests.integration.scheduler_support import (
    TopicTail,
    committed_offsets,
    gated_run,
    log_events,
    make_run,
    produce_runs,
)
from tests.support import file_lines, log_tail, scaled, start_worker, wait_for_log, wait_until

GRACE_MS = 2_000
#: The grace, the worker's wait for the broker (10 s) and a margin for a loaded machine.
EXIT_WITHIN_S = GRACE_MS / 1000 + 15
#: After a second SIGTERM: the worker waits at most 1 s more for the broker.
SECOND_SIGNAL_EXIT_WITHIN_S = 6
GAVE_UP = "could not hand work over to the broker before exiting"


@pytest.fixture
def kafka_bootstrap(own_broker: LocalBroker) -> str:
    return own_broker.bootstrap


def run_one(settings: Any, tail: TopicTail, quick: Run) -> None:
    """Wait until the worker has run ``quick`` and committed its offset: from then on it has
    something to commit at the end (the final commit repeats every watermark)."""
    tail.wait_for(quick.run_id, State.SUCCEEDED)
    partition = partition_for(quick.job_id, settings.partitions)
    wait_until(
        lambda: committed_offsets(settings).get(partition, 0) >= 1,
        30,
        interval_s=0.3,
        message="the quick run's offset was not committed",
    )


def wait_exit(proc: subprocess.Popen[bytes], within_s: float, log_path: Path) -> int:
    try:
        return proc.wait(scaled(within_s))
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"the worker did not exit within {scaled(within_s):.0f}s of SIGTERM with the broker "
            f"down:\n{log_tail(log_path)}"
        )


def quick_then_held(settings: Any, folder: Path) -> tuple[Run, Run, Path, Path, Path]:
    """A quick run and a held one (``gated_run``) on the runs topic, in that order: the quick
    one's verdict shows the worker's producer at work before the test cuts the broker off."""
    held, started, finished, gate = gated_run(settings, folder)
    quick = make_run(settings, "demo.echo", {"n": 1})
    produce_runs(settings, [quick, held])
    return quick, held, started, finished, gate


def frozen_verdict_env(jobwheel_env: dict[str, str]) -> dict[str, str]:
    """JSON logs, and a verdict request that stays in flight through a broker freeze (no
    client-side timeout cuts it short), as a verdict sent just before a broker stalls does."""
    producer = {"message.timeout.ms": 300_000, "request.timeout.ms": 240_000}
    return {
        **jobwheel_env,
        "JOBWHEEL_LOG_FORMAT": "json",
        "JOBWHEEL_WORKER_KAFKA_PRODUCER_CONFIG": json.dumps(producer),
    }


@pytest.mark.timeout(180)
def test_sigterm_while_the_broker_is_down_exits_and_the_unacknowledged_run_runs_again(
    own_broker: LocalBroker,
    settings: Any,
    jobwheel_env: dict[str, str],
    procs: Any,
    tmp_path: Path,
) -> None:
    quick, held, started, finished, gate = quick_then_held(settings, tmp_path)
    # JSON lines (the one line is read as an event). Static membership, as a StatefulSet runs
    # workers: the session outlasts the test's outage, so the worker still owns its partitions
    # (and has offsets to commit) when it is stopped, and the next worker of the same slot
    # takes them over as soon as the broker is back instead of waiting the session out.
    kafka_config = {"group.instance.id": "worker-0", "session.timeout.ms": 45_000}
    env = {
        **jobwheel_env,
        "JOBWHEEL_LOG_FORMAT": "json",
        "JOBWHEEL_KAFKA_CONFIG": json.dumps(kafka_config),
    }
    first_log = tmp_path / "first.log"
    first = start_worker(procs, env, first_log, worker_shutdown_grace_ms=str(GRACE_MS))
    tail = TopicTail(settings, [settings.topics.acks])
    try:
        run_one(settings, tail, quick)
        wait_until(lambda: file_lines(started), 30, message="the held run did not start")

        own_broker.stop()
        gate.touch()  # the run finishes while its verdict cannot reach the broker
        wait_until(lambda: file_lines(finished), 30, message="the held run did not finish")
        os.killpg(first.pid, signal.SIGTERM)
        code = wait_exit(first, EXIT_WITHIN_S, first_log)
        assert code == 1, log_tail(first_log)  # a verdict was left undelivered
        # One line: the verdict it could not deliver, the group it could not leave (its final
        # commit blocked). The quick run's offset was committed before: nothing to report.
        (gave_up,) = log_events(first_log, GAVE_UP)
        assert gave_up["level"] == "error"
        assert gave_up["undelivered_verdicts"] == 1
        assert gave_up["uncommitted_offsets"] == {}
        assert gave_up["left_group"] is False
        assert gave_up["reason"].startswith("broker unreachable"), gave_up
        assert "delivered again to another worker" in gave_up["detail"], gave_up

        own_broker.start()
        second = start_worker(procs, env, tmp_path / "second.log")
        done = tail.wait_for(held.run_id, State.SUCCEEDED, timeout_s=60)[0]
        assert done.worker.endswith(f":{second.pid}"), "the first worker's verdict arrived"
        assert file_lines(started) == [f"{held.run_id}:1", f"{held.run_id}:1"]
    finally:
        tail.close()


@pytest.mark.timeout(120)
def test_a_second_sigterm_exits_at_once_while_the_broker_is_down(
    own_broker: LocalBroker,
    settings: Any,
    jobwheel_env: dict[str, str],
    procs: Any,
    tmp_path: Path,
) -> None:
    """Nothing in flight ("running 0"): the worker only has its final commit and the leave
    left, both blocked with the broker gone. A second SIGTERM ends the wait; nothing was left
    undelivered, so the exit is clean."""
    quick = make_run(settings, "demo.echo", {"n": 1})
    produce_runs(settings, [quick])
    env = {**jobwheel_env, "JOBWHEEL_LOG_FORMAT": "json"}
    log_path = tmp_path / "worker.log"
    worker = start_worker(procs, env, log_path)
    tail = TopicTail(settings, [settings.topics.acks])
    try:
        run_one(settings, tail, quick)
    finally:
        tail.close()

    own_broker.stop()
    os.killpg(worker.pid, signal.SIGTERM)
    wait_for_log(log_path, '"worker stopping"', 30, proc=worker)
    os.killpg(worker.pid, signal.SIGTERM)
    code = wait_exit(worker, SECOND_SIGNAL_EXIT_WITHIN_S, log_path)
    assert code == 0, log_tail(log_path)
    (gave_up,) = log_events(log_path, GAVE_UP)
    assert gave_up["level"] == "warning"
    assert (gave_up["undelivered_verdicts"], gave_up["uncommitted_offsets"]) == (0, {})
    assert gave_up["left_group"] is False
    assert gave_up["reason"].startswith("a second stop signal"), gave_up


@pytest.mark.timeout(300)
def test_a_run_finished_while_the_broker_is_frozen_runs_once_when_its_partition_comes_back(
    own_broker: LocalBroker,
    settings: Any,
    jobwheel_env: dict[str, str],
    procs: Any,
    tmp_path: Path,
) -> None:
    """The broker freezes (SIGSTOP) just as a run finishes: its verdict waits, and the worker's
    session runs out, so its partitions are lost. When the broker wakes, the verdict lands at
    once and the same worker gets the partitions back; no commit of the run got through, so the
    run is fetched again. Its offsets could not say it was done (the verdict came after the
    ownership that ran it was gone), and it ran a second time, with the same attempt: seen on
    the cluster with two of three brokers down (3 runs executed twice, no process died)."""
    held, started, finished, gate = gated_run(settings, tmp_path)
    produce_runs(settings, [held])
    partition = partition_for(held.job_id, settings.partitions)
    env = frozen_verdict_env(jobwheel_env)
    log_path = tmp_path / "worker.log"
    worker = start_worker(procs, env, log_path)
    tail = TopicTail(settings, [settings.topics.acks])
    try:
        wait_until(lambda: file_lines(started), 60, message="the held run did not start")
        pid = own_broker.running_pid()
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            gate.touch()  # the run finishes while the broker cannot take its verdict
            wait_until(lambda: file_lines(finished), 30, message="the held run did not finish")
            # The session runs out on the worker's side (no coordinator answers).
            wait_for_log(log_path, '"partitions lost"', 120, proc=worker)
        finally:
            os.kill(pid, signal.SIGCONT)
        tail.wait_for(held.run_id, State.SUCCEEDED, timeout_s=60)
        wait_until(
            lambda: len(log_events(log_path, "partitions assigned")) >= 2,
            60,
            message="the worker never got its partitions back",
        )
        # The known end: once the worker's commit is past the run's record, nothing of this
        # group fetches it again; every execution it caused has happened by then.
        wait_until(
            lambda: committed_offsets(settings).get(partition, -1) > 0,
            60,
            interval_s=0.3,
            message="the run's offset was never committed",
        )
        tail.read_to_end()
        assert worker.poll() is None, log_tail(log_path)
        assert len(tail.of(held.run_id, State.SUCCEEDED)) == 1
        assert file_lines(started) == [f"{held.run_id}:1"], "the run was executed again"
    finally:
        tail.close()


@pytest.mark.timeout(300)
def test_a_run_finished_while_the_broker_is_frozen_is_not_run_again_by_another_worker(
    own_broker: LocalBroker,
    settings: Any,
    jobwheel_env: dict[str, str],
    procs: Any,
    tmp_path: Path,
) -> None:
    """As above, but the partitions go to another worker, the first one still alive: it is
    paused (SIGSTOP) from its lost session until the second one has taken the partition. The
    first worker's commits could not name the run (its verdict came during the freeze), so the
    second fetches it again from the committed offset; it reads the acks given since that
    commit and finds the verdict there, and does not run it again. Before, it ran it again:
    seen by hand, 3 of 3,000 runs started twice across broker freezes with two live workers."""
    quick, held, started, finished, gate = quick_then_held(settings, tmp_path)
    partition = partition_for(held.job_id, settings.partitions)
    # The held run's offset: behind the quick one when both went to the same partition.
    held_offset = int(partition_for(quick.job_id, settings.partitions) == partition)
    env = frozen_verdict_env(jobwheel_env)
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = start_worker(procs, env, first_log)
    tail = TopicTail(settings, [settings.topics.acks])
    try:
        # A verdict delivered: the first worker's producer is set up (its producer id got)
        # before the broker freezes, or the held run's verdict could not be sent before it.
        tail.wait_for(quick.run_id, State.SUCCEEDED, timeout_s=60)
        wait_until(lambda: file_lines(started), 60, message="the held run did not start")
        # The first worker's commit with the run started: the offset the second one gets.
        wait_until(
            lambda: committed_offsets(settings).get(partition, -1) >= held_offset,
            60,
            interval_s=0.3,
            message="the first worker committed nothing on the run's partition",
        )
        pid = own_broker.running_pid()
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            gate.touch()  # the run finishes while the broker cannot take its verdict
            wait_until(lambda: file_lines(finished), 30, message="the held run did not finish")
            wait_for_log(first_log, '"partitions lost"', 120, proc=first)
            os.kill(first.pid, signal.SIGSTOP)  # alive, but it cannot rejoin for now
        finally:
            os.kill(pid, signal.SIGCONT)
        try:
            # The verdict was on its way before the freeze ended: the broker has it now.
            (verdict,) = tail.wait_for(held.run_id, State.SUCCEEDED, timeout_s=60)
            assert verdict.worker.endswith(f":{first.pid}")
            # The first worker's commit past the run, sent into the freeze, can be accepted
            # when the broker wakes (before the broker expires its session): the second worker
            # then starts past the run and has nothing to decide. Seen once in a full run;
            # the run must still run once, and the acks lookup is checked when it applies.
            # Both went into the freeze together and are handled as it ends: a second after
            # the verdict is seen, the commit has been taken or refused.
            time.sleep(scaled(1))
            late_commit = committed_offsets(settings).get(partition, -1) > held_offset
            second = start_worker(procs, env, second_log)
            # The known end: the second worker owns the partition and the group's offset is
            # past the run's record (the second fetched it and is done with it, by running it
            # or not; or the first's late commit put it there).
            wait_until(
                lambda: (
                    committed_offsets(settings).get(partition, -1) > held_offset
                    and any(
                        partition in e["partitions"]
                        for e in log_events(second_log, "partitions assigned")
                    )
                ),
                90,
                interval_s=0.3,
                message="the second worker never took the partition and committed past the run",
            )
        finally:
            os.kill(first.pid, signal.SIGCONT)
        tail.read_to_end()
        assert first.poll() is None and second.poll() is None
        assert file_lines(started) == [f"{held.run_id}:1"], "the run was executed again"
        assert len(tail.of(held.run_id, State.SUCCEEDED)) == 1
        if not late_commit:
            (lookup,) = log_events(second_log, "acks since the previous owners' last commits read")
            assert partition in lookup["partitions"] and lookup["runs_decided"] >= 1, lookup
    finally:
        tail.close()
