"""Ownership changes on the real broker: a restore from the changelog on an empty disk, SIGKILL
failover between two schedulers, and a SIGSTOPped owner that wakes up after a takeover (its
transactions are refused: nothing it does afterwards becomes visible)."""

from __future__ import annotations

import json
import os
import signal
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from jobwheel.deploy.broker import free_port
from jobwheel.producers.client import JobClient, JobSpec
from jobwheel.schemas.models import State
from jobwheel.schemas.partitioning import partition_for
from jobwheel.streams.metrics import PREFIX
from tests.integration.scheduler_support import (
    RESET,
    log_events,
    now_ms,
    ready_partitions,
    start_scheduler,
    wait_owns_all,
)
from tests.support import log_tail, metric, scaled, stop, wait_until

#: Long enough that no run is re-dispatched by its visibility timeout during a test (there are
#: no workers): every second dispatch seen is then a duplicate, not a retry.
NO_REDELIVERY = timedelta(minutes=10)


def at_jobs(prefix: str, first_ms: int, count: int, spread_ms: int) -> list[JobSpec]:
    step = spread_ms / max(1, count - 1)
    return [
        JobSpec(
            job_id=f"{prefix}-{i}",
            task="demo.echo",
            at=datetime.fromtimestamp((first_ms + int(i * step)) / 1000, UTC),
            visibility_timeout=NO_REDELIVERY,
        )
        for i in range(count)
    ]


def test_a_restart_on_its_own_disk_reads_only_what_its_checkpoint_lacks(
    settings, jobwheel_env, procs, tmp_path, tail
):
    """The checkpoint each transaction writes beside the state is the changelog's end: a
    scheduler that stopped cleanly and starts again on the same disk reads no changelog
    record, and still has every pending job (they fire). Were the checkpoint behind, the
    restart would read the records again; were it ahead, the state would not fit the
    changelog and be wiped, and rebuilt from all of it."""
    data_dir = tmp_path / "own"
    first = start_scheduler(procs, jobwheel_env, data_dir, log_name="first")
    due = now_ms() + int(scaled(12_000))  # the stop must come first: on the time scale
    with JobClient(settings) as client:
        job_ids = client.schedule_many(at_jobs("warm", due, 60, 2000))
        # Changed again in later transactions: a partition's checkpoint is its last record's.
        client.schedule_many(at_jobs("warm", due, 30, 2000))
    tail.wait(
        lambda: len(tail.events(state=State.SCHEDULED)) >= 90, 30, "jobs were not all SCHEDULED"
    )
    assert stop(first, signal.SIGTERM, 30) == 0
    tail.read_to_end()  # after the SCHEDULED events it saw: everything the first one wrote
    assert tail.all_runs() == []

    again = start_scheduler(procs, jobwheel_env, data_dir, log_name="again")
    ready = wait_owns_all(again, settings.partitions)
    assert sum(e["restored_records"] for e in ready.values()) == 0, ready
    tail.wait(lambda: all(tail.runs_of(j) for j in job_ids), 60, "not every pending job fired")
    assert tail.duplicate_dispatches() == {}


def test_a_new_owner_on_an_empty_disk_restores_pending_jobs_from_the_changelog(
    settings, jobwheel_env, procs, tmp_path, tail
):
    first = start_scheduler(procs, jobwheel_env, tmp_path / "s1")
    due = now_ms() + int(scaled(15_000))  # the stop must come first: on the time scale
    with JobClient(settings) as client:
        job_ids = client.schedule_many(at_jobs("restore", due, 20, 3000))
    tail.wait(
        lambda: len(tail.events(state=State.SCHEDULED)) >= 20, 30, "jobs were not all SCHEDULED"
    )
    assert stop(first, signal.SIGTERM, 30) == 0
    # The first scheduler fired nothing: whatever fires now was restored by the second.
    tail.read_to_end()  # after the SCHEDULED events it saw: everything the first one wrote
    assert tail.all_runs() == []

    second = start_scheduler(procs, jobwheel_env, tmp_path / "s2")  # an empty data dir
    ready = wait_owns_all(second, settings.partitions)
    assert sum(e["restored_records"] for e in ready.values()) >= 20
    tail.wait(lambda: all(tail.runs_of(j) for j in job_ids), 60, "not every pending job fired")
    for job in job_ids:
        [run] = tail.runs_of(job)
        assert run.dispatched_at_ms >= run.scheduled_time_ms
        assert run.fencing_token == 2  # the second claim of the partition


def test_sigkill_one_of_two_schedulers_loses_no_job_and_dispatches_each_once(
    settings, jobwheel_env, procs, tmp_path, tail, figure
):
    a, b = start_two(procs, jobwheel_env, tmp_path)
    start = now_ms() + 3000
    with JobClient(settings) as client:
        job_ids = client.schedule_many(at_jobs("kill", start, 500, 20_000))
    wait_until(lambda: len(tail.all_runs()) >= 100, 30, 0.2, "nothing fired")
    killed_at = now_ms()
    os.kill(b.pid, signal.SIGKILL)
    b.wait(scaled(10))

    tail.wait(
        lambda: all(tail.runs_of(j) for j in job_ids),
        90,
        "some jobs never fired after the SIGKILL",
    )
    assert tail.duplicate_dispatches() == {}
    runs_by_job = defaultdict(list)
    for run in tail.all_runs():
        runs_by_job[run.job_id].append(run)
    assert all(len(runs_by_job[j]) == 1 for j in job_ids)
    after = [r for r in tail.all_runs() if r.dispatched_at_ms > killed_at]
    assert after, "nothing fired after the kill"
    late = max(r.dispatched_at_ms - r.scheduled_time_ms for r in tail.all_runs())
    figure(
        f"[failover] 500 jobs, 1 of 2 schedulers SIGKILLed: every job fired once; "
        f"max lateness {late} ms (includes the session timeout)"
    )


def start_two(procs: Any, env: dict[str, str], tmp_path: Path) -> tuple[Any, Any]:
    """Two schedulers, "a" and "b", once both own partitions (the rebalance that b's join
    caused has settled)."""
    a = start_scheduler(procs, env, tmp_path / "a")
    b = start_scheduler(procs, env, tmp_path / "b")
    wait_until(
        lambda: owned(a.log_path) and owned(b.log_path),
        40,
        0.2,
        "the two schedulers never shared the partitions",
    )
    return a, b


def owned(log_path: Path) -> set[int]:
    """The partitions a scheduler owns now, by its log: made ready, less those revoked or
    lost since."""
    held: set[int] = set()
    for line in log_path.read_text(errors="replace").splitlines():
        if '"msg": "partition ready"' in line:
            held.add(json.loads(line)["partition"])
        elif '"msg": "partition revoked"' in line or '"msg": "partition lost"' in line:
            held -= set(json.loads(line)["partitions"])
    return held


@pytest.mark.parametrize(
    ("protocol", "standby", "sig"),
    [
        ("consumer", True, signal.SIGTERM),
        ("consumer", False, signal.SIGTERM),
        ("classic", True, signal.SIGKILL),
        ("classic-static", True, signal.SIGKILL),
    ],
    ids=["standby", "no-standby", "classic-sigkill", "classic-static-sigkill"],
)
def test_a_takeover_restores_only_the_tail_from_a_standby_copy(
    settings, jobwheel_env, procs, tmp_path, tail, protocol, standby, sig
):
    """A scheduler keeps a warm copy of each partition it does not own
    (JOBWHEEL_SCHEDULER_STANDBY): when the owner stops, the partitions it took over come from
    those copies (``from_standby``) and only the changelog records the copy had not read yet
    are restored, not the partition's whole changelog. With standbys off the same takeover
    restores every record from the start. Either way every job still fires once.

    The owner is stopped with SIGTERM, not SIGKILL: the handover is then immediate (no session
    timeout to wait out, which the SIGKILL failover test already pays), and what is measured
    here, where the new owner's state comes from, is the same.

    The classic group protocol (JOBWHEEL_SCHEDULER_GROUP_PROTOCOL=classic, cooperative-sticky)
    is run here once, with a SIGKILL: the takeover after a session timeout, on the standby
    copies, each job once; and once more with static members, which assign eagerly
    (``range``: every partition revoked and assigned again in each rebalance). The only
    failover tests on classic: the crash-loop (40 s) and
    the SIGSTOPped-owner (60 s) tests twice over would add about 100 s to a suite held to
    30 minutes and at 25.5; this one adds about 20."""
    static = protocol == "classic-static"
    protocol = "classic" if static else protocol
    extra = {
        "JOBWHEEL_SCHEDULER_STANDBY": "true" if standby else "false",
        "JOBWHEEL_SCHEDULER_GROUP_PROTOCOL": protocol,
        "JOBWHEEL_SCHEDULER_STATIC_MEMBERSHIP": "true" if static else "false",
    }
    # Started side by side (each start costs seconds of imports); both own partitions once
    # the group has settled with the two of them.
    a = start_scheduler(procs, jobwheel_env, tmp_path / "a", wait=False, extra_env=extra)
    b_metrics = f"http://127.0.0.1:{(port := free_port())}"
    b = start_scheduler(
        procs,
        jobwheel_env,
        tmp_path / "b",
        wait=False,
        extra_env={**extra, "JOBWHEEL_METRICS_PORT": str(port)},
    )
    wait_until(
        lambda: (
            (held := (owned(a.log_path), owned(b.log_path)))[0]
            and held[1]
            and held[0] | held[1] == set(range(settings.partitions))
        ),
        scaled(60),
        0.2,
        f"the two schedulers never shared the partitions:\n{log_tail(a.log_path)}\n"
        f"{log_tail(b.log_path)}",
    )
    # After the handover (a SIGKILL's waits out the session timeout), on the time scale.
    due = now_ms() + int(scaled(5_000 if sig == signal.SIGTERM else 12_000))
    started = log_events(b.log_path, "scheduler started")
    assert [(e["protocol"], e["static_member"]) for e in started] == [(protocol, static)]
    read_before = metric(b_metrics, f"{PREFIX}restored_records_total")
    with JobClient(settings) as client:
        job_ids = client.schedule_many(at_jobs("standby", due, 40, 1000))
    tail.wait(
        lambda: len(tail.events(state=State.SCHEDULED)) >= 40, 30, "jobs were not all SCHEDULED"
    )
    if standby:
        # The owner is stopped once the copies have read its jobs' records (one each): what
        # is measured is where the takeover starts from, not how soon a copy reads. Stopped
        # at once, a loaded host once had the copies read none (25 records left, 17 jobs).
        on_a = sum(partition_for(j, settings.partitions) in owned(a.log_path) for j in job_ids)
        wait_until(
            lambda: metric(b_metrics, f"{PREFIX}restored_records_total") - read_before >= on_a,
            scaled(30),
            0.1,
            f"the standby copies never read the {on_a} job records of the owner's partitions",
        )
    assignments_before = len(log_events(b.log_path, "partitions assigned; restoring"))
    assert stop(a, sig, scaled(30)) == (0 if sig == signal.SIGTERM else -signal.SIGKILL)

    wait_until(
        lambda: owned(b.log_path) == set(range(settings.partitions)),
        scaled(60),
        0.2,
        f"the second scheduler did not take every partition over:\n{log_tail(b.log_path)}",
    )
    taken = log_events(b.log_path, "partitions assigned; restoring")[assignments_before:]
    taken_over = sorted({p for e in taken for p in e["partitions"]})
    assert taken_over, "the second scheduler took no partition over"
    # What a copy made from nothing would restore: every job's record at least.
    jobs_there = sum(partition_for(j, settings.partitions) in taken_over for j in job_ids)
    assert jobs_there > 0
    # The claim's restore: from its local state's checkpoint to the changelog's end.
    measured = {e["partition"]: e for e in log_events(b.log_path, "changelog measured")}
    to_restore = sum(measured[p]["end"] - measured[p]["restore_from"] for p in taken_over)
    if standby:
        assert sorted(p for e in taken for p in e["from_standby"]) == taken_over
        assert to_restore < jobs_there, (to_restore, jobs_there, measured)
    else:
        assert [p for e in taken for p in e["from_standby"]] == []
        ready = ready_partitions(b.log_path)
        restored = sum(ready[p]["restored_records"] for p in taken_over)
        assert to_restore >= restored >= jobs_there, (to_restore, restored, jobs_there)

    tail.wait(lambda: all(tail.runs_of(j) for j in job_ids), 60, "not every job fired")
    assert tail.duplicate_dispatches() == {}


def stop_between_poll_and_commit(pid: int) -> None:
    """SIGSTOP a scheduler run with ``JOBWHEEL_SCHEDULER_FAULT_DELAY_MS`` while it sleeps in
    that hook, between a poll and its commit: the only sleep in ``clock_nanosleep`` (wchan
    ``hrtimer_nanosleep``) its process has; the sleep lasts seconds, the check microseconds."""
    wchan = Path(f"/proc/{pid}/wchan")
    wait_until(
        lambda: "nanosleep" in wchan.read_text(),
        30,
        0.005,
        f"the scheduler never slept in its fault hook (wchan {wchan.read_text()!r})",
    )
    os.kill(pid, signal.SIGSTOP)


def test_a_sigstopped_owner_that_wakes_up_after_a_takeover_changes_nothing(
    settings, jobwheel_env, procs, tmp_path, tail, figure
):
    # The stale owner sleeps between each poll and the commit that follows it (the fault hook
    # of the lagging-scheduler test), and is stopped inside that sleep: when it wakes it fires
    # the due jobs and commits before it polls again, so it cannot have learnt of the takeover
    # from its consumer, and only the broker's fence (the group generation sent with the
    # offsets in the transaction) can refuse it.
    stale_metrics = free_port()
    stale = start_scheduler(
        procs,
        jobwheel_env,
        tmp_path / "stale",
        extra_env={
            "JOBWHEEL_SCHEDULER_FAULT_DELAY_MS": "1500",
            "JOBWHEEL_METRICS_PORT": str(stale_metrics),
        },
    )
    due = now_ms() + int(scaled(8000))  # after the takeover: on the time scale
    with JobClient(settings) as client:
        job_ids = client.schedule_many(at_jobs("fence", due, 60, 30_000))
    tail.wait(lambda: len(tail.events(state=State.SCHEDULED)) >= 60, 30, "jobs not SCHEDULED")
    stop_between_poll_and_commit(stale.pid)
    try:
        fresh = start_scheduler(procs, jobwheel_env, tmp_path / "fresh")
        tail.wait(lambda: tail.all_runs(), 60, "the new owner never fired")
    finally:
        # The stale owner wakes up with jobs due that it believes are its own.
        os.kill(stale.pid, signal.SIGCONT)
    tail.wait(lambda: all(tail.runs_of(j) for j in job_ids), 90, "not every job fired")
    # The woken owner tried to commit what it fired and the broker refused it.
    wait_until(
        lambda: (
            log_events(stale.log_path, "transaction aborted; processing the batch again")
            or log_events(stale.log_path, RESET)
        ),
        30,
        0.5,
        f"the stale owner's commit was never refused:\n{log_tail(stale.log_path)}",
    )
    # ... and its metrics say so: the counters the resets alert and the dashboards read.
    base = f"http://127.0.0.1:{stale_metrics}"
    # (Read after the log lines: a counter is raised before its line is written.)
    aborted = log_events(stale.log_path, "transaction aborted; processing the batch again")
    reset = log_events(stale.log_path, RESET)
    aborts = metric(base, "jobwheel_scheduler_transaction_aborts_total")
    resets = metric(base, "jobwheel_scheduler_resets_total")
    assert aborts >= len(aborted) and resets >= len(reset) and aborts + resets >= 1

    # Nothing the stale owner did after the takeover is visible: it had fired nothing before
    # it was stopped, so no run with its fencing token (1) may exist at all, and every job
    # fired exactly once, with one DISPATCHED event.
    tail.read_to_end()  # after every job's run: up to the ends as of now
    assert [r for r in tail.all_runs() if r.fencing_token == 1] == []
    assert tail.duplicate_dispatches() == {}
    for job in job_ids:
        assert len(tail.runs_of(job)) == 1
        assert len(tail.events(job, State.DISPATCHED)) == 1

    # Nor did it change the state: a third scheduler on an empty disk restores the changelog
    # and fires none of these jobs again (it does fire a new one: it is working).
    stop(stale, signal.SIGKILL)
    stop(fresh, signal.SIGTERM, 30)
    third = start_scheduler(procs, jobwheel_env, tmp_path / "third")
    ready = wait_owns_all(third, settings.partitions)
    assert sum(e["restored_records"] for e in ready.values()) >= 60
    with JobClient(settings) as client:
        probe = client.schedule("fence-probe", task="demo.echo", now=True)
    tail.wait(lambda: tail.runs_of(probe), 30, "the restored scheduler does not fire")
    assert tail.duplicate_dispatches() == {}
    assert all(len(tail.runs_of(j)) == 1 for j in job_ids)
    tokens = sorted({r.fencing_token for r in tail.all_runs()})
    figure(f"[zombie] fencing tokens seen: {tokens}; stale owner's runs visible: 0")


def test_a_fenced_producer_is_replaced_and_no_partition_moves(
    settings, jobwheel_env, procs, tmp_path, tail, figure
):
    """A scheduler whose transactional producer is fenced (here by a producer of the test with
    its transactional id, as a zombie of itself would be) makes a new producer and claims its
    own partitions again; it stays in the group, so no partition moves to the other scheduler
    and back, and every job fires once."""
    a, b = start_two(procs, jobwheel_env, tmp_path)
    start = now_ms() + 2000
    with JobClient(settings) as client:
        job_ids = client.schedule_many(at_jobs("fenced", start, 300, 15_000))
    wait_until(lambda: len(tail.all_runs()) >= 50, 30, 0.2, "nothing fired")

    def holdings() -> tuple[dict[str, set[int]], dict[str, int]]:
        """Each scheduler's partitions, and how many claims (rebalances) it logged."""
        both = (("a", a), ("b", b))
        return (
            {n: owned(p.log_path) for n, p in both},
            {n: len(log_events(p.log_path, "partitions assigned; restoring")) for n, p in both},
        )

    held, claims = holdings()
    instance = log_events(a.log_path, "scheduler started")[0]["instance"]
    zombie = Producer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "transactional.id": f"{settings.scheduler_app_id}-{instance}",
        }
    )
    zombie.init_transactions(scaled(30))  # a's producer is fenced from here on
    fenced_at = now_ms()
    wait_until(
        lambda: log_events(a.log_path, RESET),
        30,
        0.2,
        f"the fenced scheduler never noticed:\n{log_tail(a.log_path)}",
    )
    tail.wait(lambda: all(tail.runs_of(j) for j in job_ids), 90, "some jobs never fired")
    assert tail.duplicate_dispatches() == {}
    assert sorted(r.job_id for r in tail.all_runs()) == sorted(job_ids)
    # Fenced once, or more: the zombie's first InitProducerId can meet a's open transaction,
    # which the coordinator aborts (a is fenced) while it answers CONCURRENT_TRANSACTIONS; the
    # zombie's retry then fences the producer a has made since (seen once in CI). Each fence is
    # one reset that keeps a's membership and partitions, and none comes once the zombie's
    # init has returned (a reset loop of a's own would go on while the jobs fire).
    reset = log_events(a.log_path, RESET)
    assert reset and all(not e["rejoin"] and set(e["partitions"]) == held["a"] for e in reset), (
        reset
    )
    noticed_by = fenced_at + scaled(3_000)
    assert [e for e in reset if e["ts"] * 1000 > noticed_by] == [], (fenced_at, reset)
    assert max(r.dispatched_at_ms for r in tail.all_runs()) > noticed_by  # jobs fired past it
    held_after, claims_after = holdings()
    assert held_after == held
    assert claims_after == claims, "a partition moved between the schedulers"
    after = [r for r in tail.all_runs() if r.dispatched_at_ms > fenced_at]
    assert {r.partition for r in after} >= held["a"], "a fenced partition never fired again"
    late = max(r.dispatched_at_ms - r.scheduled_time_ms for r in after)
    figure(
        f"[fenced] 300 jobs, one of two schedulers' producer fenced: every job fired once, "
        f"no partition moved; max lateness after the fence {late} ms"
    )
