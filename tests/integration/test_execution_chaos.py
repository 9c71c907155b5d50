"""Chaos: 1,000 jobs through a scheduler and two workers while workers are SIGKILLed and
restarted every few seconds. Every job must end SUCCEEDED; duplicate executions are counted."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

from producers.client import JobClient, JobSpec
from schemas.models import State
from tests.integration.scheduler_support import TopicTail, now_ms, start_scheduler

JOBS = 1000
KILL_EVERY_S = 4.0
CHAOS_S = 24.0


def test_every_job_succeeds_while_workers_are_killed(
    settings, jobwheel_env, procs, tmp_path, capsys
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
            argv = ["jobwheel", "worker", "--tasks", "consumers.demo", "--concurrency", "8"]
            return procs.spawn(argv, env, log_path)

        workers = [worker(0, 0), worker(1, 0)]
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
        kills = 0
        chaos_end = time.monotonic() + CHAOS_S
        while time.monotonic() < chaos_end:
            time.sleep(KILL_EVERY_S)
            victim = kills % 2
            os.kill(workers[victim].pid, signal.SIGKILL)
            workers[victim].wait(10)
            workers[victim] = worker(victim, kills + 1)
            kills += 1

        def succeeded() -> set[str]:
            return {e.job_id for e in tail.events(state=State.SUCCEEDED)}

        tail.wait(
            lambda: succeeded() >= set(job_ids),
            180,
            f"jobs never SUCCEEDED: {sorted(set(job_ids) - succeeded())[:10]}",
        )
        executions = counter.read_text().split()
        per_job = Counter(line.rsplit("@", 1)[0] for line in executions)
        assert set(per_job) == set(job_ids)
        dead = tail.events(state=State.DEAD)
        assert dead == [], dead[:3]
        attempts = Counter(r.attempt for r, _ in tail.runs)
        # A run with two SUCCEEDED ran again after it had finished (not just been cut short).
        verdicts = Counter(e.run_id for e in tail.events(state=State.SUCCEEDED))
        duplicates = len(executions) - JOBS
        with capsys.disabled():
            print(
                f"\n[chaos] {JOBS} jobs, {kills} worker SIGKILLs: all SUCCEEDED; executions "
                f"{len(executions)} (duplicates {duplicates}, {duplicates / kills:.1f} per kill, "
                f"on {sum(1 for c in per_job.values() if c > 1)} jobs; runs that ran again after "
                f"succeeding {sum(1 for c in verdicts.values() if c > 1)}); dispatches by attempt "
                f"{dict(sorted(attempts.items()))}"
            )
    finally:
        tail.close()
