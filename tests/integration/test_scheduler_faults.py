"""The scheduler engine under real faults: a SIGKILL crash loop, a scheduler that lags behind
its acknowledgements, and poison records on its inputs. Real broker, real processes, real
signals; what is asserted is what a consumer of the topics sees."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from confluent_kafka import Producer

from jobwheel.producers.client import JobClient, JobSpec
from jobwheel.schemas.codec import default_codec
from jobwheel.schemas.deadletter import REPLAYED_FROM_HEADER
from jobwheel.schemas.models import State, StatusEvent
from jobwheel.schemas.partitioning import key_for, partition_for
from jobwheel.schemas.topics import DISPATCHED_HEADER, STATE_HEADER
from tests.integration.scheduler_support import (
    log_events,
    now_ms,
    start_scheduler,
    wait_owns_all,
)
from tests.support import DEMO_TASKS, scaled, start_worker, wait_for_group, wait_until

CODEC = default_codec()


@pytest.mark.timeout(420)
def test_crash_loop_loses_nothing_and_dispatches_each_run_once(
    settings, jobwheel_env, procs, tmp_path, tail, figure
):
    """300 recurring jobs (every 1 s) and 2,000 one-off jobs; the scheduler is SIGKILLed 12
    times while at work, and restarted at once on the same disk."""
    start_worker(procs, jobwheel_env, tmp_path / "worker.log", tasks=DEMO_TASKS)
    scheduler = start_scheduler(procs, jobwheel_env, tmp_path / "s", log_name="s-0")
    start = now_ms() + 2000
    recurring = [
        JobSpec(job_id=f"every-{i}", task="demo.echo", every=timedelta(seconds=1))
        for i in range(300)
    ]
    one_off = [
        JobSpec(
            job_id=f"once-{i}",
            task="demo.echo",
            at=datetime.fromtimestamp((start + i * 20) / 1000, UTC),  # over 40 s
        )
        for i in range(2000)
    ]
    with JobClient(settings) as client:
        client.schedule_many(recurring)
        client.schedule_many(one_off)

    rng = random.Random(7)
    for kill in range(1, 13):
        # Each kill lands on a scheduler at work, at a point of its own: once it has made a
        # partition ready, after a random number of further runs (20 to 400: a few tenths of
        # a second to about a second at the jobs' rate). A sleep of 2 to 5 s chose the point
        # by the clock, and on a loaded host could kill a process still importing.
        wait_until(
            lambda s=scheduler: log_events(s.log_path, "partition ready"),
            scaled(60),
            0.05,
            f"scheduler {kill - 1} never made a partition ready",
        )
        target = len(tail.all_runs()) + rng.randint(20, 400)
        wait_until(
            lambda t=target: len(tail.all_runs()) >= t,
            scaled(30),
            0.02,
            f"scheduler {kill - 1} dispatched too few runs to be killed at work",
        )
        os.kill(scheduler.pid, signal.SIGKILL)
        scheduler.wait(scaled(10))
        scheduler = start_scheduler(
            procs, jobwheel_env, tmp_path / "s", log_name=f"s-{kill}", wait=False
        )
    last_restart = now_ms()

    # Every recurring job fires again soon after the last restart.
    def fired_after_restart() -> set[str]:
        return {r.job_id for r in tail.all_runs() if r.scheduled_time_ms >= last_restart}

    wait_until(
        lambda: len(fired_after_restart() & {s.job_id for s in recurring}) == 300,
        20,
        0.5,
        "not every recurring job fired again after the last restart",
    )
    recurring_lag_ms = now_ms() - last_restart
    # Every one-off job ran, and every job whose run SUCCEEDED reached COMPLETED.
    once_ids = {s.job_id for s in one_off}
    wait_until(
        lambda: once_ids <= {e.job_id for e in tail.events(state=State.SUCCEEDED)},
        120,
        0.5,
        "some one-off jobs never ran",
    )
    wait_until(
        lambda: once_ids <= {e.job_id for e in tail.events(state=State.COMPLETED)},
        60,
        0.5,
        "some one-off jobs SUCCEEDED but never became COMPLETED",
    )
    # Exactly-once dispatch: no committed run record twice with the same run id and attempt.
    assert tail.duplicate_dispatches() == {}
    executions = Counter(e.run_id for e in tail.events(state=State.STARTED))
    figure(
        f"[crash loop] 12 SIGKILLs: 2000/2000 one-off jobs COMPLETED, every recurring job "
        f"fired again {recurring_lag_ms} ms after the last restart; duplicate dispatches: 0; "
        f"runs executed twice (redelivered after a kill): "
        f"{sum(1 for n in executions.values() if n > 1)}"
    )


def test_a_deadline_waits_for_acks_the_broker_holds_back_from_the_scheduler(
    settings, jobwheel_env, procs, tmp_path, tail
):
    """The scheduler's fetches are held at the broker for up to 3 s (a large fetch.min.bytes)
    and return one record batch per partition (max.partition.fetch.bytes 1), while the worker
    sends each ack in a batch of its own and visibility timeouts are 1 s: each run's SUCCEEDED
    is on the acks topic within its deadline, but the scheduler reads a partition's acks one
    per 3 s, long after the deadlines by its own clock, with nothing to read meanwhile. Only
    the rule that a deadline expires past the broker time of the acks read (not the time they
    were read, nor the scheduler's clock alone) holds every run to one dispatch: read at 3 s,
    the first ack would expire the runs whose acks wait behind it."""
    start_worker(
        procs,
        {
            **jobwheel_env,
            "JOBWHEEL_WORKER_KAFKA_PRODUCER_CONFIG": json.dumps(
                {"linger.ms": 0, "batch.num.messages": 1}
            ),
        },
        tmp_path / "worker.log",
        tasks=DEMO_TASKS,
    )
    held = {
        "fetch.min.bytes": 50_000_000,
        "fetch.wait.max.ms": 3000,
        "max.partition.fetch.bytes": 1,
    }
    start_scheduler(
        procs,
        jobwheel_env,
        tmp_path / "held",
        extra_env={"JOBWHEEL_SCHEDULER_KAFKA_CONSUMER_CONFIG": json.dumps(held)},
    )
    # The deadlines are 1 s from dispatch: a worker still joining its group would answer
    # after them, and the check below would blame the worker for its own start.
    wait_for_group(settings, settings.worker_group, settings.topics.runs)
    with JobClient(settings) as client:
        jobs = client.schedule_many(
            [
                JobSpec(
                    job_id=f"held-{i}",
                    task="demo.echo",
                    now=True,
                    visibility_timeout=timedelta(seconds=1),
                )
                for i in range(16)
            ]
        )
    completed = tail.wait(
        lambda: (
            set(jobs) <= {e.job_id for e in tail.events(state=State.COMPLETED)}
            and tail.events(state=State.COMPLETED)
        ),
        120,
        "not every job COMPLETED",
    )
    first = {r.job_id: r for r in tail.all_runs() if r.attempt == 1}
    verdicts = {e.job_id: e for e in tail.events(state=State.SUCCEEDED) if e.job_id in jobs}
    assert all(verdicts[j].event_time_ms <= first[j].deadline_ms for j in jobs), (
        "a verdict came after its deadline: the worker, not the scheduler, was slow"
    )
    # The scheduler handled (COMPLETED) most verdicts after the run's deadline by its clock.
    read_late = [
        e for e in completed if e.job_id in jobs and e.event_time_ms > first[e.job_id].deadline_ms
    ]
    assert len(read_late) >= len(jobs) // 2, "the scheduler read the acks in time: no lag"
    tail.read_to_end()  # after every job's COMPLETED: a second attempt would be read by now
    assert [r for r in tail.all_runs() if r.attempt > 1] == []
    assert all(len(tail.runs_of(j)) == 1 for j in jobs)


def test_poison_records_on_requests_and_acks_are_dead_lettered_and_the_partition_works_on(
    settings, jobwheel_env, procs, tmp_path, tail
):
    start_worker(procs, jobwheel_env, tmp_path / "worker.log", tasks=DEMO_TASKS)
    scheduler = start_scheduler(procs, jobwheel_env, tmp_path / "s")
    t = settings.topics
    victim = "poisoned"
    p = partition_for(victim, settings.partitions)
    producer = Producer(
        settings.librdkafka(**{"message.max.bytes": 1_040_000, "partitioner": "murmur2_random"})
    )
    big = random.Random(1).randbytes(1_000_000)
    for topic in (t.requests, t.acks):
        producer.produce(topic, key=key_for(victim), value=big)  # ~1 MB of garbage
        producer.produce(topic, key=key_for(victim), value=b"\x00\xffnot a record")
        producer.produce(topic, key=None, value=b"no key, no sense", partition=p)
    assert producer.flush(30) == 0

    # The poisoned partition keeps working: a job on it runs and completes.
    with JobClient(settings) as client:
        good = client.schedule(victim, task="demo.echo", now=True)
    tail.wait(lambda: tail.events(good, State.COMPLETED), 60, "the partition stopped working")
    dead = tail.wait(
        lambda: len(tail.dead_letters()) >= 6 and tail.dead_letters(),
        30,
        "not every poison record was dead-lettered",
    )
    headers = [dict(m.headers() or []) for m in dead]
    sources = Counter(h.get("jobwheel.source.topic", b"").decode() for h in headers)
    assert sources == {t.requests: 3, t.acks: 3}
    too_large = [(m, h) for m, h in zip(dead, headers, strict=True) if h.get("jobwheel.kind")]
    assert len(too_large) == 2  # the 1 MB records: a reference, not a copy
    for message, h in too_large:
        assert h["jobwheel.kind"] == b"too-large" and h["jobwheel.size"] == b"1000000"
        assert message.value() is None
        assert h["jobwheel.error"]
    assert b"\x00\xffnot a record" in {m.value() for m in dead}
    rejected = tail.events(state=State.REJECTED)
    assert len(rejected) == 3 and all(e.reason for e in rejected)
    assert scheduler.poll() is None
    assert not log_events(scheduler.log_path, "transaction aborted; processing the batch again")


def test_hostile_acks_and_headers_are_dead_lettered_or_ignored_and_the_partition_works_on(
    settings, jobwheel_env, procs, tmp_path, tail
):
    """Anything on the acks topic is input. An ack whose header has no value (None) crashed
    the scheduler on ``None.isdigit()``, and again on every restart (nothing past it was ever
    committed); a SUCCEEDED naming attempt -7 completed a run still running. Now: headers no
    worker writes are ignored with a log line, a record that is no ack and an ack naming an
    impossible attempt are dead-lettered, the run still running finishes on its own verdict,
    and the partition goes on."""
    # tests.tasks: the victim's run blocks on a gate, so it is still running for as long as
    # the test needs, whatever the load.
    start_worker(procs, jobwheel_env, tmp_path / "worker.log")
    scheduler = start_scheduler(procs, jobwheel_env, tmp_path / "s")
    t = settings.topics
    gate = tmp_path / "victim-gate"
    victim = "hostile-acks"
    p = partition_for(victim, settings.partitions)
    neighbour = next(
        j for i in range(10_000) if partition_for(j := f"neighbour-{i}", settings.partitions) == p
    )
    with JobClient(settings) as client:
        client.schedule(victim, task="test.gate", args={"gate": str(gate)}, now=True)
    tail.wait(lambda: tail.events(victim, State.STARTED), 60, "the victim's run did not start")
    [run] = tail.runs_of(victim)

    producer = Producer(settings.librdkafka(partitioner="murmur2_random"))
    forged = StatusEvent(
        event_id="forged",
        job_id=victim,
        state=State.SUCCEEDED,
        event_time_ms=now_ms(),
        source="worker",
        seq=run.seq + 1,
        run_id=run.run_id,
        attempt=-7,
    )
    hostile = [
        (t.acks, b"nulhdr", b"x", [(DISPATCHED_HEADER, None)]),
        (t.acks, b"nulstate", b"x", [(STATE_HEADER, None), (DISPATCHED_HEADER, b"\xff\xfe")]),
        (t.acks, key_for(victim), CODEC.encode(forged), [(DISPATCHED_HEADER, None)]),
        (t.requests, b"nulreplay", b"junk", [(REPLAYED_FROM_HEADER, None)]),
    ]
    for topic, key, value, headers in hostile:
        producer.produce(topic, key=key, value=value, headers=headers, partition=p)
    assert producer.flush(30) == 0

    dead = tail.wait(
        lambda: len(tail.dead_letters()) >= 4 and tail.dead_letters(),
        60,
        "not every hostile record was dead-lettered",
    )
    assert scheduler.poll() is None, "the scheduler died on a hostile ack"
    # The forged SUCCEEDED did not finish the run: it is still running (its gate is shut).
    tail.read_to_end()  # after the dead letters: the scheduler's answer to the forgery is read
    assert not tail.events(victim, State.COMPLETED)
    errors = {m.value(): dict(m.headers() or [])["jobwheel.error"].decode() for m in dead}
    assert errors[b"x"].startswith("undecodable ack")
    assert "attempt -7" in errors[CODEC.encode(forged)]
    assert errors[b"junk"]
    # The run ends on the worker's own verdict, and the partition keeps working.
    gate.touch()
    with JobClient(settings) as client:
        client.schedule(neighbour, task="demo.echo", now=True)
    tail.wait(lambda: tail.events(victim, State.COMPLETED), 60, "the victim did not complete")
    tail.wait(lambda: tail.events(neighbour, State.COMPLETED), 60, "the partition stopped")
    [verdict] = [e for e in tail.events(victim, State.SUCCEEDED) if e.event_id != "forged"]
    assert verdict.attempt == run.attempt == 1
    assert scheduler.poll() is None
    assert len(log_events(scheduler.log_path, "ack header ignored: not a dispatch time in ms")) >= 3
    assert log_events(scheduler.log_path, "invalid ack dead-lettered")
    assert not log_events(scheduler.log_path, "ack failed; dead-lettered")
    assert not log_events(scheduler.log_path, "transaction aborted; processing the batch again")


def test_health_names_a_partition_that_stopped_committing(settings, jobwheel_env, procs, tmp_path):
    """A scheduler that is alive (its group membership fine) but makes no progress: every
    iteration takes 8 s. With input waiting and no commit for longer than the threshold,
    `jobwheel health` fails and names the partition; once it commits again, health is ok."""
    env = {**jobwheel_env, "JOBWHEEL_HEALTH_STUCK_AFTER_MS": "3000"}
    scheduler = start_scheduler(
        procs, env, tmp_path / "stuck", extra_env={"JOBWHEEL_SCHEDULER_FAULT_DELAY_MS": "8000"}
    )
    wait_owns_all(scheduler, settings.partitions)
    with JobClient(settings) as client:
        job = client.schedule("stuck-job", task="demo.echo", now=True)
    p = partition_for(job, settings.partitions)

    def health() -> dict:
        out = subprocess.run(
            [sys.executable, "-m", "jobwheel.cli", "health", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=scaled(60),
        )
        return {c["check"]: c for c in json.loads(out.stdout)["checks"]}

    stuck = wait_until(
        lambda: (c := health()["partitions"]) and not c["ok"] and c, 40, 1.0, "never reported"
    )
    assert f"partition {p}: " in stuck["detail"]
    assert health()["schedulers"]["ok"]  # the group alone would say all is well
    wait_until(lambda: health()["partitions"]["ok"], 60, 1.0, "stayed stuck after committing")
