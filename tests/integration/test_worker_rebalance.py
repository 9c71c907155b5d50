"""Workers joining and leaving a busy group on a real broker: a rebalance must not run anything
twice. Executions are counted by the task itself (``demo.count`` appends ``run_id:attempt`` to a
file when it starts), not by the events on the acks topic, whose deterministic ids would hide a
repeat of the same attempt.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from jobwheel.kafka.producer import producer_config
from jobwheel.schemas.models import Run, State
from jobwheel.schemas.partitioning import key_for, partition_for
from tests.integration.scheduler_support import (
    CODEC,
    TopicTail,
    committed_offsets,
    end_offsets,
    make_run,
    produce_runs,
)
from tests.support import (
    file_lines,
    log_tail,
    scaled,
    start_worker,
    stop,
    wait_for_log,
    wait_until,
)

CONCURRENCY = "64"


class Feeder(threading.Thread):
    """Produces runs in small transactions until stopped, keeping about ``ahead`` of them
    unexecuted: a stream, as the scheduler dispatches, so every partition has runs executing at
    any moment (one upfront batch would be fetched and run partition by partition), however
    fast the machine runs them."""

    def __init__(self, settings: Any, counter: Path, ahead: int) -> None:
        super().__init__(name="feeder", daemon=True)
        self.settings, self.counter, self.ahead = settings, counter, ahead
        self.runs: list[Run] = []
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self._rng = random.Random(26)

    def run(self) -> None:
        try:
            producer = Producer(
                producer_config(
                    self.settings, **{"transactional.id": f"test-feeder-{uuid.uuid4().hex}"}
                )
            )
            producer.init_transactions(scaled(30))
            while not self._halt.is_set():
                if len(self.runs) - len(file_lines(self.counter)) >= self.ahead:
                    self._halt.wait(0.02)  # polling the executions file, not a synchronisation
                    continue
                batch = [
                    make_run(
                        self.settings,
                        "demo.count",
                        {"path": str(self.counter), "sleep_s": self._rng.uniform(0.5, 2.0)},
                    )
                    for _ in range(16)
                ]
                producer.begin_transaction()
                for run in batch:
                    producer.produce(
                        self.settings.topics.runs, key=key_for(run.job_id), value=CODEC.encode(run)
                    )
                producer.commit_transaction(scaled(30))
                self.runs.extend(batch)
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self._halt.set()
        self.join(scaled(60))


def _scenario(
    procs: Any, env: dict[str, str], logs: list[Path], executed: Callable[[], int]
) -> None:
    """One busy worker, a second and a third joining it, then the first leaving by SIGTERM;
    each step waits for 64 more executions first, so it happens under load."""

    def more_executed(what: str) -> None:
        before = executed()
        wait_until(lambda: executed() >= before + 64, scaled(120), message=f"{what}: idle")

    first = start_worker(procs, env, logs[0], "--concurrency", CONCURRENCY)
    more_executed("one worker")
    start_worker(procs, env, logs[1], "--concurrency", CONCURRENCY)
    wait_until(lambda: _assigned(logs[1]), scaled(60), message="second worker got nothing")
    more_executed("two workers")
    start_worker(procs, env, logs[2], "--concurrency", CONCURRENCY)
    wait_until(lambda: _assigned(logs[2]), scaled(60), message="third worker got nothing")
    more_executed("three workers")
    os.killpg(first.pid, signal.SIGTERM)
    assert first.wait(scaled(60)) == 0, log_tail(logs[0])
    more_executed("two workers after the leave")


def _assigned(log_path: Path) -> bool:
    return log_path.exists() and "partitions assigned" in log_path.read_text()


@pytest.mark.timeout(600)
def test_workers_joining_and_leaving_a_busy_group_run_nothing_twice(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    """A second and a third worker join one busy worker (tasks of 0.5 to 2 s, 64 in flight per
    worker), then the first leaves by SIGTERM: each join revokes partitions whose runs are
    executing, and the leave hands its partitions over. Every run executes exactly once."""
    counter = tmp_path / "executions.txt"
    logs = [tmp_path / f"worker-{i}.log" for i in range(3)]

    def executed() -> int:
        return len(file_lines(counter))

    feeder = Feeder(settings, counter, ahead=256)
    feeder.start()
    try:
        _scenario(procs, jobwheel_env, logs, executed)
    finally:
        feeder.stop()
    assert feeder.error is None, feeder.error
    runs = feeder.runs
    wanted = {r.run_id for r in runs}

    def all_succeeded() -> bool:
        return wanted <= {e.run_id for e in tail.events(state=State.SUCCEEDED)}

    wait_until(all_succeeded, scaled(120), interval_s=0.1, message="runs without a SUCCEEDED")
    # Every run record consumed and committed: no repeat can start after the count.
    ends = {p: o for p, o in end_offsets(settings).items() if o > 0}
    wait_until(
        lambda: all(committed_offsets(settings).get(p, -1) >= o - 1 for p, o in ends.items()),
        scaled(60),
        message=f"the worker group did not commit up to {ends}",
    )
    executions = Counter(file_lines(counter))
    assert set(executions) == {f"{r.run_id}:1" for r in runs}
    twice = {line: n for line, n in executions.items() if n > 1}
    assert not twice, f"{len(twice)} runs executed more than once: {sorted(twice.items())[:10]}"


def _committed_metadata(settings: Any, partition: int) -> str:
    consumer = Consumer(settings.librdkafka(**{"group.id": settings.worker_group}))
    try:
        (tp,) = consumer.committed([TopicPartition(settings.topics.runs, partition)], timeout=10)
    finally:
        consumer.close()
    return tp.metadata or ""


def test_a_run_repeated_after_a_crash_says_so_in_its_started_event(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    """kill -9 of a worker with a run executing: the next owner runs it again (at-least-once,
    same attempt), and its STARTED event names it a possible repeat, because the dead worker's
    last commit said which runs it had started."""
    started, gate = tmp_path / "started.txt", tmp_path / "gate"
    run = make_run(settings, "test.gate", {"gate": str(gate), "started": str(started)})
    fresh = make_run(settings, "demo.echo", {"n": 1})
    produce_runs(settings, [run])
    env = {**jobwheel_env, "JOBWHEEL_KAFKA_CONFIG": json.dumps({"session.timeout.ms": 6000})}
    first = start_worker(procs, env, tmp_path / "first.log")
    (first_start,) = tail.wait_for(run.run_id, State.STARTED, timeout_s=scaled(60))
    assert first_start.reason is None
    wait_until(
        lambda: "|" in _committed_metadata(settings, run.partition),
        scaled(30),
        message="the worker never committed which runs it had started",
    )
    stop(first, signal.SIGKILL)
    gate.touch()
    produce_runs(settings, [fresh])
    second = start_worker(procs, env, tmp_path / "second.log")
    tail.wait_for(run.run_id, State.SUCCEEDED, timeout_s=scaled(60))
    tail.wait_for(fresh.run_id, State.SUCCEEDED, timeout_s=scaled(60))
    tail.read_to_end()
    again = [e for e in tail.of(run.run_id, State.STARTED) if e.worker.endswith(f":{second.pid}")]
    assert again, tail.of(run.run_id)
    assert again[0].reason is not None and again[0].reason.startswith("possibly a repeat")
    # A run the dead worker never started is not called a repeat.
    assert all(e.reason is None for e in tail.of(fresh.run_id, State.STARTED))
    assert file_lines(started) == [f"{run.run_id}:1", f"{run.run_id}:1"]


def _one_per_partition(settings: Any, prefix: str, task: str, args: Any) -> list[Run]:
    """A run of ``task`` on each partition of the runs topic (job ids picked to land there)."""
    runs = []
    for p in range(settings.partitions):
        job_id = next(
            j
            for j in (f"{prefix}-{p}-{i}" for i in range(10_000))
            if partition_for(j, settings.partitions) == p
        )
        runs.append(make_run(settings, task, args, job_id=job_id))
    return runs


@pytest.mark.timeout(300)
def test_a_static_worker_killed_while_handing_partitions_over_leaves_none_unowned(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tail: TopicTail, tmp_path: Path
) -> None:
    """Static members (``group.instance.id``, the deployment tip): the first worker owns every
    partition, a second joins, and the first is SIGKILLed while it waits for its runs on the
    partitions it is handing over; it comes back under the same instance id. Every partition
    must have an owner again: a run on each of them, old and new, succeeds.

    On cooperative-sticky the coordinator gave the returning process the dead one's stored
    assignment without a rebalance, and the partitions being handed over stayed ownerless for
    good (the chaos test's "jobs never SUCCEEDED"); static members now assign eagerly."""
    gate, started = tmp_path / "gate", tmp_path / "started.txt"
    # A run blocked on its gate on every partition: whichever partitions the group moves, the
    # first worker is still waiting for one of their runs when it is killed.
    gated = _one_per_partition(
        settings, "held", "test.gate", {"gate": str(gate), "started": str(started)}
    )
    produce_runs(settings, gated)

    def static(slot: int) -> dict[str, str]:
        return {
            **jobwheel_env,
            "JOBWHEEL_KAFKA_CONFIG": json.dumps({"group.instance.id": f"worker-{slot}"}),
        }

    first_log = tmp_path / "first.log"
    first = start_worker(procs, static(0), first_log, "--concurrency", "8")
    for run in gated:
        tail.wait_for(run.run_id, State.STARTED, timeout_s=scaled(60))
    start_worker(procs, static(1), tmp_path / "second.log", "--concurrency", "8")
    wait_for_log(first_log, "partitions revoked: waiting for their runs to finish", scaled(60))
    stop(first, signal.SIGKILL)
    gate.touch()
    start_worker(procs, static(0), tmp_path / "again.log", "--concurrency", "8")
    fresh = _one_per_partition(settings, "fresh", "demo.echo", {"n": 1})
    produce_runs(settings, fresh)
    for run in fresh + gated:
        tail.wait_for(run.run_id, State.SUCCEEDED, timeout_s=scaled(90))
