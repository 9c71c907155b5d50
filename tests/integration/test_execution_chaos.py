"""Chaos: 1,000 jobs through a scheduler and two workers while workers are SIGKILLed and
restarted, each as soon as it has started a batch of runs (so every kill lands mid-work, however
slow the machine). Every job must end SUCCEEDED; duplicate executions are counted."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from jobwheel.producers.client import JobClient, JobSpec
from jobwheel.schemas.models import State
from tests.integration.scheduler_support import TopicTail, now_ms, start_scheduler
from tests.support import scaled

JOBS = 1000
KILLS = 6
#: A worker is killed once it has started this many runs since it was (re)started.
RUNS_BEFORE_KILL = 25
#: The waits below, added up: scheduler start, each kill, all jobs SUCCEEDED.
BUDGET_S = 90 + KILLS * 60 + 180


@pytest.mark.timeout(BUDGET_S + 60)
def test_every_job_succeeds_while_workers_are_killed(
    settings, jobwheel_env, procs, tmp_path, figure
):
    tail = TopicTail(settings)
    try:
        start_scheduler(procs, jobwheel_env, tmp_path / "s1")
        counter = tmp_path / "executions.txt"

        def worker(slot: int, n: int):
            # Static membership, as a StatefulSet would run them: a restarted worker takes its
            # slot's partitions back at once instead of waiting out the dead one's session.
            env = {
                **jobwheel_env,
                "JOBWHEEL_KAFKA_CONFIG": json.dumps({"group.instance.id": f"worker-{slot}"}),
            }
            log_path = tmp_path / f"worker{slot}-{n}.log"
            argv = [
                "jobwheel",
                "worker",
                "--tasks",
                "jobwheel.consumers.demo",
                "--concurrency",
                "8",
            ]
            return procs.spawn(argv, env, log_path)

        workers = [worker(0, 0), worker(1, 0)]
        killed = [0, 0]
        first = now_ms() + 3000
        step = 15_000 / JOBS
        with JobClient(settings) as client:
            job_ids = client.schedule_many(
                [
                    JobSpec(
                        job_id=f"chaos-{i}",
                        task="demo.count",
                        args={"path": str(counter), "sleep_s": 0.2},
                        at=datetime.fromtimestamp((first + int(i * step)) / 1000, UTC),
                        visibility_timeout=timedelta(seconds=4),
                        max_attempts=20,
                    )
                    for i in range(JOBS)
                ]
            )

        def succeeded() -> set[str]:
            return {e.job_id for e in tail.events(state=State.SUCCEEDED)}

        def started_by(proc) -> int:
            mine = f":{proc.pid}"
            return sum(1 for e in tail.events(state=State.STARTED) if e.worker.endswith(mine))

        def victim_of(kills: int) -> int | None:
            """The worker to kill next: one that has started its batch of runs since it was
            (re)started, the other one first when both have. Not strictly in turn: late in the
            run the partitions of one worker may have nothing left to run (its jobs done, the
            rest waiting out a dead worker's visibility timeout on the other's partitions)."""
            order = (kills % 2, 1 - kills % 2)
            ready = [s for s in order if started_by(workers[s]) >= RUNS_BEFORE_KILL]
            return ready[0] if ready else None

        kills = 0
        while kills < KILLS and not succeeded() >= set(job_ids):
            tail.wait(
                lambda k=kills: succeeded() >= set(job_ids) or victim_of(k) is not None,
                60,
                f"neither worker started {RUNS_BEFORE_KILL} runs since its (re)start",
            )
            victim = victim_of(kills)
            if succeeded() >= set(job_ids) or victim is None:
                break
            os.kill(workers[victim].pid, signal.SIGKILL)
            workers[victim].wait(scaled(10))
            workers[victim] = worker(victim, kills + 1)
            kills += 1
            killed[victim] += 1

        tail.wait(
            lambda: succeeded() >= set(job_ids),
            180,
            f"jobs never SUCCEEDED: {sorted(set(job_ids) - succeeded())[:10]}",
        )
        executions = counter.read_text().split()
        per_job = Counter(line.rsplit("@", 1)[0] for line in executions)
        assert set(per_job) == set(job_ids)
        tail.read_to_end()  # after every SUCCEEDED: a DEAD event would be read by now
        dead = tail.events(state=State.DEAD)
        assert dead == [], dead[:3]
        assert kills >= 2, f"only {kills} kills before every job was done: no chaos to speak of"
        attempts = Counter(r.attempt for r, _ in tail.runs)
        # A run with two SUCCEEDED ran again after it had finished (not just been cut short).
        verdicts = Counter(e.run_id for e in tail.events(state=State.SUCCEEDED))
        duplicates = len(executions) - JOBS
        figure(
            f"[chaos] {JOBS} jobs, {kills} worker SIGKILLs (per worker {killed}): all SUCCEEDED; "
            f"executions "
            f"{len(executions)} (duplicates {duplicates}, {duplicates / kills:.1f} per kill, "
            f"on {sum(1 for c in per_job.values() if c > 1)} jobs; runs that ran again after "
            f"succeeding {sum(1 for c in verdicts.values() if c > 1)}); dispatches by attempt "
            f"{dict(sorted(attempts.items()))}"
        )
    finally:
        tail.close()
