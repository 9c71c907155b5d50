"""Worker pools on the real broker: two queues, each with its own runs topic and its own worker
process started with its own task module only (``tests.pool_tasks_a`` serves ``alpha``,
``tests.pool_tasks_b`` ``beta``).

Every run executes on a worker of its queue, exactly once; a job naming a queue the scheduler
does not know is REJECTED naming it; and a pool with no worker for a while gets no copies of
its runs from deadlines that the other pool's acks carried past (the visibility rules hold per
queue): its runs execute exactly once when its worker comes.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from jobwheel.consumers.status.pools import read_pools
from jobwheel.producers.client import JobClient
from jobwheel.schemas.models import State
from jobwheel.schemas.partitioning import partition_for
from tests.conftest import settings_env, settings_on
from tests.integration.scheduler_support import TopicTail, start_scheduler, two_pool_jobs
from tests.support import (
    file_lines,
    log_tail,
    scaled,
    start_worker,
    wait_for_group,
    wait_until,
)

QUEUES = "alpha,beta"


@pytest.fixture
def pools(kafka_bootstrap: str, tmp_path: Path) -> Any:
    return settings_on(kafka_bootstrap, tmp_path, queues=QUEUES)


@pytest.fixture
def tail(pools: Any) -> Any:
    t = TopicTail(pools)
    yield t
    t.close()


def start_pool_worker(procs: Any, env: dict[str, str], tmp_path: Path, module: str, *extra: str):
    return start_worker(procs, env, tmp_path / f"{module}.log", *extra, tasks=module)


def pool_ready(settings: Any, queue: str, proc: Any) -> None:
    """The queue's group owns every partition of its runs topic (a run sent now is fetched)."""
    try:
        wait_for_group(settings, settings.worker_group_for(queue), settings.topics.runs_for(queue))
    except Exception:
        raise AssertionError(f"pool {queue} never got ready:\n{log_tail(proc.log_path)}") from None


def executions(log: Path) -> list[tuple[str, int]]:
    """``(run id:attempt, pid)`` of every execution noted in ``log``."""
    out = []
    for line in file_lines(log):
        run, pid = line.rsplit(" ", 1)
        out.append((run, int(pid)))
    return out


@pytest.mark.timeout(420)  # the sum of its waits
def test_two_pools_run_each_job_once_on_a_worker_of_its_queue(
    pools: Any, procs: Any, tmp_path: Path, tail: TopicTail
) -> None:
    env = settings_env(pools)
    start_scheduler(procs, env, tmp_path / "s1")
    # A from its tasks' queue (no --queue), B by name.
    worker_a = start_pool_worker(procs, env, tmp_path, "tests.pool_tasks_a")
    worker_b = start_pool_worker(procs, env, tmp_path, "tests.pool_tasks_b", "--queue", "beta")
    pool_ready(pools, "alpha", worker_a)
    pool_ready(pools, "beta", worker_b)

    n = 500  # per pool
    log_a, log_b = tmp_path / "a.lines", tmp_path / "b.lines"
    jobs = two_pool_jobs(n, log_a, log_b)
    # A client that believes in a third queue: the scheduler, which does not, rejects it.
    believer = pools.model_copy(update={"queues": f"{QUEUES},gamma"})
    with JobClient(pools, task_check="off") as client:
        client.schedule_many(jobs)
    with JobClient(believer, task_check="off") as client:
        stray = client.schedule("stray", task="a.work", queue="gamma", now=True)

    wait_until(
        lambda: len(file_lines(log_a)) >= n and len(file_lines(log_b)) >= n,
        scaled(120),
        0.2,
        f"not every run executed: {len(file_lines(log_a))} of {n} on A, "
        f"{len(file_lines(log_b))} of {n} on B\nA:\n{log_tail(worker_a.log_path)}\n"
        f"B:\n{log_tail(worker_b.log_path)}",
    )
    succeeded = tail.settled(
        lambda: len({e.job_id for e in tail.events(state=State.SUCCEEDED)}) >= 2 * n or None,
        "every run's SUCCEEDED",
        timeout_s=60,
    )
    assert succeeded

    # Each run executed once, by its own pool's process.
    for log, proc, prefix in ((log_a, worker_a, "a-"), (log_b, worker_b, "b-")):
        ran = executions(log)
        assert len(ran) == n, f"{len(ran) - len(set(ran))} executed twice"
        assert len({run for run, _ in ran}) == n
        assert {run.split("@")[0] for run, _ in ran} == {f"{prefix}{i}" for i in range(n)}
        assert {pid for _, pid in ran} == {proc.pid}
    # Dispatched once each, on the topic of its queue only.
    assert tail.duplicate_dispatches() == {}
    topics = pools.topics
    on_alpha = Counter(r.job_id for r in tail.runs_on[topics.runs_for("alpha")])
    on_beta = Counter(r.job_id for r in tail.runs_on[topics.runs_for("beta")])
    assert on_alpha == Counter({f"a-{i}": 1 for i in range(n)})
    assert on_beta == Counter({f"b-{i}": 1 for i in range(n)})
    assert tail.runs_on[topics.runs] == []
    assert {r.queue for r in tail.runs_on[topics.runs_for("beta")]} == {"beta"}
    assert tail.events(state=State.FAILED) == []  # no unknown-task failure, none at all
    # Every status event names its pool (status_event.v4), the scheduler's and the workers':
    # the status store lists jobs and runs by queue from them.
    named = Counter((e.job_id[:2], e.source, e.queue) for e in tail.events() if e.job_id[1] == "-")
    assert set(named) == {("a-", "scheduler", "alpha"), ("a-", "worker", "alpha"),
                          ("b-", "scheduler", "beta"), ("b-", "worker", "beta")}, named  # fmt: skip
    # The unknown queue: REJECTED, naming it and how to declare it; nothing dispatched.
    [rejected] = tail.events(stray, State.REJECTED)
    assert "unknown queue 'gamma'" in (rejected.reason or "")
    assert "JOBWHEEL_QUEUES" in (rejected.reason or "")
    assert tail.runs_of(stray) == []


@pytest.mark.timeout(480)  # the sum of its waits
def test_a_pool_without_workers_gets_no_copies_from_the_other_pools_acks(
    pools: Any, procs: Any, tmp_path: Path, tail: TopicTail, figure: Any
) -> None:
    """Pool B has no worker while pool A acks on every partition. B's deadlines pass, and A's
    acks carry the partition's watermark past them; B's own acks never came. Nothing of B is
    dispatched again: when B's worker starts, each of B's runs executes exactly once, at
    attempt 1. Before the rule was per queue, A's acks expired B's deadlines and piled
    attempts 2 and 3 onto B's topic (then DEAD) while nobody read it."""
    env = settings_env(pools)
    start_scheduler(procs, env, tmp_path / "s1")
    worker_a = start_pool_worker(procs, env, tmp_path, "tests.pool_tasks_a")
    pool_ready(pools, "alpha", worker_a)
    log_a, log_b = tmp_path / "a.lines", tmp_path / "b.lines"
    # A is busy on every partition: one 1 s job per partition, for the whole test.
    ids: dict[int, str] = {}
    for i in range(1000):
        ids.setdefault(partition_for(f"busy-{i}", pools.partitions), f"busy-{i}")
        if len(ids) == pools.partitions:
            break
    visibility_s = scaled(4)
    m = 120
    with JobClient(pools, task_check="off") as client:
        for job_id in ids.values():
            client.schedule(
                job_id, task="a.work", queue="alpha", every="1s", args={"log": str(log_a)}
            )
        client.schedule_many(
            {
                "job_id": f"b-{i}",
                "task": "b.work",
                "queue": "beta",
                "now": True,
                "args": {"log": str(log_b)},
                "max_attempts": 3,
                "visibility_timeout": timedelta(seconds=visibility_s),
            }  # fmt: skip
            for i in range(m)
        )
    beta_topic = pools.topics.runs_for("beta")
    tail.wait(
        lambda: len(tail.runs_on[beta_topic]) >= m, scaled(60), "B's runs were never dispatched"
    )
    last_dispatch = max(r.dispatched_at_ms for r in tail.runs_on[beta_topic])
    # The outage: until A's acks on every partition are past B's deadlines by three visibility
    # timeouts (under QUEUE_PATIENCE's ten, so B's runs are still waited for once B comes).
    past = last_dispatch + 4 * int(visibility_s * 1000)

    def acked_past() -> bool:
        late = {
            partition_for(e.job_id, pools.partitions)
            for e in tail.events(state=State.SUCCEEDED)
            if e.job_id.startswith("busy-") and e.event_time_ms > past
        }
        return len(late) == pools.partitions

    tail.wait(acked_past, scaled(90), f"pool A did not ack on every partition:\n"
              f"{log_tail(worker_a.log_path)}")  # fmt: skip
    assert file_lines(log_b) == []  # nobody served B meanwhile
    # The signals to scale on (GET /queues, jobwheel_queue_*): B's backlog is every one of its
    # runs, all waiting, as old as its dispatches; A has its worker, finishing runs.
    down = {p.queue: p for p in read_pools(pools)}
    beta, alpha = down["beta"], down["alpha"]
    waited_s = (time.time_ns() // 1_000_000 - last_dispatch) / 1000
    assert beta.error is None and beta.unfinished is not None and beta.unfinished >= m, beta
    assert (beta.waiting, beta.inflight, beta.workers) == (beta.unfinished, 0, 0), beta
    assert beta.oldest_unfinished_age_s is not None
    assert beta.oldest_unfinished_age_s >= waited_s - 1, (beta, waited_s)
    assert (alpha.workers, alpha.concurrency) == (1, pools.worker_concurrency), alpha
    assert alpha.finished_per_s > 0, alpha
    b_started_ms = time.time_ns() // 1_000_000
    worker_b = start_pool_worker(procs, env, tmp_path, "tests.pool_tasks_b")
    wait_until(
        lambda: len(file_lines(log_b)) >= m,
        scaled(90),
        0.2,
        f"B ran {len(file_lines(log_b))} of {m}:\n{log_tail(worker_b.log_path)}",
    )
    # Job-level COMPLETED, or DEAD when its run ran out of attempts.
    finished = (State.COMPLETED, State.DEAD)

    def b_finished() -> set[str]:
        return {
            e.job_id
            for e in tail.events()
            if e.job_id.startswith("b-") and e.run_id is None and e.state in finished
        }

    tail.settled(lambda: len(b_finished()) >= m or None, "every B job finished", timeout_s=60)

    # ... and B's backlog falls to nothing once its worker has committed past its runs.
    def beta_now() -> Any:
        return next(p for p in read_pools(pools) if p.queue == "beta")

    after = wait_until(
        lambda: (b := beta_now()).unfinished == 0 and b.workers == 1 and b,
        scaled(30),
        0.5,
        "B's backlog never fell to 0",
    )
    figure(
        f"pools: B's signals with no worker: {beta.unfinished} unfinished, oldest "
        f"{beta.oldest_unfinished_age_s:.1f} s; after its worker: {after.unfinished}"
    )
    attempts = Counter((r.job_id, r.attempt) for r in tail.runs_on[beta_topic])
    copies = sum(n for (_, attempt), n in attempts.items() if attempt > 1)
    down_s = (b_started_ms - last_dispatch) / 1000
    figure(f"pools: B had no worker for {down_s:.0f} s after its last dispatch; {copies} copies")
    why = Counter(
        (e.reason, e.event_time_ms >= b_started_ms)
        for e in tail.events(state=State.DISPATCHED)
        if e.job_id.startswith("b-") and e.attempt > 1
    )
    assert copies == 0, f"{copies} later attempts dispatched to B (reason, after B started): {why}"
    assert sorted(attempts) == sorted((f"b-{i}", 1) for i in range(m))
    ran = executions(log_b)
    assert len(ran) == m
    assert Counter(run.split("@")[0] for run, _ in ran) == Counter({f"b-{i}": 1 for i in range(m)})
    assert {pid for _, pid in ran} == {worker_b.pid}
    assert [e for e in tail.events(state=State.DEAD) if e.job_id.startswith("b-")] == []
    # A's own deadlines kept working meanwhile: its jobs ran all along.
    assert len(executions(log_a)) >= pools.partitions
